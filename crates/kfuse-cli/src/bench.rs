//! `kfuse bench`: the workloads W0-W7 of the project's benchmark list, and two extra cases (the
//! cost model's partial fusion, a fused transpose).
//!
//! W0 measures this machine's memory bandwidth with STREAM kernels (copy, scale, add, triad;
//! ordinary and non-temporal stores; one and two threads) compiled by the same C compiler path as
//! kfuse's kernels. W1-W4 run fused (compiled, fast numerics, cost policy) and unfused (the
//! reference interpreter, one materialized result per op), check the fused result against the
//! unfused one, and report medians, effective bandwidth (the workload's fused bytes over the
//! median time) and its fraction of the W0 triad bandwidth with streaming stores. That fraction
//! is paired: each timed fused run is followed by a triad run, and the median of the runs'
//! fractions is reported (with the median of those triads), because a shared host's bandwidth
//! can drift by up to 2x within minutes (`docs/benchmarks.md`, "W0: machine limits").
//!
//! W5-W7 (structured ops: GEMMs and convolutions with fused neighbours) are bound by arithmetic
//! rather than memory. Their rooflines take W0's FMA peak and triad measured in the same run
//! (`Roof`): each reports its GFLOP/s and share of the peak, and W6a the least time its block
//! could take fused and unfused at those limits, which bounds the speedup fusion can give it.

use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use kfuse::cpu::{launch_on, storage_ptr, Compiler, Numerics, Pool};
use kfuse::kernel::{Access, Arg, Kernel};
use kfuse::{Array, CustomOps, DType, FixedCostModel, Storage, TensorType};
use serde_json::json;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("times are finite"));
    v[v.len() / 2]
}

/// Times `f` `runs` times after one warm-up run; returns the median seconds.
fn time(runs: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut t = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        f()?;
        t.push(start.elapsed().as_secs_f64());
    }
    Ok(median(t))
}

const STREAM_SOURCE: &str = r#"
#include <stdint.h>
#include <immintrin.h>
/* STREAM-style kernels over [j_lo, j_hi); args: a (written), b, c; KIND selects the kernel. */
void kfuse_kernel(void **args, int64_t o_lo, int64_t o_hi, int64_t j_lo, int64_t j_hi) {
    (void)o_lo; (void)o_hi;
    float *restrict a = (float *)args[0];
    const float *restrict b = (const float *)args[1];
    const float *restrict c = (const float *)args[2];
    const float q = 3.0f;
#if STREAMING
    int64_t j = j_lo;
    for (; j < j_hi && ((uintptr_t)(a + j) & 63); j++) a[j] = KIND_EXPR;
    for (; j + 16 <= j_hi; j += 16) {
        __m512 bv = _mm512_loadu_ps(b + j), cv = _mm512_loadu_ps(c + j), qv = _mm512_set1_ps(q);
        (void)bv; (void)cv; (void)qv;
        _mm512_stream_ps(a + j, VEC_EXPR);
    }
    for (; j < j_hi; j++) a[j] = KIND_EXPR;
    _mm_sfence();
#else
    for (int64_t j = j_lo; j < j_hi; j++) a[j] = KIND_EXPR;
#endif
}
"#;

struct StreamKernel {
    name: &'static str,
    scalar: &'static str,
    vector: &'static str,
    /// Bytes counted per element (STREAM's convention: no write-allocate traffic).
    bytes: usize,
}

const STREAM: [StreamKernel; 4] = [
    StreamKernel {
        name: "copy",
        scalar: "b[j]",
        vector: "bv",
        bytes: 8,
    },
    StreamKernel {
        name: "scale",
        scalar: "q * b[j]",
        vector: "_mm512_mul_ps(qv, bv)",
        bytes: 8,
    },
    StreamKernel {
        name: "add",
        scalar: "b[j] + c[j]",
        vector: "_mm512_add_ps(bv, cv)",
        bytes: 12,
    },
    StreamKernel {
        name: "triad",
        scalar: "b[j] + q * c[j]",
        vector: "_mm512_add_ps(bv, _mm512_mul_ps(qv, cv))",
        bytes: 12,
    },
];

/// The STREAM kernel over `n` elements, three arguments: `a` written, `b` and `c` read.
fn stream_kernel(n: usize) -> Kernel {
    let ty = TensorType::new(DType::F32, [n]);
    let arg = |access| Arg {
        ty: ty.clone(),
        access,
    };
    Kernel {
        name: "stream".into(),
        outer: vec![],
        inner: vec![n],
        args: vec![arg(Access::Write), arg(Access::Read), arg(Access::Read)],
        insts: vec![],
    }
}

fn stream_source(k: &StreamKernel, streaming: bool) -> String {
    format!(
        "#define KIND_EXPR ({})\n#define VEC_EXPR ({})\n#define STREAMING {}\n{STREAM_SOURCE}",
        k.scalar, k.vector, streaming as u8
    )
}

/// The W0 triad (streaming stores where AVX-512 has them, on the global pool), kept ready so
/// that a workload's timed runs can alternate with it: a shared host's bandwidth can drift by
/// up to 2x within minutes (`docs/benchmarks.md`, "W0: machine limits"), so a fraction of a
/// triad measured once at the start says more about the drift than about the workload.
struct Triad {
    kernel: Kernel,
    compiled: kfuse::cpu::CompiledKernel,
    buffers: [Storage; 3],
    bytes: usize,
}

impl Triad {
    fn new(compiler: &Compiler, n: usize) -> Result<Triad> {
        let k = &STREAM[3];
        let streaming = std::arch::is_x86_feature_detected!("avx512f");
        let (compiled, _) = compiler
            .compile(&stream_source(k, streaming), Numerics::Fast)
            .map_err(anyhow::Error::msg)?;
        Ok(Triad {
            kernel: stream_kernel(n),
            compiled,
            buffers: [
                Storage::F32(vec![0.0; n]),
                Storage::F32(vec![1.0; n]),
                Storage::F32(vec![2.0; n]),
            ],
            bytes: k.bytes * n,
        })
    }

    /// One triad run's bandwidth in GB/s.
    fn gb_per_s(&self) -> f64 {
        let start = Instant::now();
        launch_on(
            Pool::global(),
            &self.kernel,
            &self.compiled,
            self.buffers.iter().map(storage_ptr).collect(),
        );
        self.bytes as f64 / start.elapsed().as_secs_f64() / 1e9
    }
}

/// This machine's limits for the rooflines of the structured workloads (W5-W7), measured in the
/// same run as they are: W0's f32 FMA peak on the pool's threads, the best of five runs (a
/// median let one core, busy elsewhere for a moment, halve the peak and lift every floor above
/// the workload's time), and its triad with streaming stores, the median of five (a shared
/// host's memory can have spells of twice its usual bandwidth, which a best run would take as
/// the limit).
#[derive(Clone, Copy, Debug)]
struct Roof {
    gflop_per_s: f64,
    gb_per_s: f64,
}

impl Roof {
    /// Both limits, or none where the FMA peak cannot be measured (see `peak::isa`).
    fn measure(compiler: &Compiler, threads: usize, quick: bool) -> Result<Option<Roof>> {
        let iters = if quick { 1 << 20 } else { 1 << 24 };
        let mut gflop_per_s = 0.0f64;
        for _ in 0..5 {
            let Ok(g) = crate::peak::gflops(threads, iters, 1) else {
                return Ok(None);
            };
            gflop_per_s = gflop_per_s.max(g);
        }
        let triad = Triad::new(compiler, (32 << 20) / if quick { 16 } else { 1 })?;
        let gb_per_s = median((0..5).map(|_| triad.gb_per_s()).collect());
        Ok(Some(Roof {
            gflop_per_s,
            gb_per_s,
        }))
    }

    /// The least time, in ms, of a step that does `flops` of arithmetic and moves `bytes` to
    /// and from memory: whichever of the two takes longer at these limits.
    fn floor_ms(&self, flops: f64, bytes: f64) -> f64 {
        (flops / 1e9 / self.gflop_per_s).max(bytes / 1e9 / self.gb_per_s) * 1e3
    }

    /// W6a's block (`n` images of `c` channels, `hw` square, 3×3 depthwise then 1×1 to `co`, f32)
    /// at the rooflines, fused (the input read and the output written once) and unfused (the
    /// depthwise output written and read back between the two halves), in ms.
    fn separable_floors(&self, n: usize, c: usize, co: usize, hw: usize) -> (f64, f64) {
        let pixels = (n * hw * hw) as f64;
        let (depthwise, pointwise) = (
            2.0 * 9.0 * pixels * c as f64,
            2.0 * pixels * (c * co) as f64,
        );
        let (x, middle, y) = (
            4.0 * pixels * c as f64,
            4.0 * pixels * c as f64,
            4.0 * pixels * co as f64,
        );
        let fused = self.floor_ms(depthwise + pointwise, x + y);
        let unfused = self.floor_ms(depthwise, x + middle) + self.floor_ms(pointwise, middle + y);
        (fused, unfused)
    }
}

/// W0: STREAM bandwidth in GB/s for each kernel, store kind and thread count.
fn stream(compiler: &Compiler, n: usize, runs: usize) -> Result<Vec<serde_json::Value>> {
    let avx512 = std::arch::is_x86_feature_detected!("avx512f");
    let a = Storage::F32(vec![0.0; n]);
    let b = Storage::F32(vec![1.0; n]);
    let c = Storage::F32(vec![2.0; n]);
    let kernel = stream_kernel(n);
    let mut rows = Vec::new();
    for k in &STREAM {
        for streaming in [false, true] {
            if streaming && !avx512 {
                continue;
            }
            let (compiled, _) = compiler
                .compile(&stream_source(k, streaming), Numerics::Fast)
                .map_err(anyhow::Error::msg)?;
            for threads in [1usize, 2] {
                let pool = Pool::new(threads);
                let ptrs = || vec![storage_ptr(&a), storage_ptr(&b), storage_ptr(&c)];
                let secs = time(runs, || {
                    launch_on(&pool, &kernel, &compiled, ptrs());
                    Ok(())
                })?;
                rows.push(json!({
                    "kernel": k.name,
                    "stores": if streaming { "streaming" } else { "ordinary" },
                    "threads": threads,
                    "gb_per_s": (k.bytes * n) as f64 / secs / 1e9,
                }));
            }
        }
    }
    Ok(rows)
}

struct Workload {
    id: &'static str,
    what: &'static str,
    program: String,
    fused_bytes: f64,
    /// Max |fused - unfused| / max |unfused| allowed.
    tolerance: f64,
}

fn workloads(scale: usize) -> Vec<Workload> {
    let n = 16_777_216 / scale;
    let (sr, sc) = (4096 / scale.min(4096), 4096);
    let (lr, lc) = (8192 / scale.min(8192), 1024);
    vec![
        Workload {
            id: "W1",
            what: "log(exp(x) + 1)",
            program: format!("%x = input() name=\"x\" : f32[{n}]\n%e = exp(%x)\n%one = constant() value=1.0 : f32[]\n%p = add(%e, %one)\n%y = log(%p)\noutput \"y\" = %y\n"),
            fused_bytes: 8.0 * n as f64,
            tolerance: 1e-5,
        },
        Workload {
            id: "W2a",
            what: "tanh(0.5 x + 0.1)",
            program: format!("%x = input() name=\"x\" : f32[{n}]\n%h = constant() value=0.5 : f32[]\n%c = constant() value=0.1 : f32[]\n%a = mul(%x, %h)\n%b = add(%a, %c)\n%y = tanh(%b)\noutput \"y\" = %y\n"),
            fused_bytes: 8.0 * n as f64,
            tolerance: 1e-5,
        },
        Workload {
            id: "W2b",
            what: "max(tanh(0.5 x + 0.1) x - 0.3, 0)",
            program: format!("%x = input() name=\"x\" : f32[{n}]\n%h = constant() value=0.5 : f32[]\n%c = constant() value=0.1 : f32[]\n%d = constant() value=0.3 : f32[]\n%z = constant() value=0.0 : f32[]\n%a = mul(%x, %h)\n%b = add(%a, %c)\n%t = tanh(%b)\n%m = mul(%t, %x)\n%s = sub(%m, %d)\n%y = max(%s, %z)\noutput \"y\" = %y\n"),
            fused_bytes: 8.0 * n as f64,
            tolerance: 1e-5,
        },
        Workload {
            id: "W3",
            what: "t = x y; t + 0.25; t - 0.75",
            program: format!("%x = input() name=\"x\" : f32[{n}]\n%y = input() name=\"y\" : f32[{n}]\n%t = mul(%x, %y)\n%a = constant() value=0.25 : f32[]\n%b = constant() value=0.75 : f32[]\n%z1 = add(%t, %a)\n%z2 = sub(%t, %b)\noutput \"z1\" = %z1\noutput \"z2\" = %z2\n"),
            fused_bytes: 16.0 * n as f64,
            tolerance: 1e-6,
        },
        Workload {
            id: "W4a",
            what: "row softmax",
            program: format!("%x = input() name=\"x\" : f32[{sr}, {sc}]\n%m = reduce_max(%x) axes=[1] keepdims=true\n%d = sub(%x, %m)\n%e = exp(%d)\n%s = reduce_sum(%e) axes=[1] keepdims=true\n%y = div(%e, %s)\noutput \"y\" = %y\n"),
            fused_bytes: 8.0 * (sr * sc) as f64,
            tolerance: 1e-4,
        },
        Workload {
            id: "W4b",
            what: "row layernorm x gamma + beta",
            program: format!("%x = input() name=\"x\" : f32[{lr}, {lc}]\n%g = input() name=\"gamma\" : f32[{lc}]\n%b = input() name=\"beta\" : f32[{lc}]\n%mu = reduce_mean(%x) axes=[1] keepdims=true\n%d = sub(%x, %mu)\n%d2 = mul(%d, %d)\n%var = reduce_mean(%d2) axes=[1] keepdims=true\n%eps = constant() value=1e-5 : f32[]\n%ve = add(%var, %eps)\n%r = rsqrt(%ve)\n%n = mul(%d, %r)\n%ng = mul(%n, %g)\n%y = add(%ng, %b)\noutput \"y\" = %y\n"),
            fused_bytes: 8.0 * (lr * lc) as f64 + 8.0 * lc as f64,
            tolerance: 1e-4,
        },
    ]
}

/// Random normal inputs from kfuse's counter-based generator.
fn inputs_for(graph: &kfuse::Graph) -> Result<Vec<(String, Array)>> {
    let cx = kfuse::Context::new();
    cx.set_seed(7);
    graph
        .inputs()
        .map(|(_, name, ty)| {
            Ok((
                name.to_string(),
                cx.randn(ty.dtype, ty.shape.dims()).to_array()?,
            ))
        })
        .collect()
}

/// The largest difference between `got` and `want`, relative to `want`'s largest magnitude;
/// infinite where the two differ in shape or one holds a NaN or an infinity the other does
/// not (a plain `f64::max` fold would skip the NaN and report no error at all).
fn relative_error(got: &Array, want: &Array) -> f64 {
    if got.n_elems() != want.n_elems() {
        return f64::INFINITY;
    }
    let (mut err, mut scale) = (0.0f64, 0.0f64);
    for i in 0..want.n_elems() {
        let (g, w) = (got.get_f64(i), want.get_f64(i));
        if !g.is_finite() || !w.is_finite() {
            if g == w || g.is_nan() && w.is_nan() {
                continue;
            }
            return f64::INFINITY;
        }
        err = err.max((g - w).abs());
        scale = scale.max(w.abs());
    }
    err / scale.max(f64::MIN_POSITIVE)
}

/// The largest error of `case`'s outputs relative to the reference interpreter's on the same
/// inputs (`program` with `frozen` as constants, as `case` was built); an error past
/// `docs/benchmarks.md`'s tolerance for W5-W7 (1e-3 of the largest reference value, as
/// WORKLOADS.md states it) or a different output count stops the bench.
fn checked_against_reference(
    id: &str,
    case: &Case,
    program: &str,
    frozen: &[(String, Array)],
) -> Result<f64> {
    let (got, _) = case.exe.run(&case.inputs, &CustomOps::new())?;
    let graph = kfuse::opt::freeze(&kfuse::parse(program)?, frozen)?;
    let want = kfuse::run_graph(&graph, &case.inputs, &CustomOps::new())?;
    if got.len() != want.len() {
        bail!(
            "{id}: {} outputs where the reference has {}",
            got.len(),
            want.len()
        );
    }
    let error = got
        .iter()
        .zip(&want)
        .map(|((_, g), (_, w))| relative_error(g, w))
        .fold(0.0, f64::max);
    if error > 1e-3 {
        bail!("{id}: off the reference interpreter's result by {error:e} of its largest value");
    }
    Ok(error)
}

/// Every workload and extra case `kfuse bench` takes by name.
pub const WORKLOAD_IDS: [&str; 26] = [
    "W0",
    "W1",
    "W2a",
    "W2b",
    "W3",
    "W4a",
    "W4b",
    "W5a",
    "W5b",
    "W6a",
    "W6b",
    "W7",
    "cost",
    "transpose",
    "activations",
    "mobilenet",
    "inverted",
    "inverted7",
    "mbconv",
    "mbv3",
    "resnet",
    "resnet7",
    "resnet18",
    "resnet50",
    "resnet18-nhwc",
    "cast",
];

/// Refuses names no workload answers to: each part of the bench runs only for the names it
/// knows, so a misspelt one would run nothing and still succeed.
fn check_workload_names(only: &[String]) -> Result<()> {
    let unknown: Vec<&str> = only
        .iter()
        .map(String::as_str)
        .filter(|name| !WORKLOAD_IDS.contains(name))
        .collect();
    if !unknown.is_empty() {
        bail!(
            "unknown workload{} {}: kfuse bench takes {}",
            if unknown.len() == 1 { "" } else { "s" },
            unknown
                .iter()
                .map(|name| format!("`{name}`"))
                .collect::<Vec<_>>()
                .join(", "),
            WORKLOAD_IDS.join(", ")
        );
    }
    Ok(())
}

pub fn bench(as_json: bool, quick: bool, only: &[String]) -> Result<()> {
    check_workload_names(only)?;
    let cache = std::env::temp_dir().join(format!("kfuse-bench-cache-{}", std::process::id()));
    let compiler = Compiler::detect(cache.clone())
        .map_err(anyhow::Error::msg)
        .context("kfuse bench needs a C compiler")?;
    let (scale, runs) = if quick { (16, 3) } else { (1, 10) };
    let threads = Pool::global().threads();
    let mut report =
        json!({"machine": {"threads": threads, "compiler": compiler.version}, "runs": runs});
    let stream_rows = if only.is_empty() || only.iter().any(|w| w == "W0") {
        let rows = stream(&compiler, (32 << 20) / scale, runs)?;
        if !as_json {
            println!("W0 STREAM (GB/s, median of {runs}):");
            for r in &rows {
                println!(
                    "  {:5} {:9} stores, {} thread(s): {:6.2}",
                    r["kernel"].as_str().unwrap(),
                    r["stores"].as_str().unwrap(),
                    r["threads"],
                    r["gb_per_s"].as_f64().unwrap()
                );
            }
        }
        rows
    } else {
        vec![]
    };
    if only.is_empty() || only.iter().any(|w| w == "W0") {
        report["w0_fma"] = peak_fma(threads, quick, as_json);
    }
    let triad = stream_rows
        .iter()
        .filter(|r| {
            // Streaming stores: kfuse streams large outputs too, so the roofline counts only the
            // bytes a kernel reads and writes, never the read-for-ownership of written lines.
            r["kernel"] == "triad" && r["stores"] == "streaming" && r["threads"] == threads.min(2)
        })
        .map(|r| r["gb_per_s"].as_f64().unwrap())
        .next();
    report["w0"] = json!(stream_rows);
    report["w0_triad_gb_per_s"] = json!(triad);
    let paired = if triad.is_some() {
        Some(Triad::new(&compiler, (32 << 20) / scale)?)
    } else {
        None
    };
    let mut results = Vec::new();
    for w in workloads(scale) {
        if !only.is_empty() && !only.iter().any(|o| o == w.id) {
            continue;
        }
        let graph = kfuse::parse(&w.program)?;
        let inputs = inputs_for(&graph)?;
        let cost = FixedCostModel::default();
        let options = kfuse::Options {
            cache_dir: cache.join(format!("cold-{}", w.id)),
            ..kfuse::Options::default()
        };
        let cold = kfuse::compile_with_cost_model(&graph, &options, &cost)?;
        let cached = kfuse::compile_with_cost_model(&graph, &options, &cost)?;
        if cached
            .tiers
            .iter()
            .flatten()
            .any(|t| !matches!(t, kfuse::Tier::Compiled { cached: true, .. }))
        {
            bail!("{}: second compile did not come from the cache", w.id);
        }
        let mut runner = cached.runner();
        // Fused runs alternate with triad runs; the fraction of W0 is the median of the rounds'
        // fractions.
        runner.run(&inputs, &CustomOps::new())?;
        let (mut times, mut fractions, mut triads) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            let start = Instant::now();
            runner.run(&inputs, &CustomOps::new())?;
            let t = start.elapsed().as_secs_f64();
            times.push(t);
            if let Some(triad) = &paired {
                let bw = triad.gb_per_s();
                triads.push(bw);
                fractions.push(w.fused_bytes / t / 1e9 / bw);
            }
        }
        let fused = median(times);
        let fraction = (!fractions.is_empty()).then(|| median(fractions));
        let paired_triad = (!triads.is_empty()).then(|| median(triads));
        let fused_out = runner.outputs(&inputs);
        let unfused_runs = if quick { 1 } else { 3 };
        let mut reference = Vec::new();
        let unfused = time(unfused_runs, || {
            reference = kfuse::run_graph(&graph, &inputs, &CustomOps::new())?;
            Ok(())
        })?;
        let error = fused_out
            .iter()
            .zip(&reference)
            .map(|((_, g), (_, r))| relative_error(g, r))
            .fold(0.0, f64::max);
        if error > w.tolerance {
            bail!(
                "{}: fused result is off by {error:e} (tolerance {:e})",
                w.id,
                w.tolerance
            );
        }
        let gbs = w.fused_bytes / fused / 1e9;
        let row = json!({
            "id": w.id,
            "what": w.what,
            "kernels": cached.tiers.iter().flatten().count(),
            "fused_ms": fused * 1e3,
            "unfused_ms": unfused * 1e3,
            "speedup": unfused / fused,
            "gb_per_s": gbs,
            "fraction_of_w0": fraction,
            "paired_triad_gb_per_s": paired_triad,
            "compile_cold_ms": cold.compile_seconds * 1e3,
            "compile_cached_ms": cached.compile_seconds * 1e3,
            "max_relative_error": error,
        });
        if !as_json {
            if results.is_empty() {
                println!(
                    "\n{:4} {:36} {:>7} {:>10} {:>10} {:>8} {:>7} {:>8} {:>10} {:>10}",
                    "id",
                    "workload",
                    "kernels",
                    "fused ms",
                    "unfused ms",
                    "speedup",
                    "GB/s",
                    "% of W0",
                    "cold ms",
                    "cached ms"
                );
            }
            let pct = fraction.map_or("-".to_string(), |f| format!("{:.0}%", 100.0 * f));
            println!(
                "{:4} {:36} {:>7} {:>10.2} {:>10.1} {:>7.1}x {:>7.1} {:>8} {:>10.1} {:>10.2}",
                w.id,
                w.what,
                row["kernels"],
                fused * 1e3,
                unfused * 1e3,
                unfused / fused,
                gbs,
                pct,
                cold.compile_seconds * 1e3,
                cached.compile_seconds * 1e3
            );
        }
        results.push(row);
    }
    report["workloads"] = json!(results);
    let structured = ["W5a", "W5b", "W6a", "W6b", "W7"];
    let roof = if only.is_empty() || only.iter().any(|o| structured.contains(&o.as_str())) {
        Roof::measure(&compiler, threads, quick)?
    } else {
        None
    };
    if let Some(roof) = roof {
        report["roof"] = json!({"gflop_per_s": roof.gflop_per_s, "gb_per_s": roof.gb_per_s});
        if !as_json {
            println!(
                "\nRooflines of W5-W7, measured now: f32 FMA peak {:.0} GFLOP/s, triad {:.1} GB/s ({threads} thread(s))",
                roof.gflop_per_s, roof.gb_per_s
            );
        }
    }
    if only.is_empty() || only.iter().any(|o| o == "W5a" || o == "W5b") {
        report["gemm_epilogues"] = gemm_epilogues(&cache, runs, scale, as_json, only, roof)?;
    }
    if only.is_empty()
        || only.iter().any(|o| {
            o.starts_with("W6")
                || o == "W7"
                || o == "mobilenet"
                || o.starts_with("inverted")
                || o == "mbconv"
                || o == "mbv3"
                || o.starts_with("resnet")
        })
    {
        report["convolutions"] = conv_workloads(&cache, runs, quick, as_json, only, roof)?;
    }
    if only.is_empty() || only.iter().any(|o| o == "activations") {
        report["activations"] = activation_case(&cache, runs, quick, as_json)?;
    }
    if only.is_empty() || only.iter().any(|o| o == "cast") {
        report["cast"] = cast_case(&cache, runs, quick, as_json)?;
    }
    if only.is_empty() || only.iter().any(|o| o == "transpose") {
        report["transpose"] = transpose_case(&cache, runs, quick, as_json)?;
    }
    if only.is_empty() || only.iter().any(|o| o == "cost") {
        report["cost_model_case"] = cost_model_case(&cache, runs, as_json)?;
    }
    if as_json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    let _ = std::fs::remove_dir_all(&cache);
    Ok(())
}

/// W0's peak f32 FMA rate, one thread and the pool's threads, in GFLOP/s.
fn peak_fma(threads: usize, quick: bool, as_json: bool) -> serde_json::Value {
    let iters = if quick { 1 << 20 } else { 1 << 24 };
    let isa = match crate::peak::isa() {
        Ok(isa) => isa,
        Err(why) => {
            if !as_json {
                println!("W0 peak f32 FMA: not measured ({why})");
            }
            return json!({"skipped": why});
        }
    };
    let mut rows = Vec::new();
    let counts = if threads > 1 {
        vec![1, threads]
    } else {
        vec![1]
    };
    for t in counts {
        match crate::peak::gflops(t, iters, 5) {
            Ok(g) => rows.push(json!({"threads": t, "gflop_per_s": g})),
            Err(why) => return json!({"skipped": why}),
        }
    }
    if !as_json {
        let cells: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{} thread(s) {:.0}",
                    r["threads"],
                    r["gflop_per_s"].as_f64().unwrap_or(0.0)
                )
            })
            .collect();
        println!(
            "W0 peak f32 FMA ({isa}, GFLOP/s, median of 5): {}",
            cells.join(", ")
        );
    }
    json!({"isa": isa, "rows": rows})
}

/// The case where fusing everything is slower than partial fusion: an expensive value read
/// through a broadcast (`examples/expensive_broadcast.kf`), timed under the greedy and the cost
/// policy, with the calibrated cost model.
fn cost_model_case(
    cache: &std::path::Path,
    runs: usize,
    as_json: bool,
) -> Result<serde_json::Value> {
    let program = include_str!("../../../examples/expensive_broadcast.kf");
    let graph = kfuse::parse(program)?;
    let inputs = inputs_for(&graph)?;
    let cost =
        kfuse::runtime::calibrated_cost_model(&kfuse::cpu::default_cache_dir()).unwrap_or_default();
    let mut rows = Vec::new();
    for policy in [kfuse::FusePolicy::Greedy, kfuse::FusePolicy::Cost] {
        let options = kfuse::Options {
            policy,
            cache_dir: cache.join("cost-case"),
            ..kfuse::Options::default()
        };
        let exe = kfuse::compile_with_cost_model(&graph, &options, &cost)?;
        let mut runner = exe.runner();
        let ms = time(runs, || {
            runner
                .run(&inputs, &CustomOps::new())
                .map(|_| ())
                .map_err(Into::into)
        })? * 1e3;
        rows.push(json!({"policy": policy.name(), "kernels": exe.tiers.iter().flatten().count(), "ms": ms}));
    }
    if !as_json {
        println!("\ncost model case (examples/expensive_broadcast.kf): greedy {} kernel(s) {:.2} ms; cost {} kernel(s) {:.2} ms",
            rows[0]["kernels"], rows[0]["ms"].as_f64().unwrap(), rows[1]["kernels"], rows[1]["ms"].as_f64().unwrap());
    }
    Ok(json!(rows))
}

/// W5a's dense layer with each activation the GEMM epilogues apply (relu, sigmoid, tanh,
/// both forms of GELU, ReLU6), against the layer with its bias alone: what each activation adds to the GEMM.
fn activation_case(
    cache: &std::path::Path,
    runs: usize,
    quick: bool,
    as_json: bool,
) -> Result<serde_json::Value> {
    let m = if quick { 64 } else { 1024 };
    let (k, n) = (1024, 4096);
    let layer = format!("%x = input() name=\"x\" : f32[{m}, {k}]\n%w = input() name=\"w\" : f32[{k}, {n}]\n%b = input() name=\"b\" : f32[{n}]\n%h = matmul(%x, %w)\n%hb = add(%h, %b)\n");
    let activations = ["relu", "sigmoid", "tanh", "gelu_tanh", "gelu", "relu6"];
    let mut programs = vec![layer.clone() + "output \"y\" = %hb\n"];
    for act in activations {
        let apply = if act == "relu6" {
            "%lo = constant() value=[0.0] : f32[]\n%hi = constant() value=[6.0] : f32[]\n\
             %y = clamp(%hb, %lo, %hi)\n"
                .to_string()
        } else {
            format!("%y = {act}(%hb)\n")
        };
        programs.push(layer.clone() + &apply + "output \"y\" = %y\n");
    }
    let cases = programs
        .iter()
        .map(|p| prepare(p, &[], kfuse::FusePolicy::Cost, cache))
        .collect::<Result<Vec<_>>>()?;
    let ms = interleaved_ms(&cases, runs)?;
    let mut rows = vec![json!({"activation": "none (bias)", "ms": ms[0], "ratio": 1.0})];
    for (act, &t) in activations.iter().zip(&ms[1..]) {
        rows.push(json!({"activation": act, "ms": t, "ratio": t / ms[0]}));
    }
    if !as_json {
        let cells: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{} {:.2} ms ({:.3})",
                    r["activation"].as_str().unwrap_or("?"),
                    r["ms"].as_f64().unwrap_or(0.0),
                    r["ratio"].as_f64().unwrap_or(0.0)
                )
            })
            .collect();
        println!(
            "\nactivations (relu(x @ W + b) and the others, {m} x {k} x {n}): {}",
            cells.join("; ")
        );
    }
    Ok(json!(rows))
}

/// A dense layer whose result is stored in bf16 (`cast(relu(x @ W + b))`, mixed-precision
/// inference), with the cast in the GEMM's epilogue, against the same layer storing f32, that
/// plus the cast as a kernel of its own (the plan before casts joined the epilogue, timed as
/// its two parts), and every op a kernel of its own; at K = 1024 (bound by arithmetic), 64 and
/// 16 (more and more by the output's memory traffic, which the cast halves).
fn cast_case(
    cache: &std::path::Path,
    runs: usize,
    quick: bool,
    as_json: bool,
) -> Result<serde_json::Value> {
    let m = if quick { 64 } else { 1024 };
    let n = 4096;
    let mut rows = Vec::new();
    let cast_alone = format!(
        "%r = input() name=\"r\" : f32[{m}, {n}]\n%y = cast(%r) to=bf16\noutput \"y\" = %y\n"
    );
    for k in [1024, 64, 16] {
        let layer = format!("%x = input() name=\"x\" : f32[{m}, {k}]\n%w = input() name=\"w\" : f32[{k}, {n}]\n%b = input() name=\"b\" : f32[{n}]\n%h = matmul(%x, %w)\n%hb = add(%h, %b)\n%r = relu(%hb)\n");
        let f32_out = layer.clone() + "output \"y\" = %r\n";
        let bf16_out = layer + "%y = cast(%r) to=bf16\noutput \"y\" = %y\n";
        let cases = [
            prepare(&f32_out, &[], kfuse::FusePolicy::Cost, cache)?,
            prepare(&bf16_out, &[], kfuse::FusePolicy::Cost, cache)?,
            prepare(&bf16_out, &[], kfuse::FusePolicy::None, cache)?,
            prepare(&cast_alone, &[], kfuse::FusePolicy::Cost, cache)?,
        ];
        let ms = interleaved_ms(&cases, runs)?;
        let two = ms[0] + ms[3];
        if !as_json {
            println!(
                "cast (bf16 output of relu(x @ W + b), {m} x {k} x {n}): fused {:.2} ms; f32 output {:.2} ms ({:.2}x); that and a cast kernel {two:.2} ms ({:.2}x); unfused {:.2} ms ({:.2}x)",
                ms[1],
                ms[0],
                ms[0] / ms[1],
                two / ms[1],
                ms[2],
                ms[2] / ms[1]
            );
        }
        rows.push(json!({"k": k, "ms": ms[1], "f32_output_ms": ms[0], "with_cast_kernel_ms": two, "unfused_ms": ms[2]}));
    }
    Ok(json!(rows))
}

/// A transpose fused into an add (`permute(x) + x`, which reads `x` across rows), against the
/// plain `x + x` of the same size: the cost of the strided read with the kernel's loops in
/// tiles.
fn transpose_case(
    cache: &std::path::Path,
    runs: usize,
    quick: bool,
    as_json: bool,
) -> Result<serde_json::Value> {
    let n = if quick { 1024 } else { 4096 };
    let input = format!("%x = input() name=\"x\" : f32[{n}, {n}]\n");
    let transpose =
        input.clone() + "%t = permute(%x) perm=[1, 0]\n%y = add(%t, %x)\noutput \"y\" = %y\n";
    let plain = input + "%y = add(%x, %x)\noutput \"y\" = %y\n";
    let cost = kfuse::FusePolicy::Cost;
    let cases = [
        prepare(&transpose, &[], cost, cache)?,
        prepare(&plain, &[], cost, cache)?,
    ];
    let ms = interleaved_ms(&cases, runs)?;
    // One read and one write of n x n f32 (the transposed read counted once).
    let gb = |ms: f64| (8 * n * n) as f64 / ms / 1e6;
    if !as_json {
        println!(
            "\ntranspose (permute(x) + x, {n} x {n} f32): {:.2} ms ({:.1} GB/s); plain x + x: {:.2} ms ({:.1} GB/s)",
            ms[0],
            gb(ms[0]),
            ms[1],
            gb(ms[1])
        );
    }
    Ok(
        json!({"n": n, "transpose_ms": ms[0], "transpose_gb_per_s": gb(ms[0]), "add_ms": ms[1], "add_gb_per_s": gb(ms[1])}),
    )
}

/// A compiled program and its inputs, ready to time.
struct Case {
    exe: kfuse::Executable,
    inputs: Vec<(String, Array)>,
}

/// Compiles `program` (fast numerics) with the named inputs frozen to constants (weights known
/// at compile time, so the graph passes can fold them) under `policy`.
fn prepare(
    program: &str,
    frozen: &[(String, Array)],
    policy: kfuse::FusePolicy,
    cache: &std::path::Path,
) -> Result<Case> {
    let options = kfuse::Options {
        policy,
        cache_dir: cache.to_path_buf(),
        ..kfuse::Options::default()
    };
    prepare_with(program, frozen, &options)
}

/// [`prepare`] with any options.
fn prepare_with(
    program: &str,
    frozen: &[(String, Array)],
    options: &kfuse::Options,
) -> Result<Case> {
    let graph = kfuse::opt::freeze(&kfuse::parse(program)?, frozen)?;
    let inputs = inputs_for(&graph)?;
    let exe = kfuse::compile_with_cost_model(&graph, options, &FixedCostModel::default())?;
    Ok(Case { exe, inputs })
}

/// Median ms of each case, timed in alternation (one run of each per round), so that a slow
/// spell of this shared machine falls on all of them alike and their ratios stay meaningful.
fn interleaved_ms(cases: &[Case], runs: usize) -> Result<Vec<f64>> {
    let mut runners: Vec<_> = cases.iter().map(|c| c.exe.runner()).collect();
    let mut times = vec![Vec::with_capacity(runs); cases.len()];
    for round in 0..=runs {
        for ((runner, case), t) in runners.iter_mut().zip(cases).zip(&mut times) {
            let start = Instant::now();
            runner.run(&case.inputs, &CustomOps::new())?;
            // Round 0 warms caches and buffers.
            if round > 0 {
                t.push(start.elapsed().as_secs_f64());
            }
        }
    }
    Ok(times.into_iter().map(|t| median(t) * 1e3).collect())
}

/// W5a and W5b: dense layers with epilogues, against the bare GEMMs of the same shapes.
fn gemm_epilogues(
    cache: &std::path::Path,
    runs: usize,
    scale: usize,
    as_json: bool,
    only: &[String],
    roof: Option<Roof>,
) -> Result<serde_json::Value> {
    let (m, k, n) = (1024 / scale.min(16), 1024, 4096);
    let dense = |a: &str, w: &str, b: &str, kk: usize, nn: usize| {
        format!("%{a} = input() name=\"{a}\" : f32[{m}, {kk}]\n%{w} = input() name=\"{w}\" : f32[{kk}, {nn}]\n%{b} = input() name=\"{b}\" : f32[{nn}]\n")
    };
    let bare1 = format!("%x = input() name=\"x\" : f32[{m}, {k}]\n%w = input() name=\"w\" : f32[{k}, {n}]\n%h = matmul(%x, %w)\noutput \"h\" = %h\n");
    let bare2 = format!("%x = input() name=\"x\" : f32[{m}, {n}]\n%w = input() name=\"w\" : f32[{n}, {k}]\n%h = matmul(%x, %w)\noutput \"h\" = %h\n");
    let w5a = dense("x", "w", "b", k, n)
        + "%h = matmul(%x, %w)\n%hb = add(%h, %b)\n%y = relu(%hb)\noutput \"y\" = %y\n";
    let w5b = dense("x", "w1", "b1", k, n)
        + &format!("%w2 = input() name=\"w2\" : f32[{n}, {k}]\n%b2 = input() name=\"b2\" : f32[{k}]\n")
        + "%h = matmul(%x, %w1)\n%hb = add(%h, %b1)\n%g = gelu_tanh(%hb)\n%o = matmul(%g, %w2)\n%y = add(%o, %b2)\noutput \"y\" = %y\n";
    let cost = kfuse::FusePolicy::Cost;
    let cases = [&bare1, &w5a, &bare2, &w5b]
        .iter()
        .map(|p| prepare(p, &[], cost, cache))
        .collect::<Result<Vec<_>>>()?;
    let ms = interleaved_ms(&cases, runs)?;
    let mut rows = Vec::new();
    // Arithmetic and memory traffic: the GEMMs' multiply-adds; the operands read and the
    // outputs written once (W5b's hidden layer written and read back: it is not fused away).
    let (x, w, h) = ((4 * m * k) as f64, (4 * k * n) as f64, (4 * m * n) as f64);
    let flops = (2 * m * k * n) as f64;
    for (id, ms, bare_ms, flops, bytes) in [
        ("W5a", ms[1], ms[0], flops, x + w + h),
        (
            "W5b",
            ms[3],
            ms[0] + ms[2],
            2.0 * flops,
            x + 2.0 * w + 2.0 * h + x,
        ),
    ] {
        if !only.is_empty() && !only.iter().any(|o| o == id) {
            continue;
        }
        let floor = roof.map(|r| r.floor_ms(flops, bytes));
        if !as_json {
            println!(
                "{id}: {ms:.2} ms, bare GEMM(s) {bare_ms:.2} ms, ratio {:.3}{}",
                ms / bare_ms,
                floor.map_or(String::new(), |f| format!(
                    "; {:.0} GFLOP/s, {:.0}% of the FMA peak",
                    flops / ms / 1e6,
                    100.0 * f / ms
                ))
            );
        }
        let (case, program) = if id == "W5a" {
            (&cases[1], &w5a)
        } else {
            (&cases[3], &w5b)
        };
        let error = checked_against_reference(id, case, program, &[])?;
        if !as_json {
            println!("{id}: within {error:.1e} of the reference interpreter's result");
        }
        rows.push(json!({"id": id, "ms": ms, "bare_gemm_ms": bare_ms, "ratio": ms / bare_ms, "floor_ms": floor, "max_rel_error": error}));
    }
    Ok(json!(rows))
}

/// `program` (weights `frozen`) fused by the cost model and unfused, timed in alternation:
/// printed as `id (what): fused .. ms, unfused .. ms (..x)` and returned as a JSON row.
fn fused_against_unfused(
    id: &str,
    what: &str,
    program: &str,
    frozen: &[(String, Array)],
    (cache, runs, as_json): (&std::path::Path, usize, bool),
) -> Result<serde_json::Value> {
    let cases = [
        prepare(program, frozen, kfuse::FusePolicy::Cost, cache)?,
        prepare(program, frozen, kfuse::FusePolicy::None, cache)?,
    ];
    let ms = interleaved_ms(&cases, runs)?;
    let (fused, unfused) = (ms[0], ms[1]);
    if !as_json {
        println!(
            "{id} ({what}): fused {fused:.2} ms, unfused {unfused:.2} ms ({:.2}x)",
            unfused / fused
        );
    }
    Ok(json!({"id": id, "ms": fused, "unfused_ms": unfused, "speedup": unfused / fused}))
}

/// ResNet-18 (`bottleneck` false: basic blocks of two 3×3 convolutions, two per stage) or
/// ResNet-50 (true: bottleneck blocks of a 1×1 reduction, a 3×3 and a 1×1 expansion to four
/// times the width, 3, 4, 6 and 3 per stage, the stride on the 3×3) for inference on `n`
/// images of `hw`×`hw` (batchnorms folded into the convolutions' weights and biases, as an
/// inference export leaves them), ending in 1000 logits: the program and its weights, drawn by
/// `randn` with He scaling. `nhwc`: activations in NHWC, as a TensorFlow export writes them.
fn resnet_network(
    n: usize,
    hw: usize,
    bottleneck: bool,
    nhwc: bool,
    randn: &dyn Fn(&[usize], f32) -> Result<Array>,
) -> Result<(String, Vec<(String, Array)>)> {
    let (layout, x_dims, gap_axes) = match nhwc {
        false => ("nchw", [n, 3, hw, hw], [2, 3]),
        true => ("nhwc", [n, hw, hw, 3], [1, 2]),
    };
    let mut text = format!("%x = input() name=\"x\" : f32{x_dims:?}\n");
    let mut frozen = Vec::new();
    let mut count = 0;
    // A convolution with its folded bias, and a ReLU after it where `relu`: returns the
    // result's name.
    let mut conv = |text: &mut String,
                    x: &str,
                    c: usize,
                    co: usize,
                    k: usize,
                    s: usize,
                    relu: bool|
     -> Result<String> {
        count += 1;
        let (w, b, y) = (
            format!("w{count}"),
            format!("b{count}"),
            format!("c{count}"),
        );
        let p = k / 2;
        // The bias broadcasts along the channel axis.
        let bias: &[usize] = if nhwc { &[co] } else { &[co, 1, 1] };
        text.push_str(&format!(
            "%{w} = input() name=\"{w}\" : f32[{co}, {c}, {k}, {k}]\n%{b} = input() name=\"{b}\" : f32{bias:?}\n%{y}r = conv2d(%{x}, %{w}) layout={layout} stride=[{s}, {s}] padding=[{p}, {p}, {p}, {p}] dilation=[1, 1] groups=1\n%{y} = add(%{y}r, %{b})\n"
        ));
        frozen.push((w, randn(&[co, c, k, k], (2.0 / (c * k * k) as f32).sqrt())?));
        frozen.push((b, randn(bias, 0.1)?));
        if relu {
            text.push_str(&format!("%{y}a = relu(%{y})\n"));
            return Ok(format!("{y}a"));
        }
        Ok(y)
    };
    let stem = conv(&mut text, "x", 3, 64, 7, 2, true)?;
    text.push_str(&format!("%pool = pool2d(%{stem}) kind=max layout={layout} window=[3, 3] stride=[2, 2] padding=[1, 1, 1, 1] dilation=[1, 1] count_include_pad=false\n"));
    let mut x = "pool".to_string();
    let mut c = 64;
    let (blocks, expansion) = if bottleneck {
        ([3, 4, 6, 3], 4)
    } else {
        ([2, 2, 2, 2], 1)
    };
    for (stage, width) in [64, 128, 256, 512].into_iter().enumerate() {
        let co = width * expansion;
        for block in 0..blocks[stage] {
            let s = if stage > 0 && block == 0 { 2 } else { 1 };
            let last = if bottleneck {
                let a = conv(&mut text, &x, c, width, 1, 1, true)?;
                let b = conv(&mut text, &a, width, width, 3, s, true)?;
                conv(&mut text, &b, width, co, 1, 1, false)?
            } else {
                let a = conv(&mut text, &x, c, co, 3, s, true)?;
                conv(&mut text, &a, co, co, 3, 1, false)?
            };
            let skip = if s == 2 || c != co {
                conv(&mut text, &x, c, co, 1, s, false)?
            } else {
                x.clone()
            };
            let y = format!("s{stage}b{block}");
            text.push_str(&format!(
                "%{y}s = add(%{last}, %{skip})\n%{y} = relu(%{y}s)\n"
            ));
            x = y;
            c = co;
        }
    }
    text.push_str(&format!(
        "%gap = reduce_mean(%{x}) axes={gap_axes:?}\n%fc = input() name=\"fc\" : f32[{c}, 1000]\n%fcb = input() name=\"fcb\" : f32[1000]\n%l = matmul(%gap, %fc)\n%logits = add(%l, %fcb)\noutput \"logits\" = %logits\n"
    ));
    frozen.push((
        "fc".to_string(),
        randn(&[c, 1000], (1.0f32 / c as f32).sqrt())?,
    ));
    frozen.push(("fcb".to_string(), randn(&[1000], 0.1)?));
    Ok((text, frozen))
}

/// W6a (depthwise-separable block, fused and unfused), W6b (the standard 3x3 convolution of the
/// same shape) and W7 (conv + batchnorm + ReLU against the bare convolution), NCHW f32.
fn conv_workloads(
    cache: &std::path::Path,
    runs: usize,
    quick: bool,
    as_json: bool,
    only: &[String],
    roof: Option<Roof>,
) -> Result<serde_json::Value> {
    let cx = kfuse::Context::new();
    cx.set_seed(11);
    let randn = |dims: &[usize], scale: f32| -> Result<Array> {
        Ok((cx.randn(kfuse::DType::F32, dims) * f64::from(scale)).to_array()?)
    };
    let (n, hw6, hw7) = if quick { (1, 28, 14) } else { (8, 112, 56) };
    let conv = |x: &str, w: &str, out: &str, groups: usize, pad: usize| {
        format!("%{out} = conv2d(%{x}, %{w}) layout=nchw stride=[1, 1] padding=[{pad}, {pad}, {pad}, {pad}] dilation=[1, 1] groups={groups}\n")
    };
    let input =
        |name: &str, dims: &[usize]| format!("%{name} = input() name=\"{name}\" : f32{dims:?}\n");
    let mut rows = Vec::new();
    let wanted = |id: &str| only.is_empty() || only.iter().any(|o| o == id);
    if wanted("W6a") || wanted("W6b") {
        let x = input("x", &[n, 64, hw6, hw6]);
        let block = x.clone()
            + &input("wd", &[64, 1, 3, 3])
            + &input("wp", &[128, 64, 1, 1])
            + &conv("x", "wd", "d", 64, 1)
            + &conv("d", "wp", "y", 1, 0)
            + "output \"y\" = %y\n";
        let frozen = vec![
            ("wd".to_string(), randn(&[64, 1, 3, 3], 0.3)?),
            ("wp".to_string(), randn(&[128, 64, 1, 1], 0.1)?),
        ];
        let cost = kfuse::FusePolicy::Cost;
        let standard =
            x + &input("w", &[128, 64, 3, 3]) + &conv("x", "w", "y", 1, 1) + "output \"y\" = %y\n";
        let frozen6b = vec![("w".to_string(), randn(&[128, 64, 3, 3], 0.05)?)];
        let cases = [
            prepare(&block, &frozen, cost, cache)?,
            prepare(&block, &frozen, kfuse::FusePolicy::None, cache)?,
            prepare(&standard, &frozen6b, cost, cache)?,
        ];
        let ms = interleaved_ms(&cases, runs)?;
        let (fused, unfused, w6b) = (ms[0], ms[1], ms[2]);
        let floors = roof.map(|r| r.separable_floors(n, 64, 128, hw6));
        // W6b: the direct convolution's multiply-adds (Winograd does fewer, so this share can
        // pass 100%), its input read and output written once.
        let pixels = (n * hw6 * hw6) as f64;
        let w6b_flops = 2.0 * pixels * (128 * 64 * 9) as f64;
        let w6b_floor = roof.map(|r| r.floor_ms(w6b_flops, 4.0 * pixels * (64 + 128) as f64));
        if !as_json {
            println!(
                "W6a: fused {fused:.2} ms, unfused {unfused:.2} ms ({:.2}x); W6b standard 3x3: {w6b:.2} ms ({:.2}x the fused W6a)",
                unfused / fused,
                w6b / fused
            );
            if let (Some((fused_floor, unfused_floor)), Some(w6b_floor)) = (floors, w6b_floor) {
                println!(
                    "  at the rooflines W6a fused takes at least {fused_floor:.2} ms, unfused {unfused_floor:.2} ms \
                     ({:.2}x at best), measured at {:.0}% and {:.0}% of those floors; \
                     W6b {:.0} GFLOP/s as direct arithmetic, {:.0}% of the FMA peak",
                    unfused_floor / fused_floor,
                    100.0 * fused_floor / fused,
                    100.0 * unfused_floor / unfused,
                    w6b_flops / w6b / 1e6,
                    100.0 * w6b_floor / w6b
                );
            }
        }
        let w6a_error = checked_against_reference("W6a", &cases[0], &block, &frozen)?;
        let w6b_error = checked_against_reference("W6b", &cases[2], &standard, &frozen6b)?;
        if !as_json {
            println!(
                "W6a: within {w6a_error:.1e}, W6b within {w6b_error:.1e} of the reference interpreter's results"
            );
        }
        rows.push(json!({
            "id": "W6a",
            "ms": fused,
            "unfused_ms": unfused,
            "speedup": unfused / fused,
            "floor_ms": floors.map(|f| f.0),
            "unfused_floor_ms": floors.map(|f| f.1),
            "max_rel_error": w6a_error,
        }));
        rows.push(
            json!({"id": "W6b", "ms": w6b, "ratio_to_w6a": w6b / fused, "floor_ms": w6b_floor, "max_rel_error": w6b_error}),
        );
    }
    if wanted("mobilenet") {
        // W6a's shape as MobileNet runs it, batchnorms folded: each half with its own
        // per-channel bias and ReLU.
        let block = input("x", &[n, 64, hw6, hw6])
            + &input("wd", &[64, 1, 3, 3])
            + &input("bd", &[64, 1, 1])
            + &input("wp", &[128, 64, 1, 1])
            + &input("b", &[128, 1, 1])
            + &conv("x", "wd", "d", 64, 1)
            + "%e = add(%d, %bd)\n%a = relu(%e)\n"
            + &conv("a", "wp", "p", 1, 0)
            + "%s = add(%p, %b)\n%y = relu(%s)\noutput \"y\" = %y\n";
        let frozen = vec![
            ("wd".to_string(), randn(&[64, 1, 3, 3], 0.3)?),
            ("bd".to_string(), randn(&[64, 1, 1], 0.1)?),
            ("wp".to_string(), randn(&[128, 64, 1, 1], 0.1)?),
            ("b".to_string(), randn(&[128, 1, 1], 0.1)?),
        ];
        rows.push(fused_against_unfused(
            "mobilenet",
            "W6a with bias + ReLU after each half",
            &block,
            &frozen,
            (cache, runs, as_json),
        )?);
    }
    // A MobileNetV2 inverted residual: `c` channels expanded to `e`, depthwise, projected back
    // to `c`, bias and ReLU6 after the first two, bias and the skip connection after the last.
    // With `silu`, EfficientNet's MBConv: SiLU (`mul(x, sigmoid(x))`) in place of ReLU6; with
    // `hardswish`, MobileNetV3's block: `x * relu6(x + 3) / 6`.
    let inverted = |id: &str, n: usize, c: usize, e: usize, hw: usize, act: &str| -> Result<_> {
        let relu6 = |v: &str, out: &str| match act {
            "silu" => format!("%{out}s = sigmoid(%{v})\n%{out} = mul(%{v}, %{out}s)\n"),
            "hardswish" => format!(
                "%{out}a = add(%{v}, %three)\n%{out}c = clamp(%{out}a, %lo, %hi)\n\
                 %{out}m = mul(%{v}, %{out}c)\n%{out} = div(%{out}m, %hi)\n"
            ),
            _ => format!("%{out} = clamp(%{v}, %lo, %hi)\n"),
        };
        let block = input("x", &[n, c, hw, hw])
            + &input("we", &[e, c, 1, 1])
            + &input("be", &[e, 1, 1])
            + &input("wd", &[e, 1, 3, 3])
            + &input("bd", &[e, 1, 1])
            + &input("wp", &[c, e, 1, 1])
            + &input("bp", &[c, 1, 1])
            + "%lo = constant() value=[0.0] : f32[]\n%hi = constant() value=[6.0] : f32[]\n"
            + "%three = constant() value=[3.0] : f32[]\n"
            + &conv("x", "we", "x1", 1, 0)
            + "%x2 = add(%x1, %be)\n"
            + &relu6("x2", "x3")
            + &conv("x3", "wd", "d1", e, 1)
            + "%d2 = add(%d1, %bd)\n"
            + &relu6("d2", "d3")
            + &conv("d3", "wp", "p1", 1, 0)
            + "%p2 = add(%p1, %bp)\n%y = add(%p2, %x)\noutput \"y\" = %y\n";
        let frozen = vec![
            ("we".to_string(), randn(&[e, c, 1, 1], 0.2)?),
            ("be".to_string(), randn(&[e, 1, 1], 0.1)?),
            ("wd".to_string(), randn(&[e, 1, 3, 3], 0.3)?),
            ("bd".to_string(), randn(&[e, 1, 1], 0.1)?),
            ("wp".to_string(), randn(&[c, e, 1, 1], 0.1)?),
            ("bp".to_string(), randn(&[c, 1, 1], 0.1)?),
        ];
        let what = match act {
            "silu" => "EfficientNet MBConv block (SiLU)",
            "hardswish" => "MobileNetV3 block (hard-swish)",
            _ => "MobileNetV2 block",
        };
        fused_against_unfused(
            id,
            &format!("{what}, {n}x{c}x{hw}x{hw}, expanded to {e}"),
            &block,
            &frozen,
            (cache, runs, as_json),
        )
    };
    if wanted("inverted") {
        // At 56×56: 24 channels expanded to 144.
        rows.push(inverted(
            "inverted",
            n,
            24,
            144,
            if quick { 14 } else { 56 },
            "relu6",
        )?);
    }
    if wanted("mbconv") {
        // The same shape with SiLU: one structured kernel since SiLU is an activation.
        rows.push(inverted(
            "mbconv",
            n,
            24,
            144,
            if quick { 14 } else { 56 },
            "silu",
        )?);
    }
    if wanted("mbv3") {
        // MobileNetV3-Large's fourth stage: 80 channels at 14×14 expanded to 240, hard-swish.
        rows.push(inverted("mbv3", n, 80, 240, 14, "hardswish")?);
    }
    if wanted("inverted7") {
        // The last stage at batch 1: 160 channels at 7×7, expanded to 960.
        rows.push(inverted(
            "inverted7",
            1,
            160,
            if quick { 240 } else { 960 },
            7,
            "relu6",
        )?);
    }
    // ResNet-18's basic blocks, batchnorm folded into the weights and biases: the
    // down-sampling one (3×3 stride 2 and 3×3 on the main path, a 1×1 stride-2 shortcut), and
    // the last stage's at batch 1 (512 channels at 7×7, latency inference).
    let resnet = |id: &str,
                  n: usize,
                  c: usize,
                  hw: usize,
                  down: bool|
     -> Result<serde_json::Value> {
        let (co, s) = if down { (2 * c, 2) } else { (c, 1) };
        let strided = |x: &str, w: &str, out: &str, k: usize| {
            let p = k / 2;
            format!("%{out} = conv2d(%{x}, %{w}) layout=nchw stride=[{s}, {s}] padding=[{p}, {p}, {p}, {p}] dilation=[1, 1] groups=1\n")
        };
        let mut block = input("x", &[n, c, hw, hw])
            + &input("w1", &[co, c, 3, 3])
            + &input("k1", &[co, 1, 1])
            + &input("w2", &[co, co, 3, 3])
            + &input("k2", &[co, 1, 1])
            + &strided("x", "w1", "c1", 3)
            + "%b1 = add(%c1, %k1)\n%r1 = relu(%b1)\n"
            + &conv("r1", "w2", "c2", 1, 1)
            + "%b2 = add(%c2, %k2)\n";
        let mut frozen = vec![
            ("w1".to_string(), randn(&[co, c, 3, 3], 0.05)?),
            ("k1".to_string(), randn(&[co, 1, 1], 0.1)?),
            ("w2".to_string(), randn(&[co, co, 3, 3], 0.05)?),
            ("k2".to_string(), randn(&[co, 1, 1], 0.1)?),
        ];
        let skip = if down {
            block += &(input("ws", &[co, c, 1, 1])
                + &input("ks", &[co, 1, 1])
                + &strided("x", "ws", "s1", 1)
                + "%s2 = add(%s1, %ks)\n");
            frozen.push(("ws".to_string(), randn(&[co, c, 1, 1], 0.1)?));
            frozen.push(("ks".to_string(), randn(&[co, 1, 1], 0.1)?));
            "%s2"
        } else {
            "%x"
        };
        block += &format!("%a = add(%b2, {skip})\n%y = relu(%a)\noutput \"y\" = %y\n");
        let what = if down {
            format!("ResNet basic block, down-sampling, {n}x{c}x{hw}x{hw} -> {co}")
        } else {
            format!("ResNet basic block, {n}x{c}x{hw}x{hw}")
        };
        fused_against_unfused(id, &what, &block, &frozen, (cache, runs, as_json))
    };
    if wanted("resnet") {
        rows.push(resnet("resnet", n, 64, if quick { 28 } else { 56 }, true)?);
    }
    if wanted("resnet7") {
        rows.push(resnet(
            "resnet7",
            1,
            if quick { 128 } else { 512 },
            7,
            false,
        )?);
    }
    for (id, name, bottleneck, nhwc) in [
        ("resnet18", "ResNet-18", false, false),
        ("resnet50", "ResNet-50", true, false),
        ("resnet18-nhwc", "ResNet-18 in NHWC", false, true),
    ] {
        if !wanted(id) {
            continue;
        }
        // Quick: 96×96, so that the first stage still runs 24-wide rows (the Winograd kernel).
        let hw = if quick { 96 } else { 224 };
        let (program, frozen) = resnet_network(n, hw, bottleneck, nhwc, &randn)?;
        let what = format!("{name} inference, {n}x3x{hw}x{hw}");
        let mut row = if nhwc {
            // The layout assignment (the network run in NCHW) against the network as written.
            let options = |keep_layouts| kfuse::Options {
                cache_dir: cache.to_path_buf(),
                keep_layouts,
                ..kfuse::Options::default()
            };
            let cases = [
                prepare_with(&program, &frozen, &options(false))?,
                prepare_with(&program, &frozen, &options(true))?,
            ];
            let ms = interleaved_ms(&cases, runs)?;
            if !as_json {
                println!(
                    "{id} ({what}): run in NCHW {:.2} ms, as written {:.2} ms ({:.2}x)",
                    ms[0],
                    ms[1],
                    ms[1] / ms[0]
                );
            }
            let nchw = cases[0]
                .exe
                .passes
                .iter()
                .any(|p| p.starts_with("conv-layout: NCHW for"));
            json!({"id": id, "ms": ms[0], "as_written_ms": ms[1], "speedup": ms[1] / ms[0], "run_in_nchw": nchw})
        } else {
            fused_against_unfused(id, &what, &program, &frozen, (cache, runs, as_json))?
        };
        // The whole network against the reference interpreter, once.
        let case = prepare(&program, &frozen, kfuse::FusePolicy::Cost, cache)?;
        let (got, _) = case.exe.run(&case.inputs, &CustomOps::new())?;
        let graph = kfuse::opt::freeze(&kfuse::parse(&program)?, &frozen)?;
        let want = kfuse::run_graph(&graph, &case.inputs, &CustomOps::new())?;
        let error = relative_error(&got[0].1, &want[0].1);
        if error > 1e-3 {
            bail!("{id}: logits off the reference interpreter's by {error:e}");
        }
        if !as_json {
            println!("{id}: logits within {error:.1e} of the reference interpreter's (relative to the largest)");
        }
        row["max_rel_error"] = json!(error);
        rows.push(row);
    }
    if wanted("W7") {
        let c = 64;
        let base =
            input("x", &[n, c, hw7, hw7]) + &input("w", &[c, c, 3, 3]) + &conv("x", "w", "c", 1, 1);
        let bare = base.clone() + "output \"y\" = %c\n";
        let bn = base
            + &input("mean", &[c, 1, 1])
            + &input("var", &[c, 1, 1])
            + &input("gamma", &[c, 1, 1])
            + &input("beta", &[c, 1, 1])
            + "%eps = constant() value=[1e-5] : f32[]\n%n = sub(%c, %mean)\n%ve = add(%var, %eps)\n%sd = sqrt(%ve)\n%q = div(%n, %sd)\n%g = mul(%q, %gamma)\n%b = add(%g, %beta)\n%y = relu(%b)\noutput \"y\" = %y\n";
        let weights = ("w".to_string(), randn(&[c, c, 3, 3], 0.05)?);
        let var = (cx.randn(kfuse::DType::F32, &[c, 1, 1]).abs() + 0.5).to_array()?;
        let frozen = vec![
            weights.clone(),
            ("mean".to_string(), randn(&[c, 1, 1], 0.1)?),
            ("var".to_string(), var),
            ("gamma".to_string(), randn(&[c, 1, 1], 1.0)?),
            ("beta".to_string(), randn(&[c, 1, 1], 0.1)?),
        ];
        let cost = kfuse::FusePolicy::Cost;
        let cases = [
            prepare(&bare, &[weights], cost, cache)?,
            prepare(&bn, &frozen, cost, cache)?,
        ];
        let ms = interleaved_ms(&cases, runs)?;
        let (bare_ms, w7) = (ms[0], ms[1]);
        // The direct convolution's multiply-adds (Winograd does fewer, so this share can pass
        // 100%), its input read and output written once.
        let pixels = (n * hw7 * hw7) as f64;
        let flops = 2.0 * pixels * (c * c * 9) as f64;
        let floor = roof.map(|r| r.floor_ms(flops, 8.0 * pixels * c as f64));
        if !as_json {
            println!(
                "W7: conv + batchnorm + relu {w7:.2} ms, bare conv {bare_ms:.2} ms, ratio {:.3}{}",
                w7 / bare_ms,
                floor.map_or(String::new(), |f| format!(
                    "; {:.0} GFLOP/s as direct arithmetic, {:.0}% of the FMA peak",
                    flops / w7 / 1e6,
                    100.0 * f / w7
                ))
            );
        }
        let error = checked_against_reference("W7", &cases[1], &bn, &frozen)?;
        if !as_json {
            println!("W7: within {error:.1e} of the reference interpreter's result");
        }
        rows.push(json!({"id": "W7", "ms": w7, "bare_conv_ms": bare_ms, "ratio": w7 / bare_ms, "floor_ms": floor, "max_rel_error": error}));
    }
    Ok(json!(rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fused_workload_is_a_name_the_bench_takes() {
        for w in workloads(16) {
            assert!(
                WORKLOAD_IDS.contains(&w.id),
                "{} is not in WORKLOAD_IDS",
                w.id
            );
        }
        assert!(check_workload_names(&["W1".into(), "resnet18-nhwc".into()]).is_ok());
        let err = check_workload_names(&["W1".into(), "W9".into(), "w1".into()]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("unknown workloads `W9`, `w1`: kfuse bench takes W0, W1, W2a"),
            "{err}"
        );
    }

    fn array(values: Vec<f64>) -> Array {
        Array::from_vec(vec![values.len()], values).unwrap()
    }

    /// The floors are the slower of arithmetic and memory at the limits: W6a's shape on a
    /// machine of 500 GFLOP/s and 50 GB/s is bound by arithmetic fused (3.5 ms for 1.76 GFLOP)
    /// and, unfused, its depthwise half by memory (51 MB in 1.03 ms) and its pointwise half by
    /// arithmetic (3.29 ms).
    #[test]
    fn roofline_floors_take_the_slower_limit() {
        let roof = Roof {
            gflop_per_s: 500.0,
            gb_per_s: 50.0,
        };
        assert_eq!(roof.floor_ms(1e9, 1e6), 2.0);
        assert_eq!(roof.floor_ms(1e6, 1e9), 20.0);
        let (fused, unfused) = roof.separable_floors(8, 64, 128, 112);
        let pixels = 8.0 * 112.0 * 112.0;
        let (depthwise, pointwise) = (pixels * 64.0 * 18.0, pixels * 64.0 * 128.0 * 2.0);
        assert!(
            (fused - (depthwise + pointwise) / 500e6).abs() < 1e-9,
            "{fused}"
        );
        let memory = pixels * 4.0 * 128.0 / 50e6;
        let want = memory + pointwise / 500e6;
        assert!((unfused - want).abs() < 1e-9, "{unfused} against {want}");
        assert!(
            (1.2..1.25).contains(&(unfused / fused)),
            "{}",
            unfused / fused
        );
    }

    #[test]
    fn relative_error_sees_nans_and_infinities() {
        let want = array(vec![1.0, -4.0, f64::NAN, f64::INFINITY]);
        let close = array(vec![1.0, -3.0, f64::NAN, f64::INFINITY]);
        assert_eq!(relative_error(&close, &want), 0.25);
        for (i, bad) in [f64::NAN, f64::INFINITY, 0.0].into_iter().enumerate() {
            let mut values = vec![1.0, -4.0, f64::NAN, f64::INFINITY];
            values[if i == 2 { 3 } else { 0 }] = bad;
            assert_eq!(
                relative_error(&array(values), &want),
                f64::INFINITY,
                "{bad}"
            );
        }
        assert_eq!(relative_error(&array(vec![1.0]), &want), f64::INFINITY);
    }
}
