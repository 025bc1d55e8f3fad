//! Measuring the cost model's coefficients on this machine.
//!
//! Three numbers, measured with kfuse's own compiled kernels so that they describe what kfuse
//! actually runs: memory bandwidth (a streaming kernel over 64 MB), seconds per unit of op weight
//! (a chain of `exp` over data that stays in L2), and the fixed cost of a kernel launch (a
//! one-element kernel). They are cached in the kernel cache directory, keyed by CPU model and
//! thread count, so calibration runs once per machine.

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

/// The calibrated model for this machine: from the cache, or measured and cached.
pub fn calibrated_cost_model(cache_dir: &Path) -> Result<FixedCostModel, String> {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.to_string())
        })
        .unwrap_or_default();
    let key = format!("{cpu} / {} threads", Pool::global().threads());
    let path = cache_dir.join("calibration-v1.txt");
    if let Ok(text) = std::fs::read_to_string(&path) {
        let mut lines = text.lines();
        if lines.next() == Some(key.as_str()) {
            let numbers: Vec<f64> = lines
                .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
                .collect();
            if let [b, w, k] = numbers[..] {
                return Ok(FixedCostModel {
                    bytes_per_second: b,
                    seconds_per_weight: w,
                    kernel_seconds: k,
                    limits: KernelLimits::default(),
                });
            }
        }
    }
    let model = calibrate(cache_dir)?;
    let text = format!(
        "{key}\nbytes_per_second {}\nseconds_per_weight {}\nkernel_seconds {}\n",
        model.bytes_per_second, model.seconds_per_weight, model.kernel_seconds
    );
    let _ = std::fs::create_dir_all(cache_dir);
    let _ = std::fs::write(&path, text);
    Ok(model)
}
