//! The `kfuse` command-line tool.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context as _, Result};
use clap::{Parser, Subcommand};
use kfuse::{Array, CustomOps, Graph};

/// Large tensors aligned to cache lines (see `kfuse_runtime::CacheAligned`).
#[global_allocator]
static ALLOC: kfuse::CacheAligned = kfuse::CacheAligned;

mod bench;
mod demo;
mod explain;
mod mem;
mod peak;

#[derive(Parser)]
#[command(
    name = "kfuse",
    version,
    about = "kfuse: a tensor compiler and runtime"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// How `kfuse run` executes a program.
#[derive(clap::Args)]
struct EngineArgs {
    /// `compiled`: fused kernels (compiled C, or the tile interpreter where C is unavailable);
    /// `reference`: the reference interpreter, op by op.
    #[arg(long, value_parser = ["compiled", "reference"], default_value = "compiled")]
    engine: String,
    /// Fusion policy for the compiled engine.
    #[arg(long, value_parser = ["none", "greedy", "cost"], default_value = "cost")]
    fuse: String,
    /// `strict`: bit-identical to the reference interpreter; `fast`: FMA contraction and
    /// reassociation allowed.
    #[arg(long, value_parser = ["strict", "fast"], default_value = "fast")]
    numerics: String,
    /// Run fused kernels on the tile interpreter even where a C compiler exists.
    #[arg(long)]
    no_cc: bool,
    /// `calibrated`: coefficients measured on this machine (once, then cached); `fixed`: the
    /// reference machine's, for reproducible partitions.
    #[arg(long, value_parser = ["calibrated", "fixed"], default_value = "calibrated")]
    cost_model: String,
    /// Write a Chrome trace (chrome://tracing, Perfetto) of the run to FILE, and print each
    /// step's time and traffic.
    #[arg(long, value_name = "FILE")]
    profile: Option<PathBuf>,
    /// Run convolutions and poolings in the layout the program gives them, where the fast
    /// numerics' layout assignment would run NHWC ones in NCHW.
    #[arg(long)]
    keep_layouts: bool,
}

impl EngineArgs {
    fn options(&self) -> kfuse::Options {
        kfuse::Options {
            policy: kfuse::FusePolicy::from_name(&self.fuse).expect("clap checked the policy"),
            numerics: if self.numerics == "strict" {
                kfuse::Numerics::Strict
            } else {
                kfuse::Numerics::Fast
            },
            backend: if self.no_cc {
                kfuse::Backend::Tile
            } else {
                kfuse::Backend::Auto
            },
            keep_layouts: self.keep_layouts,
            ..kfuse::Options::default()
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run a .kf program on .npy/.npz inputs and write one NAME.npy per output.
    Run {
        /// The program, in the .kf text form.
        program: PathBuf,
        /// An input binding NAME=FILE.npy (repeatable).
        #[arg(long = "input", value_name = "NAME=FILE.npy")]
        inputs: Vec<String>,
        /// An .npz archive whose arrays bind inputs by name (repeatable).
        #[arg(long = "inputs-npz", value_name = "FILE.npz")]
        npz: Vec<PathBuf>,
        /// An .npz archive whose arrays become constants of the program, for the inputs of
        /// their names (repeatable): a model's weights. Constants fold (a batchnorm into its
        /// convolution) and their packed forms are kept between runs.
        #[arg(long = "constants", value_name = "FILE.npz")]
        constants: Vec<PathBuf>,
        /// Run the program this many times on the same inputs (buffers kept between runs) and
        /// print the median and fastest run; the outputs are the last run's.
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        runs: u32,
        /// Where to write the outputs (created if missing).
        #[arg(long, value_name = "DIR")]
        output_dir: PathBuf,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Run the benchmark workloads W0-W7: machine limits, fused versus unfused and peer-free
    /// baselines.
    Bench {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Sixteen times smaller sizes and fewer runs (a smoke test, not a measurement).
        #[arg(long)]
        quick: bool,
        /// Only these workloads (W0, W1, W2a, W2b, W3, W4a, W4b, W5a, W5b, W6a, W6b, W7) and
        /// extra cases (cost: the cost model's partial fusion; transpose: a fused transpose;
        /// activations: each GEMM epilogue activation against the bias alone; mobilenet: W6a
        /// with a bias and ReLU after each half, fused against unfused; inverted: a MobileNetV2
        /// inverted residual at 56×56, fused against unfused; inverted7: one of its last stage,
        /// 7×7 at batch 1; mbconv: EfficientNet's MBConv block, the inverted residual with SiLU;
        /// mbv3: MobileNetV3's block with hard-swish, 80 channels at 14×14 expanded to 240;
        /// resnet: ResNet-18's down-sampling basic block, 64 channels at 56×56 to 128 at 28×28;
        /// resnet7: its last stage's block at batch 1, 512 channels at 7×7; resnet18: the
        /// whole network for inference, 8 images of 224×224, checked against the reference
        /// interpreter; resnet50: ResNet-50 likewise (bottleneck blocks); resnet18-nhwc:
        /// ResNet-18 in NHWC, run in NCHW (layout assignment) against as written; cast: a dense layer
        /// stored in bf16, the cast in the GEMM's epilogue).
        #[arg(value_name = "ID")]
        only: Vec<String>,
    },
    /// Show how a program is cut into kernels: the ops in each, bytes moved fused versus
    /// unfused, and the reason for every boundary.
    Explain {
        /// The program, in the .kf text form.
        program: PathBuf,
        /// Fusion policy.
        #[arg(long, value_parser = ["none", "greedy", "cost"], default_value = "cost")]
        fuse: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Cost model: `calibrated` (measured on this machine, cached) or `fixed`.
        #[arg(long, value_parser = ["calibrated", "fixed"], default_value = "calibrated")]
        cost_model: String,
        /// Write the input, the partition, every kernel's IR, its generated C and (with GCC) the
        /// compiler's report of which loops it vectorized into DIR.
        #[arg(long, value_name = "DIR")]
        dump: Option<PathBuf>,
        /// Keep convolutions and poolings in the program's layouts (as `run --keep-layouts`).
        #[arg(long)]
        keep_layouts: bool,
    },
    /// Verify a .kf program and print it with inferred types.
    Check {
        /// The program, in the .kf text form.
        program: PathBuf,
    },
    /// Print a .kf program joined with the reverse-mode gradient of one of its outputs.
    Grad {
        /// The program, in the .kf text form.
        program: PathBuf,
        /// The output to differentiate; it must be a scalar float.
        #[arg(long = "of", value_name = "LOSS")]
        loss: String,
        /// The inputs to differentiate with respect to, separated by commas.
        #[arg(long, value_name = "NAME,...", value_delimiter = ',', required = true)]
        wrt: Vec<String>,
    },
    /// Memory fusion: kernel KSM status, live view, governor, audit, and the dedup pool demo.
    Mem {
        #[command(subcommand)]
        command: mem::MemCommand,
    },
    /// Run a built-in program on built-in data and show what happened.
    Demo {
        /// Also write the demo's program and outputs into this directory.
        #[arg(long, value_name = "DIR")]
        output_dir: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    quit_quietly_on_closed_stdout();
    let cli = Cli::parse();
    // A thread count kfuse cannot use is refused before anything runs, not replaced silently.
    if let Err(e) = kfuse::routines::threads_from_env() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Run {
            program,
            inputs,
            npz,
            constants,
            runs,
            output_dir,
            engine,
        } => run(
            &program,
            Bindings {
                inputs: &inputs,
                npz: &npz,
                constants: &constants,
            },
            runs as usize,
            &output_dir,
            &engine,
        ),
        Command::Explain {
            program,
            fuse,
            json,
            cost_model,
            dump,
            keep_layouts,
        } => load_program(&program).and_then(|g| {
            let policy = kfuse::FusePolicy::from_name(&fuse).expect("clap checked the policy");
            let cost = cost_model_named(&cost_model);
            print!(
                "{}",
                explain::explain(&g, policy, &cost, json, dump.as_deref(), keep_layouts)?
            );
            Ok(())
        }),
        Command::Check { program } => check(&program),
        Command::Grad { program, loss, wrt } => grad(&program, &loss, &wrt),
        Command::Bench { json, quick, only } => bench::bench(json, quick, &only),
        Command::Demo { output_dir } => demo::demo(output_dir.as_deref()),
        Command::Mem { command } => mem::mem(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Lets a closed standard output end kfuse silently, as it ends other Unix tools: Rust starts
/// programs with SIGPIPE ignored, so a write to a closed pipe fails and `print!` turns the
/// failure into a panic ("failed printing to stdout"). With the default action restored,
/// `kfuse check big.kf | head -1` ends when `head` does, with no message. Loops that must clean
/// up before exiting (`kfuse mem govern`, `kfuse mem top`) ignore SIGPIPE again and stop on the
/// write error instead.
fn quit_quietly_on_closed_stdout() {
    // SAFETY: setting a signal's disposition to its default touches no memory of this program.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Reads and parses a program; parse errors carry `file:line:col`.
/// `kfuse grad`: the joint forward and backward program on standard output, with the loss and one
/// `grad_<input>` output per requested input.
fn grad(path: &Path, loss: &str, wrt: &[String]) -> Result<()> {
    let graph = load_program(path)?;
    let loss_value = graph
        .outputs()
        .iter()
        .find(|o| o.name == loss)
        .map(|o| o.value)
        .ok_or_else(|| anyhow::anyhow!("{} has no output called {loss:?}", path.display()))?;
    let mut wrt_values = Vec::with_capacity(wrt.len());
    for name in wrt {
        let (id, _, _) = graph
            .inputs()
            .find(|(_, n, _)| n == name)
            .ok_or_else(|| anyhow::anyhow!("{} has no input called {name:?}", path.display()))?;
        wrt_values.push(kfuse::Value::of(id));
    }
    let joint = kfuse::autodiff::grad(&graph, loss_value, &wrt_values)
        .with_context(|| format!("differentiating {loss:?} in {}", path.display()))?;
    print!("{}", kfuse::print_graph(&joint));
    Ok(())
}

fn load_program(path: &Path) -> Result<Graph> {
    let text = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let text = String::from_utf8(text).map_err(|e| {
        anyhow::anyhow!(
            "{}: not UTF-8 text (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })?;
    kfuse::parse_graph(&text).map_err(|e| anyhow::anyhow!(e.in_file(&path.display().to_string())))
}

/// The cost model by name; a failed calibration falls back to the fixed coefficients.
fn cost_model_named(name: &str) -> kfuse::FixedCostModel {
    if name == "fixed" {
        return kfuse::FixedCostModel::default();
    }
    match kfuse::runtime::calibrated_cost_model(&kfuse::cpu::default_cache_dir()) {
        Ok(model) => model,
        Err(e) => {
            eprintln!("note: calibration failed ({e}); using the fixed cost model");
            kfuse::FixedCostModel::default()
        }
    }
}

/// The profile of repeated runs: the only run's, or each step's median over the runs after
/// the first (which also packs weights and faults in fresh buffers), laid end to end.
fn steady(mut profiles: Vec<kfuse::runtime::RunStats>) -> kfuse::runtime::RunStats {
    if profiles.len() == 1 {
        return profiles.remove(0);
    }
    let later = &profiles[1..];
    let mut stats = later[later.len() - 1].clone();
    let mut start = 0.0;
    for (k, step) in stats.profile.iter_mut().enumerate() {
        let mut durations: Vec<f64> = later.iter().map(|p| p.profile[k].duration_us).collect();
        durations.sort_by(f64::total_cmp);
        step.duration_us = durations[durations.len() / 2];
        step.start_us = start;
        start += step.duration_us;
    }
    stats
}

/// Writes the run's steps as a Chrome trace and prints them.
fn write_profile(path: &Path, stats: &kfuse::runtime::RunStats, runs: usize) -> Result<()> {
    let events: Vec<serde_json::Value> = stats
        .profile
        .iter()
        .map(|p| {
            serde_json::json!({
                "name": p.name, "cat": p.tier, "ph": "X", "pid": 1, "tid": 1,
                "ts": p.start_us, "dur": p.duration_us,
                "args": {"bytes_read": p.bytes_read, "bytes_written": p.bytes_written},
            })
        })
        .collect();
    let trace = serde_json::json!({"traceEvents": events, "displayTimeUnit": "ms"});
    std::fs::write(path, serde_json::to_string(&trace)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    let of = if runs > 1 {
        format!(", each step's median over runs 2 to {runs}")
    } else {
        String::new()
    };
    eprintln!(
        "profile ({} steps, peak {} bytes{of}) -> {}",
        stats.profile.len(),
        stats.peak_bytes,
        path.display()
    );
    for p in &stats.profile {
        let gbs = (p.bytes_read + p.bytes_written) as f64 / (p.duration_us * 1e3).max(1e-9);
        eprintln!(
            "  {:16} {:16} {:10.1} us  {:>12} B read  {:>12} B written  {:6.1} GB/s",
            p.name, p.tier, p.duration_us, p.bytes_read, p.bytes_written, gbs
        );
    }
    Ok(())
}

/// Says on stderr which tier runs each kernel, and why a kernel is not compiled.
fn report_tiers(exe: &kfuse::Executable) {
    eprintln!(
        "engine: compiled ({} numerics, fusion {}): {}",
        exe.numerics.name(),
        exe.partition.policy.name(),
        tier_summary(exe)
    );
}

/// How an executable's steps run: counts of fused kernels by tier (compiled C, from the cache
/// or not; the tile interpreter) and of library steps, the compile time, then a line per
/// kernel on the tile interpreter with the reason.
fn tier_summary(exe: &kfuse::Executable) -> String {
    let kernels = exe.tiers.iter().flatten().count();
    let compiled = |cached: Option<bool>| {
        exe.tiers
            .iter()
            .flatten()
            .filter(|t| matches!(t, kfuse::Tier::Compiled { cached: c, .. } if cached.is_none_or(|want| *c == want)))
            .count()
    };
    let (all, cached) = (compiled(None), compiled(Some(true)));
    let mut line = format!(
        "{kernels} fused kernel(s), {all} as compiled C ({cached} from the cache), {} on the tile interpreter; {} library step(s); compile {:.3} s",
        kernels - all,
        exe.tiers.len() - kernels,
        exe.compile_seconds
    );
    for (step, tier) in exe.tiers.iter().enumerate() {
        if let Some(kfuse::Tier::Tile { reason }) = tier {
            line += &format!("\n  step {step} runs on the tile interpreter: {reason}");
        }
    }
    line
}

fn check(path: &Path) -> Result<()> {
    let graph = load_program(path)?;
    graph.verify()?;
    print!("{}", kfuse::print_graph(&graph));
    let inputs: Vec<String> = graph
        .inputs()
        .map(|(_, n, t)| format!("{n}: {t}"))
        .collect();
    let outputs: Vec<String> = graph
        .outputs()
        .iter()
        .map(|o| format!("{}: {}", o.name, graph.ty(o.value)))
        .collect();
    eprintln!(
        "ok: {} nodes; inputs [{}]; outputs [{}]",
        graph.nodes().len(),
        inputs.join(", "),
        outputs.join(", ")
    );
    Ok(())
}

/// Output names become file names; refuse any that could escape the directory.
fn output_file(dir: &Path, name: &str) -> Result<PathBuf> {
    let bad = name.is_empty()
        || name == "."
        || name == ".."
        || name
            .chars()
            .any(|c| matches!(c, '/' | '\\' | '\0') || c.is_control());
    if bad {
        bail!(
            "output name {name:?} cannot be used as a file name; rename the output in the program"
        );
    }
    Ok(dir.join(format!("{name}.npy")))
}

/// Where `kfuse run` takes its values from.
struct Bindings<'a> {
    /// `NAME=FILE.npy`.
    inputs: &'a [String],
    /// Archives of inputs.
    npz: &'a [PathBuf],
    /// Archives of constants.
    constants: &'a [PathBuf],
}

fn run(
    program: &Path,
    Bindings {
        inputs: bindings,
        npz,
        constants,
    }: Bindings,
    runs: usize,
    output_dir: &Path,
    engine: &EngineArgs,
) -> Result<()> {
    let mut graph = load_program(program)?;
    // Archive members are checked against the program's input types from their headers, before
    // their data is decompressed: a member of the wrong shape, or a large one the program does
    // not take, costs nothing to refuse.
    let declared: Vec<(String, kfuse::TensorType)> = graph
        .inputs()
        .map(|(_, name, ty)| (name.to_string(), ty.clone()))
        .collect();
    let expect = |unknown: fn(&str) -> String| {
        let declared = &declared;
        move |name: &str, found: &kfuse::TensorType| {
            match declared.iter().find(|(n, _)| n == name)
        {
            None => Err(unknown(name)),
            Some((_, want)) if want != found => Err(format!(
                "input {name:?}: expected {want}, found {found} (in its header; the data was not read)"
            )),
            Some(_) => Ok(()),
        }
        }
    };
    let mut frozen: Vec<(String, Array)> = Vec::new();
    for path in constants {
        let arrays = kfuse::npy::load_npz_checked(
            path,
            expect(|name| format!("the program has no input named `{name}`")),
        )
        .with_context(|| format!("cannot read {}", path.display()))?;
        for (name, array) in arrays {
            if frozen.iter().any(|(f, _)| *f == name) {
                bail!("`{name}` is given twice in --constants");
            }
            frozen.push((name, array));
        }
    }
    if !frozen.is_empty() {
        graph = kfuse::opt::freeze(&graph, &frozen).context("--constants")?;
    }
    let mut inputs: Vec<(String, Array)> = Vec::new();
    for path in npz {
        let arrays = kfuse::npy::load_npz_checked(
            path,
            expect(|name| format!("{name:?} is not an input of this program")),
        )
        .with_context(|| format!("cannot read {}", path.display()))?;
        inputs.extend(arrays);
    }
    for binding in bindings {
        let (name, file) = binding
            .split_once('=')
            .with_context(|| format!("--input {binding:?}: expected NAME=FILE.npy"))?;
        let array = kfuse::npy::load_npy(Path::new(file))
            .with_context(|| format!("cannot read {file} (input {name:?})"))?;
        inputs.retain(|(n, _)| n != name);
        inputs.push((name.to_string(), array));
    }
    if let Some((name, _)) = inputs
        .iter()
        .find(|(n, _)| frozen.iter().any(|(f, _)| f == n))
    {
        bail!("`{name}` is given both as a constant (--constants) and as an input");
    }
    // Validate every output name before computing anything.
    let files: Vec<PathBuf> = graph
        .outputs()
        .iter()
        .map(|o| output_file(output_dir, &o.name))
        .collect::<Result<_>>()?;
    let mut times = Vec::with_capacity(runs);
    let outputs = if engine.engine == "reference" {
        eprintln!("engine: reference interpreter");
        let mut outputs = Vec::new();
        for _ in 0..runs {
            let start = std::time::Instant::now();
            outputs = kfuse::run_graph(&graph, &inputs, &CustomOps::new())?;
            times.push(start.elapsed().as_secs_f64());
        }
        outputs
    } else {
        let exe = kfuse::compile_with_cost_model(
            &graph,
            &engine.options(),
            &cost_model_named(&engine.cost_model),
        )?;
        report_tiers(&exe);
        let mut runner = exe.runner();
        let mut profiles = Vec::with_capacity(runs);
        for _ in 0..runs {
            let start = std::time::Instant::now();
            let stats = runner
                .run(&inputs, &CustomOps::new())
                .map_err(kfuse::Error::from)?;
            times.push(start.elapsed().as_secs_f64());
            profiles.push(stats);
        }
        if let Some(path) = &engine.profile {
            write_profile(path, &steady(profiles), runs)?;
        }
        runner.outputs(&inputs)
    };
    if runs > 1 {
        let mut sorted = times.clone();
        sorted.sort_by(f64::total_cmp);
        eprintln!(
            "{runs} runs: median {:.3} ms, fastest {:.3} ms, first {:.3} ms",
            sorted[runs / 2] * 1e3,
            sorted[0] * 1e3,
            times[0] * 1e3
        );
    }
    std::fs::create_dir_all(output_dir)
        .with_context(|| format!("cannot create {}", output_dir.display()))?;
    for ((name, array), file) in outputs.iter().zip(&files) {
        kfuse::npy::save_npy(file, array)
            .with_context(|| format!("cannot write {}", file.display()))?;
        println!("{name}: {} -> {}", array.ty(), file.display());
    }
    Ok(())
}
