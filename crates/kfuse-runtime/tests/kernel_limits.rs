//! One kernel never grows past the cost model's limits, so that no generated C function takes
//! the C compiler minutes: long chains are split into several kernels, each within the limits,
//! and the results still match the reference interpreter bit for bit.

use std::fmt::Write;
use std::time::Instant;

use kfuse_cpu::Numerics;
use kfuse_fusion::{CostModel, FixedCostModel, FusePolicy};
use kfuse_interp::CustomOps;
use kfuse_ir::text::parse_graph;
use kfuse_ir::{Array, Graph};
use kfuse_kernel::{InstKind, Step};
use kfuse_runtime::{compile_with, Backend, Executable, Options, Tier};

/// Compiles `graph` in strict numerics with a compile cache of its own, so that every kernel
/// meets the C compiler.
fn compile_fresh(graph: &Graph, name: &str) -> Executable {
    let cache_dir =
        std::env::temp_dir().join(format!("kfuse-test-limits-{name}-{}", std::process::id()));
    let options = Options {
        policy: FusePolicy::Cost,
        numerics: Numerics::Strict,
        backend: Backend::Auto,
        cache_dir: cache_dir.clone(),
        graph_passes: true,
        keep_layouts: false,
    };
    let exe = compile_with(graph, &options, &FixedCostModel::default()).expect("compiles");
    let _ = std::fs::remove_dir_all(&cache_dir);
    exe
}

/// Checks every fused kernel of `exe` against the default limits; returns how many there are.
fn kernels_within_limits(exe: &Executable) -> usize {
    let limits = FixedCostModel::default().kernel_limits();
    let mut kernels = 0;
    for step in &exe.program.steps {
        let Step::Kernel { kernel, .. } = step else {
            continue;
        };
        let transcendentals = kernel
            .insts
            .iter()
            .filter(|i| matches!(i.kind, InstKind::Unary(u, _) if kfuse_fusion::cost::transcendental(&kfuse_ir::Op::Unary(u))))
            .count();
        assert!(
            kernel.insts.len() <= limits.instructions,
            "{} holds {} instructions",
            kernel.name,
            kernel.insts.len()
        );
        assert!(
            transcendentals <= limits.transcendentals,
            "{} holds {transcendentals} transcendental functions",
            kernel.name
        );
        kernels += 1;
    }
    kernels
}

fn same_as_reference(exe: &Executable, graph: &Graph, inputs: &[(String, Array)]) {
    let want = kfuse_interp::run(graph, inputs, &CustomOps::new()).unwrap();
    let (got, _) = exe.run(inputs, &CustomOps::new()).unwrap();
    assert_eq!(got, want);
}

/// A thousand (mul, tanh) pairs in one kernel took GCC more than two minutes; in kernels of at
/// most 16 tanh each, every kernel compiles in seconds.
#[test]
fn a_chain_of_a_thousand_tanh_is_split_into_kernels_that_compile_quickly() {
    let pairs = 1000;
    let mut text =
        String::from("%x = input() name=\"x\" : f32[4096]\n%c = constant() value=1.25 : f32[]\n");
    let mut prev = "%x".to_string();
    for i in 0..pairs {
        writeln!(text, "%m{i} = mul({prev}, %c)\n%t{i} = tanh(%m{i})").unwrap();
        prev = format!("%t{i}");
    }
    writeln!(text, "output \"y\" = {prev}").unwrap();
    let graph = parse_graph(&text).unwrap();
    let start = Instant::now();
    let exe = compile_fresh(&graph, "tanh");
    let seconds = start.elapsed().as_secs_f64();
    let limits = FixedCostModel::default().kernel_limits();
    let kernels = kernels_within_limits(&exe);
    assert!(
        kernels >= pairs / limits.transcendentals,
        "{kernels} kernels"
    );
    for tier in exe.tiers.iter().flatten() {
        assert!(matches!(tier, Tier::Compiled { .. }), "{}", tier.name());
    }
    eprintln!("{kernels} kernels compiled in {seconds:.1} s");
    assert!(seconds < 60.0, "compiling took {seconds:.1} s");
    let x = Array::from_vec(
        vec![4096],
        (0..4096)
            .map(|i| i as f32 / 512.0 - 4.0)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    same_as_reference(&exe, &graph, &[("x".to_string(), x)]);
}
