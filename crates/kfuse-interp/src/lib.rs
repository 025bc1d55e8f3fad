//! The kfuse reference interpreter.
//!
//! Runs a graph op by op and materializes every intermediate. It is simple on purpose: it is the
//! correctness oracle every compiled path is checked against, and the unfused baseline every
//! speed-up is measured against. Numerics follow `kfuse-math` (transcendentals, min/max,
//! remainder) and the documented orders in [`reduce`] and [`linalg`].

pub mod elem;
pub mod elementwise;
mod indexing;
pub mod linalg;
mod movement;
pub mod reduce;
mod strided;

use std::collections::HashMap;
use std::sync::Arc;

use kfuse_ir::{AllocError, Array, DType, Graph, MemoryLimit, Op, Shape, Storage, TensorType};

/// A user-supplied function behind a `custom` op: operands in, results out.
pub type CustomFn = dyn Fn(&[Array]) -> Result<Vec<Array>, String> + Send + Sync;

/// The functions `custom` ops may call, by name. Passed to every run; there is no global registry.
#[derive(Clone, Default)]
pub struct CustomOps {
    fns: HashMap<String, Arc<CustomFn>>,
}

impl CustomOps {
    pub fn new() -> CustomOps {
        CustomOps::default()
    }

    /// Registers `f` under `name`, replacing any earlier function of that name.
    pub fn register(
        &mut self,
        name: impl Into<String>,
        f: impl Fn(&[Array]) -> Result<Vec<Array>, String> + Send + Sync + 'static,
    ) -> &mut Self {
        self.fns.insert(name.into(), Arc::new(f));
        self
    }

    fn get(&self, name: &str) -> Option<&Arc<CustomFn>> {
        self.fns.get(name)
    }
}

impl std::fmt::Debug for CustomOps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.fns.keys()).finish()
    }
}

/// Why a run failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InterpError {
    #[error("missing input {name:?} (expected {expected})")]
    MissingInput { name: String, expected: TensorType },
    #[error("input {name:?}: expected {expected}, found {found}")]
    InputType {
        name: String,
        expected: TensorType,
        found: TensorType,
    },
    #[error("{name:?} is not an input of this program (its inputs: {known})")]
    UnknownInput { name: String, known: String },
    #[error("node %{node} ({op}): {message}")]
    Runtime {
        node: u32,
        op: &'static str,
        message: String,
    },
    /// A node's result is larger than the memory left for it.
    #[error("node %{node} ({op}): {error}")]
    OutOfMemory {
        node: u32,
        op: &'static str,
        error: AllocError,
    },
}

/// Figures about a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Nodes executed.
    pub nodes: usize,
    /// Bytes written to materialize every node result.
    pub bytes_materialized: usize,
    /// Most bytes held live at once (inputs, intermediates and outputs).
    pub peak_bytes: usize,
}

/// Runs `graph` on named inputs and returns its outputs in declaration order. Results are
/// refused only where the allocator would fail; [`run_with_limit`] takes a figure of the memory
/// available.
pub fn run(
    graph: &Graph,
    inputs: &[(String, Array)],
    custom: &CustomOps,
) -> Result<Vec<(String, Array)>, InterpError> {
    run_with_stats(graph, inputs, custom).map(|(outputs, _)| outputs)
}

/// As [`run`], also returning [`RunStats`].
pub fn run_with_stats(
    graph: &Graph,
    inputs: &[(String, Array)],
    custom: &CustomOps,
) -> Result<(Vec<(String, Array)>, RunStats), InterpError> {
    run_with_limit(graph, inputs, custom, MemoryLimit::NONE)
}

/// As [`run_with_stats`], with every node's results checked against `limit`, less what the
/// values still live take, before the node runs: a result too large is
/// [`InterpError::OutOfMemory`], never an aborted process.
pub fn run_with_limit(
    graph: &Graph,
    inputs: &[(String, Array)],
    custom: &CustomOps,
    limit: MemoryLimit,
) -> Result<(Vec<(String, Array)>, RunStats), InterpError> {
    let mut given: HashMap<&str, &Array> = HashMap::new();
    for (name, array) in inputs {
        if !graph.inputs().any(|(_, n, _)| n == name) {
            let known: Vec<String> = graph
                .inputs()
                .map(|(_, n, t)| format!("{n:?}: {t}"))
                .collect();
            let known = if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            };
            return Err(InterpError::UnknownInput {
                name: name.clone(),
                known,
            });
        }
        given.insert(name, array);
    }
    for (_, name, ty) in graph.inputs() {
        match given.get(name) {
            None => {
                return Err(InterpError::MissingInput {
                    name: name.into(),
                    expected: ty.clone(),
                })
            }
            Some(a) if a.ty() != *ty => {
                return Err(InterpError::InputType {
                    name: name.into(),
                    expected: ty.clone(),
                    found: a.ty(),
                })
            }
            Some(_) => {}
        }
    }

    // The last node that reads each node's results; graph outputs live to the end.
    let n = graph.nodes().len();
    let mut last_use = vec![0usize; n];
    for id in graph.node_ids() {
        for v in &graph.node(id).operands {
            last_use[v.node.index()] = id.index();
        }
    }
    for out in graph.outputs() {
        last_use[out.value.node.index()] = usize::MAX;
    }

    let mut values: Vec<Option<Vec<Array>>> = vec![None; n];
    let mut stats = RunStats::default();
    let mut live_bytes = 0usize;
    for id in graph.node_ids() {
        let node = graph.node(id);
        let fail = |message: String| InterpError::Runtime {
            node: id.0,
            op: node.op.name(),
            message,
        };
        let bytes = reserve_results(&node.types, limit.after(live_bytes)).map_err(|error| {
            InterpError::OutOfMemory {
                node: id.0,
                op: node.op.name(),
                error,
            }
        })?;
        let operands: Vec<&Array> = node
            .operands
            .iter()
            .map(|v| {
                &values[v.node.index()]
                    .as_ref()
                    .expect("operands are computed before use")[v.result as usize]
            })
            .collect();
        let results = match &node.op {
            Op::Input { name, .. } => vec![(*given[name.as_str()]).clone()],
            // A splat constant holds one value until here; its elements are stored now,
            // allocated fallibly, so every op reads a dense array.
            Op::Constant { value } => {
                let mut value = value.clone();
                value
                    .materialize(limit.after(live_bytes))
                    .map_err(|error| InterpError::OutOfMemory {
                        node: id.0,
                        op: node.op.name(),
                        error,
                    })?;
                vec![value]
            }
            op => eval_op(op, &node.types, &operands, custom).map_err(fail)?,
        };
        debug_assert_eq!(
            results.iter().map(Array::ty).collect::<Vec<_>>(),
            node.types
        );
        stats.nodes += 1;
        stats.bytes_materialized += bytes;
        live_bytes += bytes;
        stats.peak_bytes = stats.peak_bytes.max(live_bytes);
        values[id.index()] = Some(results);
        // Free what no later node reads.
        for v in &node.operands {
            let producer = v.node.index();
            if last_use[producer] == id.index() && values[producer].is_some() {
                live_bytes -= graph
                    .node(v.node)
                    .types
                    .iter()
                    .map(TensorType::size_bytes)
                    .sum::<usize>();
                values[producer] = None;
            }
        }
        if last_use[id.index()] == 0 {
            // No node reads this one and it is no output: computed (and checked), not kept.
            live_bytes -= bytes;
            values[id.index()] = None;
        }
    }
    let outputs = graph
        .outputs()
        .iter()
        .map(|o| {
            let array = values[o.value.node.index()]
                .as_ref()
                .expect("outputs stay live")[o.value.result as usize]
                .clone();
            (o.name.clone(), array)
        })
        .collect();
    Ok((outputs, stats))
}

/// Checks that a node's results fit under `limit` and that the allocator grants them, and
/// returns their bytes. The ops allocate their results infallibly, so each result's bytes are
/// reserved here and released just before the op runs: a request the allocator refuses fails
/// here, as an error, instead of aborting inside the op.
fn reserve_results(types: &[TensorType], limit: MemoryLimit) -> Result<usize, AllocError> {
    let mut total = 0usize;
    for ty in types {
        let bytes = limit.after(total).check(ty)?;
        if Vec::<u8>::new().try_reserve_exact(bytes).is_err() {
            return Err(AllocError::Refused {
                ty: ty.clone(),
                bytes,
            });
        }
        total = total.saturating_add(bytes);
    }
    Ok(total)
}

/// Evaluates one op on operand arrays; `types` are the op's inferred result types. Graph inputs
/// are bound by [`run`], so `Op::Input` is an error here.
pub fn eval_op(
    op: &Op,
    types: &[TensorType],
    operands: &[&Array],
    custom: &CustomOps,
) -> Result<Vec<Array>, String> {
    let out = &types[0];
    let one = |a: Array| Ok(vec![a]);
    match op {
        Op::Input { name, .. } => Err(format!(
            "input {name:?} is bound by the caller, not evaluated"
        )),
        Op::Constant { value } => one(value.clone()),
        Op::Iota { ty, axis } => one(iota(ty, *axis)),
        Op::Rng { ty, dist, seed } => one(rng(ty, *dist, *seed)),
        Op::Unary(u) => one(elementwise::unary(*u, operands[0])),
        Op::Binary(b) => one(elementwise::binary(
            *b,
            operands[0],
            operands[1],
            &out.shape,
        )),
        Op::Compare(c) => one(elementwise::compare(
            *c,
            operands[0],
            operands[1],
            &out.shape,
        )),
        Op::Select => one(elementwise::select(
            operands[0],
            operands[1],
            operands[2],
            &out.shape,
        )),
        Op::Clamp => one(elementwise::clamp(
            operands[0],
            operands[1],
            operands[2],
            &out.shape,
        )),
        Op::Cast { to } => one(elementwise::cast(operands[0], *to)),
        Op::Reduce { op, axes, .. } => one(reduce::reduce(*op, operands[0], axes, out)),
        Op::Reshape { shape } => one(operands[0]
            .clone()
            .reshaped(shape.clone())
            .map_err(|e| e.to_string())?),
        Op::Permute { perm } => one(movement::permute(operands[0], perm, &out.shape)),
        Op::Broadcast { shape } => one(movement::broadcast(operands[0], shape)),
        Op::Slice { start, step, .. } => one(movement::slice(operands[0], start, step, &out.shape)),
        Op::Pad {
            low, mode, value, ..
        } => one(movement::pad(
            operands[0],
            low,
            *mode,
            value.value(),
            &out.shape,
        )),
        Op::Concat { axis } => one(movement::concat(operands, *axis, &out.shape)),
        Op::Flip { axes } => one(movement::flip(operands[0], axes)),
        Op::MatMul => one(linalg::matmul(operands[0], operands[1], out)),
        Op::Conv2d(attrs) => one(linalg::conv2d(operands[0], operands[1], attrs, out)),
        Op::Pool2d(attrs) => one(linalg::pool2d(operands[0], attrs, out)),
        Op::Gather { axis } => one(indexing::gather(operands[0], operands[1], *axis)?),
        Op::ScatterAdd { axis } => one(indexing::scatter_add(
            operands[0],
            operands[1],
            operands[2],
            *axis,
        )?),
        Op::Sort { axis, descending } => {
            let len = operands[0].shape().dims()[*axis];
            let (values, indices) = indexing::sort_lanes(operands[0], *axis, *descending, len);
            Ok(vec![values, indices])
        }
        Op::TopK { axis, k, largest } => {
            let (values, indices) = indexing::sort_lanes(operands[0], *axis, *largest, *k);
            Ok(vec![values, indices])
        }
        Op::Custom { name, outputs } => {
            let f = custom
                .get(name)
                .ok_or_else(|| format!("custom function {name:?} is not registered"))?;
            let owned: Vec<Array> = operands.iter().map(|a| (*a).clone()).collect();
            let results = f(&owned).map_err(|e| format!("custom function {name:?} failed: {e}"))?;
            let got: Vec<TensorType> = results.iter().map(Array::ty).collect();
            if &got != outputs {
                let list = |ts: &[TensorType]| {
                    ts.iter()
                        .map(|t| t.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                return Err(format!(
                    "custom function {name:?} returned {} but declared {}",
                    list(&got),
                    list(outputs)
                ));
            }
            Ok(results)
        }
    }
}

/// Elements of `iota` converted per block: the i64 coordinates of one block at a time sit
/// beside the result, not a whole second copy of it at eight bytes an element.
const IOTA_BLOCK: usize = 1 << 16;

fn iota(ty: &TensorType, axis: usize) -> Array {
    let strides = ty.shape.strides();
    let dim = ty.shape.dims()[axis];
    let n = ty.shape.n_elems();
    let mut result = Storage::zeros(ty.dtype, n);
    for start in (0..n).step_by(IOTA_BLOCK) {
        let end = (start + IOTA_BLOCK).min(n);
        let coords: Vec<i64> = (start..end)
            .map(|i| ((i / strides[axis]) % dim) as i64)
            .collect();
        let block = Array::new(Shape::new(vec![end - start]), Storage::I64(coords))
            .expect("one coordinate per element");
        // The same conversion as `cast`, so iota of every dtype rounds as a cast of its indices.
        let converted = elementwise::cast(&block, ty.dtype);
        kfuse_ir::with_storage!(&mut result, v => v[start..end].copy_from_slice(
            kfuse_ir::Element::slice(converted.storage()).expect("cast gives the result's dtype")
        ));
    }
    Array::new(ty.shape.clone(), result).expect("iota fills its shape")
}

fn rng(ty: &TensorType, dist: kfuse_ir::RngDist, seed: u64) -> Array {
    use kfuse_ir::RngDist::*;
    let n = ty.shape.n_elems() as u64;
    let shape: Shape = ty.shape.clone();
    if ty.dtype == DType::F64 {
        let v: Vec<f64> = (0..n)
            .map(|i| match dist {
                Uniform => kfuse_math::uniform_f64(seed, i),
                Normal => kfuse_math::normal_f64(seed, i),
            })
            .collect();
        return Array::new(shape, Storage::F64(v)).expect("rng fills its shape");
    }
    let v: Vec<f32> = (0..n)
        .map(|i| match dist {
            Uniform => kfuse_math::uniform_f32(seed, i),
            Normal => kfuse_math::normal_f32(seed, i),
        })
        .collect();
    let a = Array::new(shape, Storage::F32(v)).expect("rng fills its shape");
    elem::narrow(a, ty.dtype)
}
