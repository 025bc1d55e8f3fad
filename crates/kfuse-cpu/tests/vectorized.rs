//! The generated C keeps its loops vectorized: every f32 elementwise op (one operand or two)
//! whose C definition is written to vectorize, in both numerics modes, as GCC reports it
//! (`-fopt-info-vec`). Kernels with vector bodies run most elements through explicit 16-lane
//! code, which GCC's report does not describe (`vector_math.rs` checks those functions); the
//! report covers their scalar remainder loops and the lane-by-lane loops of ops without a
//! 16-lane function, which is where a scalar form would show. A flag or header change that leaves such
//! a loop scalar costs 10x or more (strict-mode kernels lost their vector `exp` for want of
//! `-fno-trapping-math`); this test names the op and the compiler's reason instead of waiting
//! for a benchmark to notice.

use kfuse_cpu::{Compiler, Numerics};
use kfuse_fusion::{partition, FixedCostModel, FusePolicy};
use kfuse_ir::text::parse_graph;
use kfuse_kernel::{lower, Step};

/// Ops whose scalar C stays scalar, and why: `sin` and `cos` reduce large arguments through a
/// multi-word table with a data-dependent loop (their 16-lane forms in vector bodies vectorize
/// the common reduction and recompute only such lanes); `rem` calls libm's `fmodf` and `pow`
/// libm's `powf` (the reference's definitions), which have no vector form.
const SCALAR: &[&str] = &["sin", "cos", "rem", "pow"];

const BINARY: &[&str] = &["add", "sub", "mul", "div", "max", "min", "rem", "pow"];

const OPS: &[&str] = &[
    "neg",
    "abs",
    "sign",
    "exp",
    "exp2",
    "log",
    "log2",
    "log1p",
    "expm1",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "relu",
    "gelu",
    "gelu_tanh",
    "erf",
    "softplus",
    "floor",
    "ceil",
    "round",
];

fn kernel_source(text: &str) -> String {
    let graph = parse_graph(text).unwrap();
    let program = lower(
        &graph,
        &partition(&graph, FusePolicy::Cost, &FixedCostModel::default()),
    )
    .unwrap();
    let kernels: Vec<_> = program
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Kernel { kernel, .. } => Some(kfuse_cpu::c::render(kernel).unwrap()),
            _ => None,
        })
        .collect();
    assert_eq!(kernels.len(), 1, "{text}");
    kernels.into_iter().next().unwrap()
}

#[test]
fn elementwise_kernels_vectorize_in_both_modes() {
    let dir = std::env::temp_dir().join(format!("kfuse-vectorized-{}", std::process::id()));
    let compiler = Compiler::detect(dir.clone()).expect("a C compiler");
    let mut failures = Vec::new();
    let mut checked = 0;
    // Odd size, and a two-op chain too: a fused chain must vectorize as its ops do.
    let programs = OPS
        .iter()
        .map(|op| {
            (
                op.to_string(),
                format!("%x = input() name=\"x\" : f32[1001]\n%y = {op}(%x)\noutput \"y\" = %y\n"),
            )
        })
        .chain(BINARY.iter().map(|op| {
            (
                op.to_string(),
                format!("%x = input() name=\"x\" : f32[1001]\n%z = input() name=\"z\" : f32[1001]\n%y = {op}(%x, %z)\noutput \"y\" = %y\n"),
            )
        }))
        .chain([(
            "log(exp(x) + 1)".to_string(),
            "%x = input() name=\"x\" : f32[1001]\n%e = exp(%x)\n%one = constant() value=1.0 : f32[]\n%p = add(%e, %one)\n%y = log(%p)\noutput \"y\" = %y\n".to_string(),
        )]);
    for (what, text) in programs {
        let source = kernel_source(&text);
        for numerics in [Numerics::Strict, Numerics::Fast] {
            let Some(report) = compiler.vectorization_report(&source, numerics).unwrap() else {
                kfuse_testkit::skip(
                    "elementwise_kernels_vectorize_in_both_modes",
                    kfuse_testkit::Prerequisite::Optional,
                    &format!(
                        "{} ({}) gives no -fopt-info-vec report; this test needs GCC",
                        compiler.program, compiler.version
                    ),
                );
                let _ = std::fs::remove_dir_all(&dir);
                return;
            };
            checked += 1;
            let expected = !SCALAR.contains(&what.as_str());
            if report.vectorized() != expected {
                failures.push(format!(
                    "{what} ({}): expected {}, got:\n  {}",
                    numerics.name(),
                    if expected {
                        "a vectorized loop"
                    } else {
                        "no vectorized loop (update SCALAR)"
                    },
                    report.lines.join("\n  ")
                ));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(checked, 2 * (OPS.len() + BINARY.len() + 1));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
