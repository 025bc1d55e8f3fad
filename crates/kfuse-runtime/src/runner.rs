//! Executing a program repeatedly without reallocating: a liveness-based memory plan assigns
//! every computed buffer to a reusable slot, inputs are read where the caller keeps them, and
//! slots stay allocated between runs (fresh pages cost page faults on every first touch).

use std::collections::HashMap;

use kfuse_interp::{CustomOps, InterpError};
use kfuse_ir::{Array, MemoryLimit, Storage};
use kfuse_kernel::{Access, Anchor, BufId, BufferKind, Program, Step, StructuredCall};

use kfuse_cpu::Numerics;

use crate::{RunError, RunStats, StepProfile, Tier};

/// Which slot each computed buffer lives in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// For every buffer of the program: its slot, or `None` for inputs and constants.
    pub slot_of: Vec<Option<usize>>,
    /// Element type and count of each slot.
    pub slots: Vec<(kfuse_ir::DType, usize)>,
}

impl MemoryPlan {
    /// Bytes of all slots, saturating at `usize::MAX`: every slot's size fits in `usize`
    /// (inference checks each type), but their sum need not.
    pub fn slot_bytes(&self) -> usize {
        self.slots.iter().fold(0, |total: usize, (d, n)| {
            total.saturating_add(d.size_bytes().saturating_mul(*n))
        })
    }
}

/// The buffers a step reads (`Access::Read`) or writes (`Access::Write`).
fn buffers_of(step: &Step, access: Access) -> Vec<BufId> {
    match step {
        Step::Kernel { kernel, args } => args
            .iter()
            .zip(&kernel.args)
            .filter(|(_, a)| a.access == access)
            .map(|(b, _)| *b)
            .collect(),
        Step::Library { inputs, .. } | Step::Structured { inputs, .. }
            if access == Access::Read =>
        {
            inputs.clone()
        }
        Step::Library { outputs, .. } | Step::Structured { outputs, .. } => outputs.clone(),
    }
}

fn reads_of(step: &Step) -> Vec<BufId> {
    buffers_of(step, Access::Read)
}

fn writes_of(step: &Step) -> Vec<BufId> {
    buffers_of(step, Access::Write)
}

/// Assigns computed buffers to slots: a buffer reuses a slot of the same dtype and size whose
/// previous occupant is no longer read. A step never reads and writes the same slot.
pub fn plan_memory(program: &Program) -> MemoryPlan {
    let n = program.buffers.len();
    let mut last_read = vec![None; n];
    for (s, step) in program.steps.iter().enumerate() {
        for b in reads_of(step) {
            last_read[b.0 as usize] = Some(s);
        }
    }
    for (_, b) in &program.outputs {
        last_read[b.0 as usize] = Some(usize::MAX);
    }
    let mut slot_of = vec![None; n];
    let mut slots: Vec<(kfuse_ir::DType, usize)> = Vec::new();
    // For each slot, the last step that reads its current occupant.
    let mut busy_until: Vec<Option<usize>> = Vec::new();
    for (s, step) in program.steps.iter().enumerate() {
        for b in writes_of(step) {
            let buffer = program.buffer(b);
            if buffer.kind != BufferKind::Computed {
                continue;
            }
            let want = (buffer.ty.dtype, buffer.ty.shape.n_elems());
            let free = (0..slots.len())
                .find(|&k| slots[k] == want && busy_until[k].is_some_and(|end| end < s));
            let k = free.unwrap_or_else(|| {
                slots.push(want);
                busy_until.push(None);
                slots.len() - 1
            });
            // A buffer nobody reads is dead after the step that writes it.
            busy_until[k] = Some(last_read[b.0 as usize].unwrap_or(s));
            slot_of[b.0 as usize] = Some(k);
        }
    }
    MemoryPlan { slot_of, slots }
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

/// Runs a program repeatedly, keeping its buffer slots allocated.
pub struct Runner<'a> {
    program: &'a Program,
    tiers: &'a [Option<Tier>],
    numerics: Numerics,
    plan: MemoryPlan,
    slots: Vec<Option<Storage>>,
    /// The program's constants, registered as unchanging while the runner borrows them, so
    /// that the convolution kernels keep their packed weights between runs.
    _constants: kfuse_routines::constants::Registration,
}

impl<'a> Runner<'a> {
    /// A runner for `program`, kernels on `tiers`; with fast numerics, matmul library steps use
    /// `gemm` (strict numerics keep the reference matmul, whose summation order they reproduce).
    pub fn new(program: &'a Program, tiers: &'a [Option<Tier>], numerics: Numerics) -> Self {
        let plan = plan_memory(program);
        let slots = vec![None; plan.slots.len()];
        let constants = kfuse_routines::constants::register(program.buffers.iter().filter_map(
            |b| match &b.kind {
                BufferKind::Constant(a) => Some(a.storage()),
                _ => None,
            },
        ));
        Runner {
            program,
            tiers,
            numerics,
            plan,
            slots,
            _constants: constants,
        }
    }

    pub fn plan(&self) -> &MemoryPlan {
        &self.plan
    }

    /// Checks the inputs against the program's input buffers.
    fn bind<'i>(
        &self,
        inputs: &'i [(String, Array)],
    ) -> Result<Vec<Option<&'i Storage>>, RunError> {
        let given: HashMap<&str, &Array> = inputs.iter().map(|(n, a)| (n.as_str(), a)).collect();
        for (name, _) in inputs {
            if !self
                .program
                .buffers
                .iter()
                .any(|b| b.kind == BufferKind::Input(name.clone()))
            {
                return Err(unknown_input(self.program, name));
            }
        }
        self.program
            .buffers
            .iter()
            .map(|buffer| match &buffer.kind {
                BufferKind::Input(name) => match given.get(name.as_str()) {
                    None => Err(RunError::Input(InterpError::MissingInput {
                        name: name.clone(),
                        expected: buffer.ty.clone(),
                    })),
                    Some(a) if a.ty() != buffer.ty => {
                        Err(RunError::Input(InterpError::InputType {
                            name: name.clone(),
                            expected: buffer.ty.clone(),
                            found: a.ty(),
                        }))
                    }
                    Some(a) => Ok(Some(a.storage())),
                },
                _ => Ok(None),
            })
            .collect()
    }

    /// Runs every step. Outputs stay in the runner's slots; see [`Runner::output`].
    pub fn run(
        &mut self,
        inputs: &[(String, Array)],
        custom: &CustomOps,
    ) -> Result<RunStats, RunError> {
        let bound = self.bind(inputs)?;
        let program = self.program;
        let mut stats = RunStats {
            peak_bytes: self.plan.slot_bytes(),
            ..RunStats::default()
        };
        for buffer in &program.buffers {
            if buffer.kind != BufferKind::Computed {
                stats.peak_bytes = stats.peak_bytes.saturating_add(buffer.ty.size_bytes());
            }
        }
        // Slots still to allocate are checked against what the machine has available, read
        // when the first of them is needed (runs that reuse every slot never read it), less
        // what this run has allocated so far.
        let mut limit: Option<MemoryLimit> = None;
        let mut allocated = 0usize;
        let run_start = std::time::Instant::now();
        for (s, step) in program.steps.iter().enumerate() {
            let step_start = run_start.elapsed();
            // Take the written slots out so that reads can borrow the rest.
            let writes = writes_of(step);
            let mut taken: Vec<(usize, Storage)> = Vec::new();
            for b in &writes {
                let buffer = program.buffer(*b);
                let k = self.plan.slot_of[b.0 as usize].expect("written buffers have slots");
                let storage = match self.slots[k].take() {
                    Some(st)
                        if st.dtype() == buffer.ty.dtype
                            && st.len() == buffer.ty.shape.n_elems() =>
                    {
                        st
                    }
                    _ => {
                        let left = limit.get_or_insert_with(crate::available_memory);
                        let storage = Storage::try_zeros(&buffer.ty, left.after(allocated))
                            .map_err(|error| RunError::OutOfMemory {
                                node: buffer.node,
                                op: buffer.op,
                                error,
                            })?;
                        allocated = allocated.saturating_add(buffer.ty.size_bytes());
                        storage
                    }
                };
                stats.bytes_written += buffer.ty.size_bytes();
                taken.push((k, storage));
            }
            let storage_of = |b: BufId| -> Option<&Storage> {
                let i = b.0 as usize;
                match &program.buffers[i].kind {
                    BufferKind::Input(_) => bound[i],
                    BufferKind::Constant(a) => Some(a.storage()),
                    BufferKind::Computed => self.slots
                        [self.plan.slot_of[i].expect("computed buffers have slots")]
                    .as_ref(),
                }
            };
            let result = match step {
                Step::Kernel { kernel, args } => {
                    stats.kernels += 1;
                    let mut next_write = taken.iter_mut();
                    let mut reads: Vec<Option<&Storage>> = Vec::with_capacity(args.len());
                    let mut write_refs: Vec<Option<&mut Storage>> = Vec::with_capacity(args.len());
                    for (b, a) in args.iter().zip(&kernel.args) {
                        if a.access == Access::Read {
                            reads.push(Some(
                                storage_of(*b).expect("read buffers are computed before use"),
                            ));
                            write_refs.push(None);
                        } else {
                            reads.push(None);
                            write_refs.push(Some(
                                &mut next_write.next().expect("one slot per written argument").1,
                            ));
                        }
                    }
                    match self.tiers.get(s) {
                        Some(Some(Tier::Compiled {
                            kernel: compiled, ..
                        })) => {
                            let ptrs = reads
                                .iter()
                                .zip(&write_refs)
                                .map(|(r, w)| match (r, w) {
                                    (Some(r), _) => kfuse_cpu::storage_ptr(r),
                                    (None, Some(w)) => kfuse_cpu::storage_ptr(w),
                                    (None, None) => {
                                        unreachable!("every argument is read or written")
                                    }
                                })
                                .collect();
                            kfuse_cpu::launch(kernel, compiled, ptrs);
                            Ok(())
                        }
                        _ => kfuse_cpu::tile::run_kernel(
                            kernel,
                            &reads,
                            &mut write_refs,
                            0..kernel.outer_len(),
                            0..kernel.inner_len(),
                        )
                        .map_err(|message| RunError::Step {
                            step: s,
                            what: format!("kernel {}", kernel.name),
                            message,
                        }),
                    }
                }
                Step::Library {
                    node,
                    op: op @ (kfuse_ir::Op::Conv2d(_) | kfuse_ir::Op::MatMul),
                    inputs: ins,
                    outputs,
                } if self.numerics == Numerics::Fast
                    && match op {
                        // f16 and bf16 too, widened and rounded as the reference rounds.
                        kfuse_ir::Op::MatMul => kfuse_routines::matmul::writes(
                            program.buffer(ins[0]).ty.dtype,
                            program.buffer(outputs[0]).ty.dtype,
                        ),
                        _ => kfuse_routines::conv::computes(program.buffer(ins[0]).ty.dtype),
                    }
                    && !match op {
                        kfuse_ir::Op::Conv2d(attrs) => padded_weights_not_finite(
                            attrs,
                            storage_of(ins[1]).expect("library inputs are computed first"),
                        ),
                        _ => false,
                    } =>
                {
                    // A bare convolution or matmul: the structured routine with nothing absorbed.
                    stats.library_steps += 1;
                    let anchor = match op {
                        kfuse_ir::Op::Conv2d(attrs) => Anchor::Conv {
                            depthwise: None,
                            conv: attrs.clone(),
                        },
                        _ => Anchor::MatMul {
                            transposed: [None, None],
                        },
                    };
                    let call = StructuredCall {
                        anchor,
                        bias: false,
                        scale: false,
                        residual: false,
                        activation: None,
                        cast: false,
                        pool: None,
                    };
                    let view = |i: usize| kfuse_routines::dense::View {
                        storage: storage_of(ins[i]).expect("library inputs are computed first"),
                        dims: program.buffer(ins[i]).ty.shape.dims(),
                    };
                    let out_dims = program.buffer(outputs[0]).ty.shape.dims();
                    fast_structured(&call, &view, ins.len(), out_dims, &mut taken[0].1).map_err(
                        |message| RunError::Step {
                            step: s,
                            what: format!("node %{node} ({})", op.name()),
                            message,
                        },
                    )
                }
                Step::Library {
                    node,
                    op: kfuse_ir::Op::Pool2d(attrs),
                    inputs: ins,
                    outputs,
                } if kfuse_routines::pooling::supported(program.buffer(ins[0]).ty.dtype) => {
                    // Bit-identical to the reference, so in both numerics modes.
                    stats.library_steps += 1;
                    let x = kfuse_routines::dense::View {
                        storage: storage_of(ins[0]).expect("library inputs are computed first"),
                        dims: program.buffer(ins[0]).ty.shape.dims(),
                    };
                    kfuse_routines::pooling::pool2d(
                        x,
                        attrs,
                        program.buffer(outputs[0]).ty.shape.dims(),
                        &mut taken[0].1,
                    )
                    .map_err(|message| RunError::Step {
                        step: s,
                        what: format!("node %{node} (pool2d)"),
                        message,
                    })
                }
                Step::Structured {
                    nodes,
                    call,
                    inputs: ins,
                    outputs,
                } => {
                    stats.library_steps += 1;
                    let view = |b: BufId| kfuse_routines::dense::View {
                        storage: storage_of(b).expect("structured inputs are computed first"),
                        dims: program.buffer(b).ty.shape.dims(),
                    };
                    let out_ty = &program.buffer(outputs[0]).ty;
                    // The dtype the anchor computes in: its output's, or before a cast its
                    // operands' (a cast goes to another float dtype).
                    let compute = if call.cast {
                        program.buffer(ins[0]).ty.dtype
                    } else {
                        out_ty.dtype
                    };
                    // Matmuls of every float dtype (f16 and bf16 computed in f32, each step
                    // rounded); convolutions of f32 and f64 (the half-precision ones compute
                    // their products fast within the reference's step, see
                    // `fast_half_conv`).
                    let routine = match call.anchor {
                        Anchor::MatMul { .. } => {
                            kfuse_routines::matmul::writes(compute, out_ty.dtype)
                        }
                        // f16 and bf16 too, through f32 with each step rounded (a separable
                        // block's convolutions one after the other).
                        Anchor::Conv { .. } => {
                            kfuse_routines::conv::computes(compute)
                                && compute == out_ty.dtype
                                && (call.pool.is_none()
                                    || kfuse_routines::pooling::supported(compute))
                        }
                    };
                    let fast = self.numerics == Numerics::Fast
                        && routine
                        && !call_padded_weights_not_finite(call, &|i| view(ins[i]).storage);
                    let result = if fast {
                        let operand = |i: usize| view(ins[i]);
                        fast_structured(
                            call,
                            &operand,
                            ins.len(),
                            out_ty.shape.dims(),
                            &mut taken[0].1,
                        )
                    } else {
                        let array = |b: BufId| {
                            Array::new(program.buffer(b).ty.shape.clone(), view(b).storage.clone())
                                .expect("buffer matches its type")
                        };
                        reference_structured(call, ins, (out_ty, compute), array, self.numerics)
                            .map(|a| {
                                taken[0].1 = a.into_storage();
                            })
                    };
                    result.map_err(|message| RunError::Step {
                        step: s,
                        what: format!(
                            "nodes {} ({})",
                            nodes
                                .iter()
                                .map(|n| format!("%{n}"))
                                .collect::<Vec<_>>()
                                .join(", "),
                            call.name()
                        ),
                        message,
                    })
                }
                Step::Library {
                    node,
                    op,
                    inputs: ins,
                    outputs,
                } => {
                    stats.library_steps += 1;
                    let operands: Vec<Array> = ins
                        .iter()
                        .map(|b| {
                            let ty = &program.buffer(*b).ty;
                            let storage = storage_of(*b)
                                .expect("library inputs are computed first")
                                .clone();
                            Array::new(ty.shape.clone(), storage).expect("buffer matches its type")
                        })
                        .collect();
                    let refs: Vec<&Array> = operands.iter().collect();
                    let types: Vec<_> = outputs
                        .iter()
                        .map(|b| program.buffer(*b).ty.clone())
                        .collect();
                    let half = match self.numerics {
                        Numerics::Fast => fast_half_conv(op, &refs, &types[0]),
                        Numerics::Strict => None,
                    };
                    let result = match half {
                        Some(product) => product.map(|a| vec![a]),
                        None => kfuse_interp::eval_op(op, &types, &refs, custom),
                    };
                    result
                        .map(|results| {
                            for ((_, slot), r) in taken.iter_mut().zip(results) {
                                *slot = r.into_storage();
                            }
                        })
                        .map_err(|message| RunError::Step {
                            step: s,
                            what: format!("node %{node} ({})", op.name()),
                            message,
                        })
                }
            };
            for (k, storage) in taken {
                self.slots[k] = Some(storage);
            }
            result?;
            let (name, tier) = match step {
                Step::Kernel { kernel, .. } => (
                    kernel.name.clone(),
                    self.tiers
                        .get(s)
                        .and_then(|t| t.as_ref())
                        .map_or("tile interpreter", Tier::name),
                ),
                Step::Library { node, op, .. } => (format!("%{node} {}", op.name()), "library"),
                Step::Structured { nodes, call, .. } => {
                    (format!("%{} {}", nodes[0], call.name()), "library")
                }
            };
            let bytes =
                |ids: Vec<BufId>| ids.iter().map(|b| program.buffer(*b).ty.size_bytes()).sum();
            stats.profile.push(StepProfile {
                name,
                tier,
                start_us: step_start.as_secs_f64() * 1e6,
                duration_us: (run_start.elapsed() - step_start).as_secs_f64() * 1e6,
                bytes_read: bytes(reads_of(step)),
                bytes_written: bytes(writes),
            });
        }
        Ok(stats)
    }

    /// The storage of output `index` after a run (`inputs` as given to that run).
    pub fn output<'s>(&'s self, index: usize, inputs: &'s [(String, Array)]) -> &'s Storage {
        let b = self.program.outputs[index].1 .0 as usize;
        match &self.program.buffers[b].kind {
            BufferKind::Input(name) => inputs
                .iter()
                .find(|(n, _)| n == name)
                .expect("bound input")
                .1
                .storage(),
            BufferKind::Constant(a) => a.storage(),
            BufferKind::Computed => self.slots[self.plan.slot_of[b].expect("slot")]
                .as_ref()
                .expect("outputs are computed"),
        }
    }

    /// Copies of all outputs after a run.
    pub fn outputs(&self, inputs: &[(String, Array)]) -> Vec<(String, Array)> {
        self.program
            .outputs
            .iter()
            .enumerate()
            .map(|(i, (name, b))| {
                let ty = &self.program.buffer(*b).ty;
                (
                    name.clone(),
                    Array::new(ty.shape.clone(), self.output(i, inputs).clone())
                        .expect("buffer matches its type"),
                )
            })
            .collect()
    }
}

/// Whether a convolution with padding has a weight that is infinite or NaN. The fast kernels
/// compute a padding tap as `0 * w`, where the reference skips it: next to the border such a
/// weight would give NaN where the reference gives a number, so those steps run on the
/// reference instead. The check reads the weights once a run, or once for the runner's life
/// where they are a constant: for ResNet's last stage at batch 1 (512 → 512 channels at 7×7)
/// the 9.4 MB of weights outweigh the convolution's other reads 90 to 1.
fn padded_weights_not_finite(attrs: &kfuse_ir::Conv2dAttrs, weights: &Storage) -> bool {
    attrs.padding.iter().any(|&p| p > 0)
        && match weights {
            Storage::F32(w) => {
                !kfuse_routines::constants::holds(w, kfuse_routines::constants::FINITE, || {
                    all_finite(w, |v| v.is_finite())
                })
            }
            Storage::F64(w) => !all_finite(w, |v| v.is_finite()),
            Storage::F16(w) => !all_finite(w, |v| v.is_finite()),
            Storage::BF16(w) => !all_finite(w, |v| v.is_finite()),
            _ => false,
        }
}

/// Whether `finite` holds for every value: runs of 256 tested whole (a loop without an early
/// exit, which vectorizes), stopping at the first run that fails.
fn all_finite<T: Copy>(values: &[T], finite: impl Fn(T) -> bool) -> bool {
    values
        .chunks(256)
        .all(|run| run.iter().fold(true, |all, &v| all & finite(v)))
}

/// [`padded_weights_not_finite`] for the padded convolutions of a structured call: its own
/// convolution, or the depthwise one of a separable block (its 1×1 convolutions have no
/// padding). `storage(i)` is the call's input `i`.
fn call_padded_weights_not_finite<'s>(
    call: &kfuse_kernel::StructuredCall,
    storage: &dyn Fn(usize) -> &'s Storage,
) -> bool {
    match &call.anchor {
        Anchor::Conv {
            depthwise: Some(d), ..
        } => {
            // Inputs: activations, (expand weights, bias,) depthwise weights.
            let at = 1 + d.expand.as_ref().map_or(0, |e| 1 + usize::from(e.bias));
            padded_weights_not_finite(&d.attrs, storage(at))
        }
        Anchor::Conv {
            depthwise: None,
            conv,
        } => padded_weights_not_finite(conv, storage(1)),
        Anchor::MatMul { .. } => false,
    }
}

/// A structured step evaluated op by op on the reference interpreter: what strict numerics
/// (and dtypes without a fast routine) run, bit-identical to the graph's ops.
fn reference_structured<'a>(
    call: &kfuse_kernel::StructuredCall,
    inputs: &[BufId],
    (out_ty, compute): (&kfuse_ir::TensorType, kfuse_ir::DType),
    array: impl Fn(BufId) -> Array + 'a,
    numerics: Numerics,
) -> Result<Array, String> {
    use kfuse_ir::{BinaryOp, Op};
    let custom = CustomOps::new();
    let eval = |op: Op, ty: &kfuse_ir::TensorType, operands: &[&Array]| {
        if numerics == Numerics::Fast {
            if let Some(result) = fast_half_conv(&op, operands, ty) {
                return result;
            }
        }
        kfuse_interp::eval_op(&op, std::slice::from_ref(ty), operands, &custom)
            .map(|mut results| results.remove(0))
    };
    // The steps before a cast compute in `compute`, the operands' dtype.
    let final_ty = out_ty;
    // Before a pooling, the convolution's own shape.
    let computed = kfuse_ir::TensorType {
        dtype: compute,
        shape: call
            .pool
            .as_ref()
            .map_or(&out_ty.shape, |p| &p.conv_ty.shape)
            .clone(),
    };
    let out_ty = &computed;
    let mut next = inputs.iter().copied();
    let mut y = match &call.anchor {
        Anchor::Conv { depthwise, conv } => {
            let mut x = array(next.next().expect("activations"));
            if let Some(d) = depthwise {
                // A convolution of the block with its own bias and activation, its weights
                // (and bias) the next inputs.
                let mut stage =
                    |x: Array,
                     attrs: &kfuse_ir::Conv2dAttrs,
                     ty: &kfuse_ir::TensorType,
                     bias: bool,
                     activation: Option<kfuse_kernel::Activation>| {
                        let w = array(next.next().expect("convolution weights"));
                        let mut x = eval(Op::Conv2d(attrs.clone()), ty, &[&x, &w])?;
                        if bias {
                            let bias = array(next.next().expect("convolution bias"));
                            x = eval(Op::Binary(BinaryOp::Add), ty, &[&x, &bias])?;
                        }
                        match activation {
                            Some(activation) => reference_activation(activation, ty, &x),
                            None => Ok(x),
                        }
                    };
                if let Some(e) = &d.expand {
                    x = stage(x, &e.attrs, &e.ty, e.bias, e.activation)?;
                }
                x = stage(x, &d.attrs, &d.ty, d.bias, d.activation)?;
            }
            let w = array(next.next().expect("weights"));
            eval(Op::Conv2d(conv.clone()), out_ty, &[&x, &w])?
        }
        Anchor::MatMul { transposed } => {
            let mut operands = Vec::new();
            for t in transposed {
                let source = array(next.next().expect("matmul operand"));
                operands.push(match t {
                    Some((perm, ty)) => eval(Op::Permute { perm: perm.clone() }, ty, &[&source])?,
                    None => source,
                });
            }
            eval(Op::MatMul, out_ty, &[&operands[0], &operands[1]])?
        }
    };
    if call.bias {
        let bias = array(next.next().expect("bias"));
        y = eval(Op::Binary(BinaryOp::Add), out_ty, &[&y, &bias])?;
    }
    if call.scale {
        let scale = array(next.next().expect("scale"));
        y = eval(Op::Binary(BinaryOp::Mul), out_ty, &[&y, &scale])?;
    }
    if call.residual {
        let residual = array(next.next().expect("residual"));
        y = eval(Op::Binary(BinaryOp::Add), out_ty, &[&y, &residual])?;
    }
    if let Some(activation) = call.activation {
        y = reference_activation(activation, out_ty, &y)?;
    }
    if let Some(pool) = &call.pool {
        y = eval(Op::Pool2d(pool.attrs.clone()), final_ty, &[&y])?;
    }
    if call.cast {
        y = eval(Op::Cast { to: final_ty.dtype }, final_ty, &[&y])?;
    }
    Ok(y)
}

/// A convolution of f16 or bf16 operands in fast numerics, on the f32 routines: as the
/// reference computes it (operands widened to f32, the sum in f32, rounded once to the
/// operands' dtype) but in another summation order, as for f32. `None` for other ops and
/// dtypes, and for a padded convolution with a non-finite weight (see
/// [`padded_weights_not_finite`]): those run on the reference. Everything around the product
/// (a structured step's epilogue) stays op by op, each op rounding to the half dtype as the
/// reference does. It is `kfuse_routines::conv::conv2d`'s half-precision path with no epilogue,
/// for the steps the runner evaluates op by op. (Half-precision matmuls, bare or structured,
/// go to `kfuse_routines::matmul`, which rounds every step of their epilogue itself.)
fn fast_half_conv<'a>(
    op: &kfuse_ir::Op,
    operands: &[&'a Array],
    ty: &kfuse_ir::TensorType,
) -> Option<Result<Array, String>> {
    use kfuse_ir::{DType, Op};
    let Op::Conv2d(attrs) = op else {
        return None;
    };
    if !matches!(ty.dtype, DType::F16 | DType::BF16)
        || operands.len() != 2
        || padded_weights_not_finite(attrs, operands[1].storage())
    {
        return None;
    }
    let view = |a: &'a Array| kfuse_routines::dense::View {
        storage: a.storage(),
        dims: a.shape().dims(),
    };
    // The half-precision routine, with no epilogue: the product rounded once.
    let mut out = Storage::zeros(ty.dtype, ty.shape.n_elems());
    let done = kfuse_routines::conv::conv2d(
        view(operands[0]),
        view(operands[1]),
        attrs,
        ty.shape.dims(),
        &mut out,
        &kfuse_routines::epilogue::Epilogue::default(),
    );
    Some(done.map(|()| Array::new(ty.shape.clone(), out).expect("the output fills its shape")))
}

/// An absorbed activation run as its IR op on the reference interpreter.
fn reference_activation(
    activation: kfuse_kernel::Activation,
    ty: &kfuse_ir::TensorType,
    x: &Array,
) -> Result<Array, String> {
    use kfuse_ir::Op;
    let custom = CustomOps::new();
    let eval = |op: Op, operands: &[&Array]| {
        kfuse_interp::eval_op(&op, std::slice::from_ref(ty), operands, &custom)
            .map(|mut results| results.remove(0))
    };
    // A constant of the value's dtype (the activations' constants convert to it exactly: they
    // came from constants of that dtype).
    let scalar = |v: f64| match ty.dtype {
        kfuse_ir::DType::F32 => Ok(Array::scalar(v as f32)),
        kfuse_ir::DType::F64 => Ok(Array::scalar(v)),
        kfuse_ir::DType::F16 => Ok(Array::scalar(kfuse_ir::f16::from_f64(v))),
        kfuse_ir::DType::BF16 => Ok(Array::scalar(kfuse_ir::bf16::from_f64(v))),
        other => Err(format!("{} epilogue on {other}", activation.name())),
    };
    match activation {
        kfuse_kernel::Activation::Relu => eval(Op::Unary(kfuse_ir::UnaryOp::Relu), &[x]),
        kfuse_kernel::Activation::HardSwish { divide_last } => {
            use kfuse_ir::BinaryOp::{Add, Div, Mul};
            let six = scalar(6.0)?;
            let c = eval(Op::Binary(Add), &[x, &scalar(3.0)?])?;
            let c = eval(Op::Clamp, &[&c, &scalar(0.0)?, &six])?;
            if divide_last {
                let m = eval(Op::Binary(Mul), &[x, &c])?;
                eval(Op::Binary(Div), &[&m, &six])
            } else {
                let h = eval(Op::Binary(Div), &[&c, &six])?;
                eval(Op::Binary(Mul), &[x, &h])
            }
        }
        kfuse_kernel::Activation::GeluTanh => eval(Op::Unary(kfuse_ir::UnaryOp::GeluTanh), &[x]),
        kfuse_kernel::Activation::Gelu => eval(Op::Unary(kfuse_ir::UnaryOp::Gelu), &[x]),
        kfuse_kernel::Activation::Silu => {
            let s = eval(Op::Unary(kfuse_ir::UnaryOp::Sigmoid), &[x])?;
            eval(Op::Binary(kfuse_ir::BinaryOp::Mul), &[x, &s])
        }
        kfuse_kernel::Activation::Sigmoid => eval(Op::Unary(kfuse_ir::UnaryOp::Sigmoid), &[x]),
        kfuse_kernel::Activation::Tanh => eval(Op::Unary(kfuse_ir::UnaryOp::Tanh), &[x]),
        kfuse_kernel::Activation::Clamp(bounds) => eval(
            Op::Clamp,
            &[x, &scalar(bounds.lo())?, &scalar(bounds.hi())?],
        ),
    }
}

/// Runs a structured call on the fast routines into `out`. `operand(i)` is input `i` of the
/// step: the activations or left operand, (the depthwise weights and bias,) the weights or
/// right operand, then the bias and the residual if the call adds them.
fn fast_structured<'a>(
    call: &StructuredCall,
    operand: &dyn Fn(usize) -> kfuse_routines::dense::View<'a>,
    n_inputs: usize,
    out_dims: &[usize],
    out: &mut Storage,
) -> Result<(), String> {
    // The bias, the scale and the residual, when the call has them, are the last inputs, in
    // that order.
    let residual = call.residual.then(|| operand(n_inputs - 1).storage);
    let scale_at = n_inputs - 1 - usize::from(call.residual);
    let scale = call.scale.then(|| operand(scale_at).storage);
    let bias_at = scale_at - usize::from(call.scale);
    let epilogue = kfuse_routines::epilogue::Epilogue {
        bias: call.bias.then(|| operand(bias_at).storage),
        scale,
        residual,
        activation: call.activation,
    };
    match &call.anchor {
        Anchor::Conv {
            depthwise: Some(d), ..
        } => {
            // Inputs: activations, (expand weights, bias,) depthwise weights, bias, weights.
            let mut at = 1;
            let mut take = |present: bool| {
                let i = at;
                at += usize::from(present);
                present.then(|| operand(i))
            };
            let expand = d.expand.as_ref().map(|e| {
                let w = take(true).expect("expand weights");
                let epilogue = kfuse_routines::epilogue::Epilogue {
                    bias: take(e.bias).map(|b| b.storage),
                    scale: None,
                    residual: None,
                    activation: e.activation,
                };
                (e, w, epilogue)
            });
            let wd = take(true).expect("depthwise weights");
            let middle = kfuse_routines::epilogue::Epilogue {
                bias: take(d.bias).map(|b| b.storage),
                scale: None,
                residual: None,
                activation: d.activation,
            };
            let wp = take(true).expect("pointwise weights");
            let dtype = operand(0).storage.dtype();
            if matches!(dtype, kfuse_ir::DType::F16 | kfuse_ir::DType::BF16) {
                // The fused block is f32 only: in half precision each convolution runs on the
                // half-precision routine (every step rounded as the reference rounds it), its
                // result stored between them.
                let Anchor::Conv { conv, .. } = &call.anchor else {
                    unreachable!("a separable anchor is a convolution")
                };
                let stage =
                    |x: kfuse_routines::dense::View,
                     w: kfuse_routines::dense::View,
                     attrs: &kfuse_ir::Conv2dAttrs,
                     dims: &[usize],
                     epilogue: &kfuse_routines::epilogue::Epilogue| {
                        let mut y = Storage::zeros(dtype, dims.iter().product());
                        kfuse_routines::conv::conv2d(x, w, attrs, dims, &mut y, epilogue)
                            .map(|()| y)
                    };
                let expanded = match &expand {
                    Some((e, we, expand_epilogue)) => Some((
                        stage(
                            operand(0),
                            *we,
                            &e.attrs,
                            e.ty.shape.dims(),
                            expand_epilogue,
                        )?,
                        e.ty.shape.dims(),
                    )),
                    None => None,
                };
                let x = match &expanded {
                    Some((storage, dims)) => kfuse_routines::dense::View { storage, dims },
                    None => operand(0),
                };
                let dims = d.ty.shape.dims();
                let depthwise = stage(x, wd, &d.attrs, dims, &middle)?;
                let x = kfuse_routines::dense::View {
                    storage: &depthwise,
                    dims,
                };
                return kfuse_routines::conv::conv2d(x, wp, conv, out_dims, out, &epilogue);
            }
            match expand {
                Some((e, we, expand_epilogue)) => kfuse_routines::conv::inverted_residual(
                    operand(0),
                    (we, &e.attrs, e.ty.shape.dims(), &expand_epilogue),
                    (wd, &d.attrs, d.ty.shape.dims(), &middle),
                    wp,
                    out_dims,
                    out,
                    &epilogue,
                ),
                None => kfuse_routines::conv::separable(
                    operand(0),
                    wd,
                    &d.attrs,
                    d.ty.shape.dims(),
                    &middle,
                    wp,
                    out_dims,
                    out,
                    &epilogue,
                ),
            }
        }
        Anchor::Conv {
            depthwise: None,
            conv,
        } => match &call.pool {
            Some(pool) => kfuse_routines::conv::conv2d_pooled(
                operand(0),
                operand(1),
                conv,
                pool.conv_ty.shape.dims(),
                &epilogue,
                &pool.attrs,
                out_dims,
                out,
            ),
            None => {
                kfuse_routines::conv::conv2d(operand(0), operand(1), conv, out_dims, out, &epilogue)
            }
        },
        Anchor::MatMul { transposed } => kfuse_routines::matmul::matmul(
            operand(0),
            operand(1),
            [transposed[0].is_some(), transposed[1].is_some()],
            out_dims,
            out,
            &epilogue,
            kfuse_cpu::Pool::global().threads(),
        ),
    }
}
