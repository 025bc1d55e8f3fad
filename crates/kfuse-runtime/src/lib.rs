//! The kfuse runtime: compile a graph (partition, lower) and execute the program.
//!
//! Buffers are allocated when a step first writes them and freed after the last step that
//! reads them; [`RunStats::peak_bytes`] reports the most held at once. Fused kernels run on the
//! tile interpreter; library steps (matmul, convolution, sort, ...) run the reference
//! interpreter's implementation of the op on whole buffers.

use std::collections::HashMap;

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

/// A compiled graph.
#[derive(Clone, Debug)]
pub struct Executable {
    pub partition: Partition,
    pub program: Program,
}

/// Partitions and lowers `graph`.
pub fn compile(
    graph: &Graph,
    policy: FusePolicy,
    cost: &dyn CostModel,
) -> Result<Executable, RunError> {
    let partition = partition(graph, policy, cost);
    let program = lower(graph, &partition)?;
    Ok(Executable { partition, program })
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
        run_program(&self.program, inputs, custom)
    }
}

fn storage_bytes(s: &Storage) -> usize {
    s.len() * s.dtype().size_bytes()
}

/// Executes a program.
pub fn run_program(
    program: &Program,
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
            let known: Vec<String> = program
                .buffers
                .iter()
                .filter_map(|b| match &b.kind {
                    BufferKind::Input(n) => Some(format!("{n:?}: {}", b.ty)),
                    _ => None,
                })
                .collect();
            return Err(RunError::Input(InterpError::UnknownInput {
                name: name.clone(),
                known: if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                },
            }));
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
                let mut writes: Vec<Option<Storage>> = Vec::with_capacity(args.len());
                for a in &kernel.args {
                    writes.push(if a.access == Access::Write {
                        let storage = Storage::zeros(a.ty.dtype, a.ty.shape.n_elems());
                        live += storage_bytes(&storage);
                        stats.bytes_written += storage_bytes(&storage);
                        Some(storage)
                    } else {
                        None
                    });
                }
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
                        Array::new(
                            ty.shape.clone(),
                            bufs[b.0 as usize]
                                .clone()
                                .expect("library inputs are computed first"),
                        )
                        .expect("buffer matches its type")
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
