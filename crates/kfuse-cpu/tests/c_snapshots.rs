//! Snapshots of the C generated for fixed programs (the shared math header left out), so that a
//! refactor proves it changed no generated code. Re-bless with `KFUSE_BLESS=1`.

use std::path::Path;

use kfuse_fusion::{partition, FixedCostModel, FusePolicy};
use kfuse_ir::text::parse_graph;
use kfuse_kernel::{lower, Step};

#[test]
fn generated_c() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c_snapshots");
    let n = kfuse_testkit::run_filetests(&dir, |header, input| {
        if header != "# render: c" {
            return Err(format!("bad header {header:?}"));
        }
        let graph = parse_graph(input).map_err(|e| e.to_string())?;
        let program = lower(
            &graph,
            &partition(&graph, FusePolicy::Cost, &FixedCostModel::default()),
        )
        .map_err(|e| e.to_string())?;
        let mut out = String::new();
        for step in &program.steps {
            if let Step::Kernel { kernel, .. } = step {
                let c = kfuse_cpu::c::render(kernel).map_err(|u| u.0)?;
                out.push_str(&c.replace(kfuse_cpu::c::MATH_HEADER, "#include \"kfuse_math.h\"\n"));
            }
        }
        Ok(out)
    });
    assert!(n >= 4);
}
