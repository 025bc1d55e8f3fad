//! The kfuse runtime: compile a graph (partition, lower, render and compile kernels) and execute
//! the program.
//!
//! Each fused kernel runs on one of two tiers: compiled C (rendered by `kfuse-cpu`, compiled by
//! the system compiler, cached on disk) or the tile interpreter, used when no compiler is found,
//! when a kernel cannot be rendered bit-exactly, or on request. [`Executable::tiers`] says which
//! runs and why. Buffers are allocated when a step first writes them and freed after the last
//! step that reads them; [`RunStats::peak_bytes`] reports the most held at once. Library steps
//! (matmul, convolution, sort, ...) run the reference interpreter's implementation of the op on
//! whole buffers.

use std::collections::HashMap;

use kfuse_cpu::{CacheOutcome, CompiledKernel, Compiler, Numerics};
use kfuse_fusion::{partition, CostModel, FusePolicy, Partition};
use kfuse_interp::{CustomOps, InterpError};
use kfuse_ir::{Array, Graph, Storage};
use kfuse_kernel::{lower, Access, BufId, BufferKind, LowerError, Program, Step};

/// Why compiling or running failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Lower(#[from] LowerError),
    /// An input was missing, unknown or of the wrong type (same checks as the interpreter).
    #[error(transparent)]
    Input(InterpError),
    /// A step failed at run time (an index out of range, a custom function's error, ...).
    #[error("step {step} ({what}): {message}")]
    Step {
        step: usize,
        what: String,
        message: String,
    },
}

/// Which backend tier to use for fused kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Compiled C where possible, the tile interpreter elsewhere.
    Auto,
    /// The tile interpreter only.
    Tile,
}

/// How to compile a graph.
#[derive(Clone, Debug)]
pub struct Options {
    pub policy: FusePolicy,
    pub numerics: Numerics,
    pub backend: Backend,
    pub cache_dir: std::path::PathBuf,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            policy: FusePolicy::Cost,
            numerics: Numerics::Fast,
            backend: Backend::Auto,
            cache_dir: kfuse_cpu::default_cache_dir(),
        }
    }
}

/// How one kernel runs.
#[derive(Clone, Debug)]
pub enum Tier {
    /// Compiled C, and whether the object came from the cache.
    Compiled {
        kernel: CompiledKernel,
        cached: bool,
    },
    /// The tile interpreter, and why.
    Tile { reason: String },
}

impl Tier {
    pub fn name(&self) -> &'static str {
        match self {
            Tier::Compiled { .. } => "compiled C",
            Tier::Tile { .. } => "tile interpreter",
        }
    }
}

/// A compiled graph.
#[derive(Clone, Debug)]
pub struct Executable {
    pub partition: Partition,
    pub program: Program,
    /// One entry per step: the tier of a kernel step, `None` for library steps.
    pub tiers: Vec<Option<Tier>>,
    pub numerics: Numerics,
    /// Seconds spent compiling: partitioning, lowering, rendering, the C compiler or the cache,
    /// and loading.
    pub compile_seconds: f64,
}

/// Partitions and lowers `graph`, running every kernel on the tile interpreter.
pub fn compile(
    graph: &Graph,
    policy: FusePolicy,
    cost: &dyn CostModel,
) -> Result<Executable, RunError> {
    let options = Options {
        policy,
        numerics: Numerics::Strict,
        backend: Backend::Tile,
        ..Options::default()
    };
    compile_with(graph, &options, cost)
}

/// Partitions, lowers and (for the auto backend) compiles every kernel, in parallel.
pub fn compile_with(
    graph: &Graph,
    options: &Options,
    cost: &dyn CostModel,
) -> Result<Executable, RunError> {
    let start = std::time::Instant::now();
    let partition = partition(graph, options.policy, cost);
    let program = lower(graph, &partition)?;
    let compiler = match options.backend {
        Backend::Tile => Err("the tile interpreter was requested".to_string()),
        Backend::Auto => Compiler::detect(options.cache_dir.clone()),
    };
    let tier_of = |step: &Step| -> Option<Tier> {
        let Step::Kernel { kernel, .. } = step else {
            return None;
        };
        let cc = match &compiler {
            Err(reason) => {
                return Some(Tier::Tile {
                    reason: reason.clone(),
                })
            }
            Ok(cc) => cc,
        };
        Some(match kfuse_cpu::c::render(kernel) {
            Err(unsupported) => Tier::Tile {
                reason: unsupported.0,
            },
            Ok(source) => match cc.compile(&source, options.numerics) {
                Ok((kernel, outcome)) => Tier::Compiled {
                    kernel,
                    cached: outcome == CacheOutcome::Hit,
                },
                Err(e) => Tier::Tile {
                    reason: format!("compilation failed: {e}"),
                },
            },
        })
    };
    let tiers: Vec<Option<Tier>> = std::thread::scope(|scope| {
        let handles: Vec<_> = program
            .steps
            .iter()
            .map(|step| scope.spawn(|| tier_of(step)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a compile thread panicked"))
            .collect()
    });
    Ok(Executable {
        partition,
        program,
        tiers,
        numerics: options.numerics,
        compile_seconds: start.elapsed().as_secs_f64(),
    })
}

/// Figures about one execution.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    pub kernels: usize,
    pub library_steps: usize,
    /// Bytes written to buffers by steps.
    pub bytes_written: usize,
    /// Most bytes of buffers held at once, inputs included.
    pub peak_bytes: usize,
}

impl Executable {
    /// Runs the program on named inputs; returns the outputs in graph order.
    pub fn run(
        &self,
        inputs: &[(String, Array)],
        custom: &CustomOps,
    ) -> Result<(Vec<(String, Array)>, RunStats), RunError> {
        run_program(&self.program, &self.tiers, inputs, custom)
    }
}

fn storage_bytes(s: &Storage) -> usize {
    s.len() * s.dtype().size_bytes()
}

fn unknown_input(program: &Program, name: &str) -> RunError {
    let known: Vec<String> = program
        .buffers
        .iter()
        .filter_map(|b| match &b.kind {
            BufferKind::Input(n) => Some(format!("{n:?}: {}", b.ty)),
            _ => None,
        })
        .collect();
    let known = if known.is_empty() {
        "none".into()
    } else {
        known.join(", ")
    };
    RunError::Input(InterpError::UnknownInput {
        name: name.to_string(),
        known,
    })
}

/// Executes a program; `tiers[i]` says how kernel step `i` runs (the tile interpreter where it
/// is missing).
pub fn run_program(
    program: &Program,
    tiers: &[Option<Tier>],
    inputs: &[(String, Array)],
    custom: &CustomOps,
) -> Result<(Vec<(String, Array)>, RunStats), RunError> {
    let given: HashMap<&str, &Array> = inputs.iter().map(|(n, a)| (n.as_str(), a)).collect();
    for (name, _) in inputs {
        if !program
            .buffers
            .iter()
            .any(|b| b.kind == BufferKind::Input(name.clone()))
        {
            return Err(unknown_input(program, name));
        }
    }
    // The last step that reads each buffer; outputs live to the end.
    let n_bufs = program.buffers.len();
    let mut last_read = vec![None; n_bufs];
    for (s, step) in program.steps.iter().enumerate() {
        let reads: Vec<BufId> = match step {
            Step::Kernel { kernel, args } => args
                .iter()
                .zip(&kernel.args)
                .filter(|(_, a)| a.access == Access::Read)
                .map(|(b, _)| *b)
                .collect(),
            Step::Library { inputs, .. } => inputs.clone(),
        };
        for b in reads {
            last_read[b.0 as usize] = Some(s);
        }
    }
    for (_, b) in &program.outputs {
        last_read[b.0 as usize] = Some(usize::MAX);
    }
    let mut bufs: Vec<Option<Storage>> = vec![None; n_bufs];
    let mut stats = RunStats::default();
    let mut live = 0usize;
    for (i, buffer) in program.buffers.iter().enumerate() {
        let storage = match &buffer.kind {
            BufferKind::Input(name) => match given.get(name.as_str()) {
                None => {
                    return Err(RunError::Input(InterpError::MissingInput {
                        name: name.clone(),
                        expected: buffer.ty.clone(),
                    }))
                }
                Some(a) if a.ty() != buffer.ty => {
                    return Err(RunError::Input(InterpError::InputType {
                        name: name.clone(),
                        expected: buffer.ty.clone(),
                        found: a.ty(),
                    }))
                }
                Some(a) => a.storage().clone(),
            },
            BufferKind::Constant(a) => a.storage().clone(),
            BufferKind::Computed => continue,
        };
        live += storage_bytes(&storage);
        bufs[i] = Some(storage);
    }
    stats.peak_bytes = live;
    for (s, step) in program.steps.iter().enumerate() {
        match step {
            Step::Kernel { kernel, args } => {
                stats.kernels += 1;
                let mut writes: Vec<Option<Storage>> = kernel
                    .args
                    .iter()
                    .map(|a| {
                        (a.access == Access::Write)
                            .then(|| Storage::zeros(a.ty.dtype, a.ty.shape.n_elems()))
                    })
                    .collect();
                let written: usize = writes.iter().flatten().map(storage_bytes).sum();
                live += written;
                stats.bytes_written += written;
                stats.peak_bytes = stats.peak_bytes.max(live);
                let reads: Vec<Option<&Storage>> = args
                    .iter()
                    .zip(&kernel.args)
                    .map(|(b, a)| {
                        if a.access == Access::Read {
                            bufs[b.0 as usize].as_ref()
                        } else {
                            None
                        }
                    })
                    .collect();
                match tiers.get(s) {
                    Some(Some(Tier::Compiled {
                        kernel: compiled, ..
                    })) => {
                        let ptrs = reads
                            .iter()
                            .zip(&writes)
                            .map(|(r, w)| {
                                kfuse_cpu::storage_ptr(
                                    r.or(w.as_ref()).expect("every argument is read or written"),
                                )
                            })
                            .collect();
                        kfuse_cpu::launch(kernel, compiled, ptrs);
                    }
                    _ => {
                        let mut write_refs: Vec<Option<&mut Storage>> =
                            writes.iter_mut().map(|w| w.as_mut()).collect();
                        kfuse_cpu::tile::run_kernel(
                            kernel,
                            &reads,
                            &mut write_refs,
                            0..kernel.outer_len(),
                            0..kernel.inner_len(),
                        )
                        .map_err(|message| RunError::Step {
                            step: s,
                            what: kernel.name.clone(),
                            message,
                        })?;
                    }
                }
                for (b, w) in args.iter().zip(writes) {
                    if let Some(w) = w {
                        bufs[b.0 as usize] = Some(w);
                    }
                }
            }
            Step::Library {
                node,
                op,
                inputs,
                outputs,
            } => {
                stats.library_steps += 1;
                let operands: Vec<Array> = inputs
                    .iter()
                    .map(|b| {
                        let ty = &program.buffer(*b).ty;
                        let storage = bufs[b.0 as usize]
                            .clone()
                            .expect("library inputs are computed first");
                        Array::new(ty.shape.clone(), storage).expect("buffer matches its type")
                    })
                    .collect();
                let refs: Vec<&Array> = operands.iter().collect();
                let types: Vec<_> = outputs
                    .iter()
                    .map(|b| program.buffer(*b).ty.clone())
                    .collect();
                let results =
                    kfuse_interp::eval_op(op, &types, &refs, custom).map_err(|message| {
                        RunError::Step {
                            step: s,
                            what: format!("%{node} {}", op.name()),
                            message,
                        }
                    })?;
                for (b, r) in outputs.iter().zip(results) {
                    let storage = r.into_storage();
                    live += storage_bytes(&storage);
                    stats.bytes_written += storage_bytes(&storage);
                    bufs[b.0 as usize] = Some(storage);
                }
                stats.peak_bytes = stats.peak_bytes.max(live);
            }
        }
        for (i, lr) in last_read.iter().enumerate() {
            if *lr == Some(s) {
                if let Some(storage) = bufs[i].take() {
                    live -= storage_bytes(&storage);
                }
            }
        }
    }
    let outputs = program
        .outputs
        .iter()
        .map(|(name, b)| {
            let ty = &program.buffer(*b).ty;
            let storage = bufs[b.0 as usize].clone().expect("outputs are computed");
            (
                name.clone(),
                Array::new(ty.shape.clone(), storage).expect("buffer matches its type"),
            )
        })
        .collect();
    Ok((outputs, stats))
}
