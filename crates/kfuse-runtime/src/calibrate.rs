//! Measuring the cost model's coefficients on this machine.
//!
//! Three numbers, measured with kfuse's own compiled kernels so that they describe what kfuse
//! actually runs: memory bandwidth (a streaming kernel over 64 MB), seconds per unit of op weight
//! (a chain of `exp` over data that stays in L2), and the fixed cost of a kernel launch (a
//! one-element kernel). They are cached in the kernel cache directory, keyed by CPU model and
//! thread count, so calibration runs once per machine. A calibration measured while the
//! machine was busy would be wrong for as long as it is cached, so each use spot-checks the
//! cached bandwidth and arithmetic rate (a few milliseconds), and measures everything again
//! where the machine is now clearly faster than the cache says.

use std::path::Path;
use std::time::Instant;

use kfuse_cpu::{Numerics, Pool};
use kfuse_fusion::{cost::op_weight, FixedCostModel, FusePolicy, KernelLimits};
use kfuse_interp::CustomOps;
use kfuse_ir::text::parse_graph;
use kfuse_ir::{Array, Op, UnaryOp};

use crate::{compile_with, Backend, Options};

fn median_seconds(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    t[runs / 2]
}

/// Median seconds of one run of `program` (which has one f32 input `x` of `n` elements).
fn time_program(program: &str, n: usize, cache_dir: &Path, runs: usize) -> Result<f64, String> {
    let graph = parse_graph(program).map_err(|e| e.to_string())?;
    let options = Options {
        policy: FusePolicy::Cost,
        numerics: Numerics::Fast,
        backend: Backend::Auto,
        cache_dir: cache_dir.to_path_buf(),
        graph_passes: true,
        keep_layouts: false,
    };
    let exe =
        compile_with(&graph, &options, &FixedCostModel::default()).map_err(|e| e.to_string())?;
    if exe
        .tiers
        .iter()
        .flatten()
        .any(|t| !matches!(t, crate::Tier::Compiled { .. }))
    {
        return Err("calibration needs the C compiler".into());
    }
    let x = Array::from_vec(
        vec![n],
        (0..n)
            .map(|i| (i % 1000) as f32 * 1e-3)
            .collect::<Vec<f32>>(),
    )
    .map_err(|e| e.to_string())?;
    let inputs = [("x".to_string(), x)];
    let mut runner = exe.runner();
    let mut failed = None;
    let t = median_seconds(runs, || {
        if let Err(e) = runner.run(&inputs, &CustomOps::new()) {
            failed = Some(e.to_string());
        }
    });
    failed.map_or(Ok(t), Err)
}

/// Measures the coefficients (about a second).
pub fn calibrate(cache_dir: &Path) -> Result<FixedCostModel, String> {
    let big = 16 << 20;
    let copy = time_program(
        &format!("%x = input() name=\"x\" : f32[{big}]\n%y = neg(%x)\noutput \"y\" = %y\n"),
        big,
        cache_dir,
        5,
    )?;
    let bytes_per_second = 8.0 * big as f64 / copy;
    let small = 64 << 10;
    let chain = 8;
    let mut program = format!("%x = input() name=\"x\" : f32[{small}]\n%v0 = exp(%x)\n");
    for k in 1..chain {
        program.push_str(&format!("%v{k} = exp(%v{})\n", k - 1));
    }
    program.push_str(&format!("output \"y\" = %v{}\n", chain - 1));
    let compute = time_program(&program, small, cache_dir, 21)?;
    let weight = op_weight(&Op::Unary(UnaryOp::Exp)) * chain as f64 * small as f64;
    let launch = time_program(
        "%x = input() name=\"x\" : f32[1]\n%y = neg(%x)\noutput \"y\" = %y\n",
        1,
        cache_dir,
        51,
    )?;
    Ok(FixedCostModel {
        bytes_per_second,
        seconds_per_weight: (compute / weight).max(1e-13),
        kernel_seconds: launch.max(1e-7),
        limits: KernelLimits::default(),
    })
}

/// How much faster than its cached coefficients a spot check may find the machine before the
/// cache is taken for one measured under load and measured again. Timings on a shared host
/// drift by up to 2x (docs/benchmarks.md, "W0: machine limits"), so only a clear gap counts.
const STALE_FACTOR: f64 = 1.5;

/// A quick measure of bandwidth and arithmetic rate: `(bytes_per_second, seconds_per_weight)`,
/// from smaller runs of the kernels [`calibrate`] times.
fn spot_check(cache_dir: &Path) -> Result<(f64, f64), String> {
    let n = 4 << 20;
    let copy = time_program(
        &format!("%x = input() name=\"x\" : f32[{n}]\n%y = neg(%x)\noutput \"y\" = %y\n"),
        n,
        cache_dir,
        3,
    )?;
    let small = 16 << 10;
    let program = format!(
        "%x = input() name=\"x\" : f32[{small}]\n%a = exp(%x)\n%b = exp(%a)\noutput \"y\" = %b\n"
    );
    let compute = time_program(&program, small, cache_dir, 5)?;
    let weight = op_weight(&Op::Unary(UnaryOp::Exp)) * 2.0 * small as f64;
    Ok((8.0 * n as f64 / copy, compute / weight))
}

/// Whether a spot check's `(bytes_per_second, seconds_per_weight)` finds the machine clearly
/// faster than `cached` says.
fn stale(cached: &FixedCostModel, (bandwidth, per_weight): (f64, f64)) -> bool {
    bandwidth > STALE_FACTOR * cached.bytes_per_second
        || per_weight * STALE_FACTOR < cached.seconds_per_weight
}

/// The cache's key for this machine: the CPU model and the thread count.
fn calibration_key() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.to_string())
        })
        .unwrap_or_default();
    format!("{cpu} / {} threads", Pool::global().threads())
}

/// The calibration cached in `path` under `key`, if there is one.
fn cached_model(path: &Path, key: &str) -> Option<FixedCostModel> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    if lines.next() != Some(key) {
        return None;
    }
    let numbers: Vec<f64> = lines
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect();
    match numbers[..] {
        [b, w, k] if [b, w, k].iter().all(|v| v.is_finite() && *v > 0.0) => Some(FixedCostModel {
            bytes_per_second: b,
            seconds_per_weight: w,
            kernel_seconds: k,
            limits: KernelLimits::default(),
        }),
        _ => None,
    }
}

/// The calibrated model for this machine: from the cache where a spot check agrees with it,
/// else measured and cached.
pub fn calibrated_cost_model(cache_dir: &Path) -> Result<FixedCostModel, String> {
    let key = calibration_key();
    let path = cache_dir.join("calibration-v1.txt");
    if let Some(model) = cached_model(&path, &key) {
        if !stale(&model, spot_check(cache_dir)?) {
            return Ok(model);
        }
    }
    let model = calibrate(cache_dir)?;
    let text = format!(
        "{key}\nbytes_per_second {}\nseconds_per_weight {}\nkernel_seconds {}\n",
        model.bytes_per_second, model.seconds_per_weight, model.kernel_seconds
    );
    // Written under a unique name and renamed, so a concurrent reader sees the old file or the
    // new one, never half of one.
    let tmp = cache_dir.join(format!("calibration-v1.{}.tmp", std::process::id()));
    if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, &path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    Ok(model)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A calibration cached while the machine was busy (here: absurdly slow coefficients) is
    /// measured again and replaced; one the machine cannot beat is kept as it is.
    #[test]
    fn a_calibration_the_machine_clearly_beats_is_measured_again() {
        let dir = std::env::temp_dir().join(format!("kfuse-calibration-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        if let Err(e) = kfuse_cpu::Compiler::detect(dir.clone()) {
            kfuse_testkit::skip(
                "a_calibration_the_machine_clearly_beats_is_measured_again",
                kfuse_testkit::Prerequisite::CCompiler,
                &e,
            );
            return;
        }
        let path = dir.join("calibration-v1.txt");
        let write = |b: f64, w: f64, k: f64| {
            let text = format!(
                "{}\nbytes_per_second {b}\nseconds_per_weight {w}\nkernel_seconds {k}\n",
                calibration_key()
            );
            std::fs::write(&path, text).unwrap();
        };
        write(1e3, 1.0, 1.0);
        let model = calibrated_cost_model(&dir).unwrap();
        assert!(model.bytes_per_second > 1e6, "{model:?}");
        assert!(model.seconds_per_weight < 1e-3, "{model:?}");
        assert_eq!(cached_model(&path, &calibration_key()), Some(model.clone()));
        write(1e15, 1e-15, 1e-7);
        let kept = calibrated_cost_model(&dir).unwrap();
        assert_eq!(kept.bytes_per_second, 1e15);
        assert_eq!(kept.seconds_per_weight, 1e-15);
        // A damaged file is measured again too.
        std::fs::write(
            &path,
            format!("{}\nbytes_per_second nan\n", calibration_key()),
        )
        .unwrap();
        assert!(calibrated_cost_model(&dir).unwrap().bytes_per_second > 1e6);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
