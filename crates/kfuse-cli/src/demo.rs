//! `kfuse demo`: a small classifier head, written in the .kf text form, run on built-in data:
//! by the reference interpreter, then as fused kernels (the plan and its reasons, the
//! kernels compiled, their results checked against the reference in both numerics modes),
//! then timed against the reference on a batch large enough to measure.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context as _, Result};
use kfuse::{Array, Context, CustomOps, DType, FixedCostModel, FusePolicy, Numerics};

/// Layer norm, a GELU dense layer, a dense layer, then softmax and argmax: the kind of graph the
/// fusion compiler turns into a handful of kernels.
pub const DEMO_PROGRAM: &str = r#"# kfuse demo: a classifier head over 8 feature vectors.
%x     = input() name="x" : f32[8, 16]
%gamma = input() name="gamma" : f32[16]
%w1    = input() name="w1" : f32[16, 32]
%b1    = input() name="b1" : f32[32]
%w2    = input() name="w2" : f32[32, 4]
# Layer norm over the features (biased variance, eps 1e-5).
%mean  = reduce_mean(%x) axes=[1] keepdims=true
%xc    = sub(%x, %mean)
%sq    = mul(%xc, %xc)
%var   = reduce_mean(%sq) axes=[1] keepdims=true
%eps   = constant() value=1e-5 : f32[]
%veps  = add(%var, %eps)
%inv   = rsqrt(%veps)
%xn    = mul(%xc, %inv)
%h0    = mul(%xn, %gamma)
# Dense + GELU, then the output layer.
%h1    = matmul(%h0, %w1)
%h2    = add(%h1, %b1)
%h     = gelu(%h2)
%logit = matmul(%h, %w2)
# Softmax over the 4 classes, and the predicted class.
%m     = reduce_max(%logit) axes=[1] keepdims=true
%z     = sub(%logit, %m)
%e     = exp(%z)
%s     = reduce_sum(%e) axes=[1] keepdims=true
%probs = div(%e, %s)
%class = argmax(%probs) axes=[1] keepdims=false
output "probs" = %probs
output "class" = %class
"#;

/// Deterministic normal data from kfuse's counter-based generator.
fn data(cx: &Context, shape: &[usize], scale: f64) -> Result<Array> {
    Ok((cx.randn(DType::F32, shape) * scale).to_array()?)
}

fn preview(array: &Array) -> String {
    let n = array.n_elems().min(4);
    let items: Vec<String> = (0..n).map(|i| format!("{:.4}", array.get_f64(i))).collect();
    let more = if array.n_elems() > n { ", ..." } else { "" };
    format!("[{}{more}]", items.join(", "))
}

/// Rows of the timed batch.
const TIMED_ROWS: usize = 65_536;

/// The demo's inputs for `rows` feature vectors.
fn inputs(cx: &Context, rows: usize) -> Result<Vec<(String, Array)>> {
    Ok(vec![
        ("x".to_string(), data(cx, &[rows, 16], 1.0)?),
        (
            "gamma".to_string(),
            (cx.ones(DType::F32, &[16]) + cx.randn(DType::F32, &[16]) * 0.1).to_array()?,
        ),
        ("w1".to_string(), data(cx, &[16, 32], 0.25)?),
        ("b1".to_string(), data(cx, &[32], 0.1)?),
        ("w2".to_string(), data(cx, &[32, 4], 0.2)?),
    ])
}

/// Compiles `graph` in `numerics` with the cost model's fusion and the fixed cost model (so
/// that the plan shown is the same on every machine).
fn compile(graph: &kfuse::Graph, numerics: Numerics) -> Result<kfuse::Executable> {
    let options = kfuse::Options {
        numerics,
        ..kfuse::Options::default()
    };
    Ok(kfuse::compile_with_cost_model(
        graph,
        &options,
        &FixedCostModel::default(),
    )?)
}

/// The largest difference between two runs' float outputs, and whether every element has
/// the same bits (NaNs alike).
fn compare(a: &[(String, Array)], b: &[(String, Array)]) -> (f64, bool) {
    let mut worst = 0.0f64;
    let mut same = true;
    for ((_, x), (_, y)) in a.iter().zip(b) {
        for i in 0..x.n_elems().min(y.n_elems()) {
            let (u, v) = (x.get_f64(i), y.get_f64(i));
            same &= u.to_bits() == v.to_bits() || (u.is_nan() && v.is_nan());
            worst = worst.max((u - v).abs());
        }
        same &= x.n_elems() == y.n_elems();
    }
    (worst, same)
}

/// The median of `runs` timings of `f`, in milliseconds.
fn median_ms(runs: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        f()?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[runs / 2])
}

pub fn demo(output_dir: Option<&Path>) -> Result<()> {
    let text = DEMO_PROGRAM;
    let graph = kfuse::parse_graph(text).map_err(|e| anyhow::anyhow!(e.in_file("<demo>")))?;
    println!("kfuse demo: a classifier head (layer norm, GELU dense layer, softmax) in the .kf text form");
    println!("\n== program, as parsed and printed back with inferred types ==");
    print!("{}", kfuse::print_graph(&graph));

    let cx = Context::new();
    cx.set_seed(2026);
    let inputs = inputs(&cx, 8)?;
    println!("\n== built-in inputs (seeded normal data) ==");
    for (name, array) in &inputs {
        println!("{name:6} {:12} {}", array.ty().to_string(), preview(array));
    }

    let start = Instant::now();
    let (outputs, stats) = kfuse::run_graph_with_stats(&graph, &inputs, &CustomOps::new())?;
    let elapsed = start.elapsed();
    println!("\n== reference interpreter run ==");
    println!(
        "{} nodes executed in {:.3} ms; {} bytes materialized, peak {} bytes live",
        stats.nodes,
        elapsed.as_secs_f64() * 1e3,
        stats.bytes_materialized,
        stats.peak_bytes
    );

    let probs = &outputs[0].1;
    let classes = &outputs[1].1;
    let p: &[f32] = probs.as_slice().context("probs is f32")?;
    let c: &[i64] = classes.as_slice().context("class is i64")?;
    println!("\n== outputs ==");
    for row in 0..8 {
        let r = &p[row * 4..row * 4 + 4];
        let cells: Vec<String> = r.iter().map(|v| format!("{v:.4}")).collect();
        println!("row {row}: probs [{}]  class {}", cells.join(", "), c[row]);
    }
    let worst = (0..8)
        .map(|row| {
            (p[row * 4..row * 4 + 4]
                .iter()
                .map(|&v| v as f64)
                .sum::<f64>()
                - 1.0)
                .abs()
        })
        .fold(0.0, f64::max);
    let consistent = (0..8).all(|row| {
        let r = &p[row * 4..row * 4 + 4];
        let best = (0..4).fold(0, |b, j| if r[j] > r[b] { j } else { b });
        best as i64 == c[row]
    });
    println!("check: every row of probs sums to 1 within {worst:.1e}; argmax agrees with probs: {consistent}");

    println!("\n== fusion plan (`kfuse explain`: cost model, fixed coefficients) ==");
    print!(
        "{}",
        crate::explain::explain(
            &graph,
            FusePolicy::Cost,
            &FixedCostModel::default(),
            false,
            None,
            false
        )?
    );

    println!("\n== compiled runs, checked against the reference interpreter ==");
    for numerics in [Numerics::Strict, Numerics::Fast] {
        let exe = compile(&graph, numerics)?;
        let (fused, _) = exe
            .run(&inputs, &CustomOps::new())
            .map_err(kfuse::Error::from)?;
        let (diff, same) = compare(&outputs, &fused);
        println!(
            "{} numerics: {}",
            numerics.name(),
            crate::tier_summary(&exe)
        );
        if numerics == Numerics::Strict {
            println!("  outputs bit-identical to the reference: {same}");
        } else {
            println!(
                "  largest difference from the reference: {diff:.1e} (fast numerics contracts and reassociates)"
            );
        }
    }

    let rows = TIMED_ROWS;
    println!(
        "\n== timed: the same head on {rows} rows (median of 5 runs; compiled: fast numerics, {} threads) ==",
        kfuse::cpu::Pool::global().threads()
    );
    let big_text = text.replace("f32[8, 16]", &format!("f32[{rows}, 16]"));
    let big = kfuse::parse_graph(&big_text).map_err(|e| anyhow::anyhow!(e.in_file("<demo>")))?;
    let big_inputs = self::inputs(&cx, rows)?;
    let exe = compile(&big, Numerics::Fast)?;
    let mut runner = exe.runner();
    let custom = CustomOps::new();
    runner
        .run(&big_inputs, &custom)
        .map_err(kfuse::Error::from)?;
    let fused_ms = median_ms(5, || {
        runner
            .run(&big_inputs, &custom)
            .map(|_| ())
            .map_err(|e| kfuse::Error::from(e).into())
    })?;
    let reference_ms = median_ms(5, || {
        kfuse::run_graph(&big, &big_inputs, &custom)
            .map(|_| ())
            .map_err(Into::into)
    })?;
    println!(
        "reference interpreter (op by op): {reference_ms:.2} ms; fused kernels: {fused_ms:.2} ms ({:.1}x faster)",
        reference_ms / fused_ms
    );
    if let Some(dir) = output_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        std::fs::write(dir.join("demo.kf"), text)
            .with_context(|| format!("cannot write into {}", dir.display()))?;
        for (name, array) in inputs.iter().chain(outputs.iter()) {
            kfuse::npy::save_npy(&dir.join(format!("{name}.npy")), array)?;
        }
        println!(
            "wrote demo.kf and the inputs and outputs as .npy into {}",
            dir.display()
        );
    }
    Ok(())
}
