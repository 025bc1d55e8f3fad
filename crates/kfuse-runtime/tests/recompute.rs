//! Recomputation stays bounded: a stencil whose steps read each other at shifted indices would,
//! fused, evaluate its first step at a number of indices that grows geometrically with the
//! steps. The cost model prices the duplicated work and stores the steps, and no kernel passes
//! the size limits under any policy; the results match the reference interpreter bit for bit.

use std::fmt::Write;
use std::time::Instant;

use kfuse_cpu::Numerics;
use kfuse_fusion::{partition, CostModel, FixedCostModel, FusePolicy};
use kfuse_interp::CustomOps;
use kfuse_ir::text::parse_graph;
use kfuse_ir::{Array, Graph};
use kfuse_kernel::{lower, Step};
use kfuse_runtime::{compile_with, Backend, Options};

/// `steps` steps of the 7-point Jacobi iteration on a `side`^3 grid with a zero boundary, each
/// step the mean of six shifted slices of the one before, padded back to the grid.
fn jacobi(steps: usize, side: usize) -> Graph {
    let inner = side - 2;
    let mut text = format!(
        "%u0 = input() name=\"u\" : f32[{side}, {side}, {side}]\n%sixth = constant() value=0.16666667 : f32[]\n"
    );
    let shifts = [
        [0, 1, 1],
        [2, 1, 1],
        [1, 0, 1],
        [1, 2, 1],
        [1, 1, 0],
        [1, 1, 2],
    ];
    for t in 1..=steps {
        for (k, [a, b, c]) in shifts.iter().enumerate() {
            writeln!(
                text,
                "%n{t}_{k} = slice(%u{}) start=[{a}, {b}, {c}] stop=[{}, {}, {}] step=[1, 1, 1]",
                t - 1,
                a + inner,
                b + inner,
                c + inner
            )
            .unwrap();
        }
        writeln!(text, "%s{t}_1 = add(%n{t}_0, %n{t}_1)").unwrap();
        for k in 2..6 {
            writeln!(text, "%s{t}_{k} = add(%s{t}_{}, %n{t}_{k})", k - 1).unwrap();
        }
        writeln!(text, "%i{t} = mul(%s{t}_5, %sixth)").unwrap();
        writeln!(
            text,
            "%u{t} = pad(%i{t}) low=[1, 1, 1] high=[1, 1, 1] mode=constant value=0.0"
        )
        .unwrap();
    }
    writeln!(text, "output \"u\" = %u{steps}").unwrap();
    parse_graph(&text).unwrap()
}

/// Fused, ten steps took more than 23 GB to lower (the kernel grew about fivefold per step);
/// now every step is stored under the cost policy, two steps share a kernel under the greedy
/// one, and no kernel passes the limits.
#[test]
fn ten_jacobi_steps_stay_within_the_kernel_limits() {
    let graph = jacobi(10, 32);
    let cost = FixedCostModel::default();
    let limits = cost.kernel_limits();
    for (policy, kernels) in [(FusePolicy::Cost, 10), (FusePolicy::Greedy, 5)] {
        let start = Instant::now();
        let p = partition(&graph, policy, &cost);
        assert_eq!(p.kernels.len(), kernels, "{policy:?}");
        let program = lower(&graph, &p).unwrap();
        let seconds = start.elapsed().as_secs_f64();
        assert!(seconds < 10.0, "{policy:?}: {seconds:.1} s");
        for step in &program.steps {
            let Step::Kernel { kernel, .. } = step else {
                continue;
            };
            assert!(
                kernel.insts.len() <= limits.instructions,
                "{policy:?}: {} holds {} instructions",
                kernel.name,
                kernel.insts.len()
            );
        }
        // Every step but the last is stored, for the duplicated work: priced by the cost model,
        // or past the limits.
        let read_at_six = p
            .stored
            .values()
            .filter(|why| why.starts_with("read at 6 indices, evaluated 6 times per element"))
            .count();
        let past_the_limit = p
            .stored
            .values()
            .filter(|why| why.contains("evaluating it at each of the 36 indices it is read at"))
            .count();
        match policy {
            FusePolicy::Cost => assert_eq!((read_at_six, past_the_limit), (5, 4), "{p:?}"),
            _ => assert_eq!((read_at_six, past_the_limit), (0, 4), "{p:?}"),
        }
    }
    let options = Options {
        policy: FusePolicy::Cost,
        numerics: Numerics::Strict,
        backend: Backend::Auto,
        cache_dir: std::env::temp_dir().join(format!("kfuse-test-cache-{}", std::process::id())),
        graph_passes: true,
        keep_layouts: false,
    };
    let exe = compile_with(&graph, &options, &cost).expect("compiles");
    let u = Array::from_vec(
        vec![32, 32, 32],
        (0..32 * 32 * 32)
            .map(|i| ((i * 7919) % 1000) as f32 / 100.0)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let inputs = [("u".to_string(), u)];
    let want = kfuse_interp::run(&graph, &inputs, &CustomOps::new()).unwrap();
    let (got, _) = exe.run(&inputs, &CustomOps::new()).unwrap();
    assert_eq!(got, want);
}
