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

pub use align::CacheAligned;
pub use calibrate::{calibrate, calibrated_cost_model};
use kfuse_cpu::{CacheOutcome, CompiledKernel, Compiler, Numerics};
use kfuse_fusion::{partition, CostModel, FusePolicy, Partition};
use kfuse_interp::{CustomOps, InterpError};
pub use meminfo::available_memory;
pub use runner::{plan_memory, MemoryPlan, Runner};

mod align;
mod calibrate;
mod meminfo;
mod runner;
use kfuse_ir::{AllocError, Array, Graph};
use kfuse_kernel::{lower, BufferKind, LowerError, Program, Step};

/// Why compiling or running failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Lower(#[from] LowerError),
    /// A graph pass failed (a bug in the pass: the graph it built is invalid).
    #[error("{0}")]
    Pass(String),
    /// An input was missing, unknown or of the wrong type (same checks as the interpreter).
    #[error(transparent)]
    Input(InterpError),
    /// A step failed at run time (an index out of range, a custom function's error, ...).
    /// `what` names the graph node (library steps) or the kernel.
    #[error("{what}: {message}")]
    Step {
        step: usize,
        what: String,
        message: String,
    },
    /// The buffer holding a node's result is larger than the memory left for it.
    #[error("node %{node} ({op}): {error}")]
    OutOfMemory {
        node: u32,
        op: &'static str,
        error: AllocError,
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
    /// Run the graph passes (`kfuse_opt`) before partitioning. Tests of code generation turn
    /// them off so that constant folding does not take work away from the kernels under test.
    pub graph_passes: bool,
    /// Keep every convolution and pooling in the layout the program gives it: no layout
    /// assignment (`kfuse_opt::ConvLayout`), which otherwise runs NHWC regions in NCHW where
    /// that pays. Tests of the NHWC routines set it.
    pub keep_layouts: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            policy: FusePolicy::Cost,
            numerics: Numerics::Fast,
            backend: Backend::Auto,
            cache_dir: kfuse_cpu::default_cache_dir(),
            graph_passes: true,
            keep_layouts: false,
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
    /// The graph after the passes; the partition's node ids refer to it.
    pub graph: Graph,
    /// What the graph passes did, one line per rewrite.
    pub passes: Vec<String>,
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
    // Graph passes: exact ones always, folding that rounds differently only in fast numerics.
    let pipeline = match options.numerics {
        _ if !options.graph_passes => kfuse_opt::Pipeline::new(Vec::new()),
        Numerics::Strict => kfuse_opt::Pipeline::strict(),
        Numerics::Fast if options.keep_layouts => {
            kfuse_opt::Pipeline::fast().without("conv-layout")
        }
        Numerics::Fast => kfuse_opt::Pipeline::fast(),
    };
    let (optimized, trail) = pipeline
        .run(graph)
        .map_err(|e| RunError::Pass(e.to_string()))?;
    let passes: Vec<String> = trail
        .into_iter()
        .flat_map(|(name, _, report)| {
            report
                .notes
                .into_iter()
                .map(move |n| format!("{name}: {n}"))
        })
        .collect();
    let graph = &optimized;
    let partition = partition(graph, options.policy, cost);
    let mut program = lower(graph, &partition)?;
    // A splat constant reaches the program as one value; kernels and routines read every
    // element, so they are stored here, each checked against the memory the machine has.
    let limit = available_memory();
    let mut stored = 0usize;
    for buffer in &mut program.buffers {
        if let BufferKind::Constant(value) = &mut buffer.kind {
            let bytes =
                value
                    .materialize(limit.after(stored))
                    .map_err(|error| RunError::OutOfMemory {
                        node: buffer.node,
                        op: buffer.op,
                        error,
                    })?;
            stored = stored.saturating_add(bytes);
        }
    }
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
    // Compilations run in parallel, on as many threads as the machine has cores (a C compiler
    // per kernel at once would oversubscribe the cores and the memory); tiers that need no
    // compiler are decided in place.
    let tiers: Vec<Option<Tier>> = if compiler.is_ok() {
        let workers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(program.steps.len().max(1));
        let next = std::sync::atomic::AtomicUsize::new(0);
        let mut tiers: Vec<Option<Tier>> = (0..program.steps.len()).map(|_| None).collect();
        let done: Vec<Vec<(usize, Option<Tier>)>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    scope.spawn(|| {
                        let mut mine = Vec::new();
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(step) = program.steps.get(i) else {
                                return mine;
                            };
                            mine.push((i, tier_of(step)));
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a compile thread panicked"))
                .collect()
        });
        for (i, tier) in done.into_iter().flatten() {
            tiers[i] = tier;
        }
        tiers
    } else {
        program.steps.iter().map(tier_of).collect()
    };
    Ok(Executable {
        graph: optimized.clone(),
        passes,
        partition,
        program,
        tiers,
        numerics: options.numerics,
        compile_seconds: start.elapsed().as_secs_f64(),
    })
}

/// Figures about one execution.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunStats {
    pub kernels: usize,
    pub library_steps: usize,
    /// Bytes written to buffers by steps.
    pub bytes_written: usize,
    /// Bytes of the reusable buffer slots the memory planner allocated, plus inputs and constants.
    pub peak_bytes: usize,
    /// One entry per step, in execution order.
    pub profile: Vec<StepProfile>,
}

/// Time and traffic of one step of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct StepProfile {
    /// `k3` for kernels, `%7 matmul` for library steps.
    pub name: String,
    /// `compiled C`, `tile interpreter` or `library`.
    pub tier: &'static str,
    /// Microseconds from the start of the run.
    pub start_us: f64,
    pub duration_us: f64,
    pub bytes_read: usize,
    pub bytes_written: usize,
}

impl Executable {
    /// Runs the program once on named inputs; returns the outputs in graph order. For repeated
    /// runs, [`Executable::runner`] keeps buffers allocated between runs.
    pub fn run(
        &self,
        inputs: &[(String, Array)],
        custom: &CustomOps,
    ) -> Result<(Vec<(String, Array)>, RunStats), RunError> {
        let mut runner = self.runner();
        let stats = runner.run(inputs, custom)?;
        Ok((runner.outputs(inputs), stats))
    }

    /// A runner that reuses its buffers across runs.
    pub fn runner(&self) -> Runner<'_> {
        Runner::new(&self.program, &self.tiers, self.numerics)
    }
}

/// Executes a program once; `tiers[i]` says how kernel step `i` runs (the tile interpreter where
/// it is missing).
pub fn run_program(
    program: &Program,
    tiers: &[Option<Tier>],
    inputs: &[(String, Array)],
    custom: &CustomOps,
) -> Result<(Vec<(String, Array)>, RunStats), RunError> {
    let mut runner = Runner::new(program, tiers, Numerics::Strict);
    let stats = runner.run(inputs, custom)?;
    Ok((runner.outputs(inputs), stats))
}
