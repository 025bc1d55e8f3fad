//! Kernel IR tests: the text form round-trips on kernels lowered from random graphs, lowered
//! kernels verify, and snapshots of the kernels emitted for fixed programs stay put
//! (`tests/snapshots`, re-bless with `KFUSE_BLESS=1`).

use std::path::Path;

use kfuse_fusion::{partition, FixedCostModel, FusePolicy};
use kfuse_ir::text::parse_graph;
use kfuse_kernel::text::{parse_kernel, print_kernel};
use kfuse_kernel::{lower, Step};

#[test]
fn kernel_text_round_trips() {
    let mut kernels = 0;
    for seed in 0..800u64 {
        let graph = kfuse_testkit::random_graph(seed, 16);
        for policy in [FusePolicy::Greedy, FusePolicy::Cost] {
            let program = lower(
                &graph,
                &partition(&graph, policy, &FixedCostModel::default()),
            )
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            for kernel in program.kernels() {
                kernel.verify().unwrap();
                let text = print_kernel(kernel);
                let parsed =
                    parse_kernel(&text).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{text}"));
                assert_eq!(&parsed, kernel, "seed {seed}:\n{text}");
                kernels += 1;
            }
        }
    }
    assert!(kernels > 2000, "{kernels}");
}

#[test]
fn malformed_kernel_text_is_an_error() {
    let good = "kernel k0 outer=[] inner=[4]\narg 0 : f32[4] read\narg 1 : f32[4] write\n%0 = inner_index() : i64\n\
                %1 = load(%0) arg=0 : f32\n%2 = exp(%1) : f32\nstore(%0, %2) arg=1 : f32\n";
    assert!(parse_kernel(good).is_ok());
    for (bad, needle) in [
        (
            good.replace("arg=0 : f32\n%2", "arg=1 : f32\n%2"),
            "argument 1 is not Read",
        ),
        (
            good.replace("exp(%1)", "exp(%7)"),
            "`%7` is not an earlier instruction",
        ),
        (
            good.replace("exp(%1)", "frob(%1)"),
            "unknown instruction `frob`",
        ),
        (good.replace("%2 = exp", "%5 = exp"), "expected `%2`"),
        (
            good.replace(": i64\n%1", ": f32\n%1"),
            "index values are i64",
        ),
        (
            good.replace("exp(%1)", "add(%1)"),
            "add takes 2 operand(s), found 1",
        ),
    ] {
        let err = parse_kernel(&bad).unwrap_err().to_string();
        assert!(err.contains(needle), "{needle}: {err}");
    }
    let mut rng = kfuse_testkit::Rng::new(3);
    for _ in 0..2000 {
        let _ = parse_kernel(&kfuse_testkit::mutate_text(&mut rng, good));
    }
}

#[test]
fn snapshots() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots");
    let n = kfuse_testkit::run_filetests(&dir, |header, input| {
        let policy = header
            .strip_prefix("# lower: ")
            .and_then(FusePolicy::from_name)
            .ok_or(format!("bad header {header:?}"))?;
        let graph = parse_graph(input).map_err(|e| e.to_string())?;
        let program = lower(
            &graph,
            &partition(&graph, policy, &FixedCostModel::default()),
        )
        .map_err(|e| e.to_string())?;
        let mut out = String::new();
        for step in &program.steps {
            match step {
                Step::Kernel { kernel, args } => {
                    out.push_str(&print_kernel(kernel));
                    out.push_str(&format!(
                        "# buffers {:?}\n",
                        args.iter().map(|b| b.0).collect::<Vec<_>>()
                    ));
                }
                Step::Library { node, op, .. } => {
                    out.push_str(&format!("library %{node} {}\n", op.name()))
                }
                Step::Structured { nodes, call, .. } => {
                    out.push_str(&format!("structured %{} {}\n", nodes[0], call.name()))
                }
            }
        }
        Ok(out)
    });
    assert!(n >= 6);
}
