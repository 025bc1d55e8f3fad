//! Automatic differentiation of kfuse graphs.
//!
//! [`grad`] is reverse mode as a graph-to-graph transform: it appends to a copy of the program the
//! backward nodes that compute the gradient of a scalar loss with respect to chosen values, and
//! returns an ordinary [`Graph`]. The result prints as `.kf`, runs on the reference interpreter and
//! compiles like any other program.
//!
//! ```text
//! %x = input() name="x" : f64[3]          %x = input() name="x" : f64[3]
//! %t = tanh(%x) : f64[3]                  %t = tanh(%x) : f64[3]
//! %l = reduce_sum(%t) axes=[0]      ==>   %l = reduce_sum(%t) axes=[0]
//! output "loss" = %l                      ... 1 - %t * %t, times the broadcast seed ...
//!                                         output "loss" = %l
//!                                         output "grad_x" = %g
//! ```
//!
//! Each op's vector-Jacobian product lives in [`vjp`] and is written with existing IR ops, so the
//! backward half goes through the same passes, fusion and backends as the forward half. Only the
//! values on a path from a requested value to the loss get a cotangent, so the backward half has
//! no dead nodes.

mod builder;
mod vjp;

use std::collections::HashMap;

use kfuse_ir::{Array, DType, Graph, IrError, NodeId, Op, Shape, TensorType, Value};

use builder::Builder;

/// Why a gradient cannot be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AutodiffError {
    /// The value lies on a path from a requested value to the loss but has no derivative: it is
    /// not a float (compare, argmax, a cast to an integer) or it is a non-float value asked for.
    #[error("node %{node} ({op}) is not differentiable: {why}")]
    NotDifferentiable {
        node: u32,
        op: &'static str,
        why: String,
    },
    /// The op has no gradient rule (yet), or not for these attributes.
    #[error("node %{node} ({op}) has no gradient rule")]
    Unsupported { node: u32, op: String },
    /// The loss must be one float element.
    #[error("the loss %{node} must be a scalar float (shape [] or one element), found {ty}")]
    LossNotScalar { node: u32, ty: TensorType },
    /// A value that the graph does not define.
    #[error("%{node}#{result} is not a value of the graph")]
    NoSuchValue { node: u32, result: u32 },
    /// An output name the gradient program needs (`loss`, `grad_<name>`) is already taken.
    #[error("the program already has an output called {0:?}")]
    OutputNameTaken(String),
    /// Building the backward graph failed; this is a bug in a gradient rule.
    #[error("building the gradient graph: {0}")]
    Ir(#[from] IrError),
}

/// Reverse-mode gradient of `loss` with respect to each of `wrt`.
///
/// The returned graph keeps the original nodes and outputs, adds `loss` as an output called
/// `"loss"` when it is not one already, and adds one output per entry of `wrt`: `grad_<name>` for
/// an input called `name`, `grad_<node>` for any other value. A requested value that does not
/// influence the loss gets a gradient of zeros.
pub fn grad(graph: &Graph, loss: Value, wrt: &[Value]) -> Result<Graph, AutodiffError> {
    let loss_ty = check_value(graph, loss)?.clone();
    if !loss_ty.dtype.is_float() || loss_ty.shape.n_elems() != 1 {
        return Err(AutodiffError::LossNotScalar {
            node: loss.node.0,
            ty: loss_ty,
        });
    }
    for &w in wrt {
        let ty = check_value(graph, w)?;
        if !ty.dtype.is_float() {
            return Err(not_differentiable(
                graph,
                w,
                format!("a gradient needs a float value, and this one is {ty}"),
            ));
        }
    }
    let on_path = path_to_loss(graph, loss, wrt)?;

    let mut b = Builder::new(graph.clone());
    // The cotangent of every value on the path, summed over its consumers.
    let mut cotangents: HashMap<Value, Value> = HashMap::new();
    let seed = b.full(&loss_ty, 1.0)?;
    cotangents.insert(loss, seed);
    for id in (0..graph.nodes().len() as u32).rev().map(NodeId) {
        let node = graph.node(id);
        if !on_path[id.index()] {
            continue;
        }
        let out_cts: Vec<Option<Value>> = (0..node.types.len() as u32)
            .map(|result| cotangents.get(&Value { node: id, result }).copied())
            .collect();
        if out_cts.iter().all(Option::is_none) {
            continue;
        }
        let wanted: Vec<bool> = node
            .operands
            .iter()
            .enumerate()
            .map(|(i, v)| carries_gradient(&node.op, i) && on_path[v.node.index()])
            .collect();
        if !wanted.iter().any(|&w| w) {
            continue;
        }
        let contributions = vjp::vjp(&mut b, graph, id, &out_cts, &wanted)?;
        for (operand, contribution) in node.operands.iter().zip(contributions) {
            let Some(contribution) = contribution else {
                continue;
            };
            let total = match cotangents.get(operand) {
                Some(&earlier) => b.binary(kfuse_ir::BinaryOp::Add, earlier, contribution)?,
                None => contribution,
            };
            cotangents.insert(*operand, total);
        }
    }

    let mut out = b.finish();
    if !out.outputs().iter().any(|o| o.value == loss) {
        add_output(&mut out, "loss".to_string(), loss)?;
    }
    for &w in wrt {
        let gradient = match cotangents.get(&w) {
            Some(&g) => g,
            None => {
                let ty = graph.ty(w).clone();
                let mut b = Builder::new(out);
                let zeros = b.full(&ty, 0.0)?;
                out = b.finish();
                zeros
            }
        };
        add_output(&mut out, gradient_name(graph, w), gradient)?;
    }
    Ok(out)
}

/// The output name of the gradient with respect to `value`: `grad_<input name>` for an input,
/// `grad_<node number>` otherwise.
pub fn gradient_name(graph: &Graph, value: Value) -> String {
    match &graph.node(value.node).op {
        Op::Input { name, .. } => format!("grad_{name}"),
        _ if value.result == 0 => format!("grad_{}", value.node.0),
        _ => format!("grad_{}_{}", value.node.0, value.result),
    }
}

fn add_output(graph: &mut Graph, name: String, value: Value) -> Result<(), AutodiffError> {
    if graph.outputs().iter().any(|o| o.name == name) {
        return Err(AutodiffError::OutputNameTaken(name));
    }
    Ok(graph.add_output(name, value)?)
}

fn check_value(graph: &Graph, value: Value) -> Result<&TensorType, AutodiffError> {
    graph.try_ty(value).ok_or(AutodiffError::NoSuchValue {
        node: value.node.0,
        result: value.result,
    })
}

fn not_differentiable(graph: &Graph, value: Value, why: String) -> AutodiffError {
    AutodiffError::NotDifferentiable {
        node: value.node.0,
        op: graph.node(value.node).op.name(),
        why,
    }
}

/// Operand positions through which a gradient flows. The condition of `select` and the index of
/// `gather` and `scatter_add` only choose, so a comparison or an argmax feeding them is not on
/// the path even when its operands are.
fn carries_gradient(op: &Op, operand: usize) -> bool {
    match op {
        Op::Select => operand != 0,
        Op::Gather { .. } | Op::ScatterAdd { .. } => operand != 1,
        _ => true,
    }
}

/// Marks the nodes that lie on a path from a requested value to the loss, and checks that every
/// value on such a path is a float.
fn path_to_loss(graph: &Graph, loss: Value, wrt: &[Value]) -> Result<Vec<bool>, AutodiffError> {
    let n = graph.nodes().len();
    let mut from_wrt = vec![false; n];
    for w in wrt {
        from_wrt[w.node.index()] = true;
    }
    for id in graph.node_ids() {
        let node = graph.node(id);
        if node.operands.iter().any(|v| from_wrt[v.node.index()]) {
            from_wrt[id.index()] = true;
        }
    }
    let mut to_loss = vec![false; n];
    to_loss[loss.node.index()] = true;
    for id in (0..graph.nodes().len() as u32).rev().map(NodeId) {
        if !to_loss[id.index()] {
            continue;
        }
        let node = graph.node(id);
        for (i, v) in node.operands.iter().enumerate() {
            if carries_gradient(&node.op, i) {
                to_loss[v.node.index()] = true;
            }
        }
    }
    let on_path: Vec<bool> = (0..n).map(|i| from_wrt[i] && to_loss[i]).collect();
    // Each value that carries a gradient from one path node into another must be a float. Only
    // the values actually used count, so the sorted values of `sort` and `topk` reach their rule
    // even though their indices are integers.
    for id in graph.node_ids().filter(|id| on_path[id.index()]) {
        let node = graph.node(id);
        for (i, v) in node.operands.iter().enumerate() {
            if !carries_gradient(&node.op, i) || !on_path[v.node.index()] {
                continue;
            }
            let t = graph.ty(*v);
            if !t.dtype.is_float() {
                return Err(not_differentiable(
                    graph,
                    *v,
                    format!("it lies between a requested value and the loss and computes {t}, which has no derivative"),
                ));
            }
        }
    }
    Ok(on_path)
}

/// A scalar constant of a float `dtype`.
fn scalar_array(dtype: DType, value: f64) -> Array {
    match dtype {
        DType::F32 => Array::scalar(value as f32),
        DType::F16 => Array::scalar(kfuse_ir::f16::from_f64(value)),
        DType::BF16 => Array::scalar(kfuse_ir::bf16::from_f64(value)),
        _ => Array::scalar(value),
    }
}

/// `shape` with the reduced `axes` kept as size 1.
fn keepdims_shape(shape: &Shape, axes: &[usize]) -> Shape {
    Shape::new(
        shape
            .dims()
            .iter()
            .enumerate()
            .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
            .collect::<Vec<_>>(),
    )
}
