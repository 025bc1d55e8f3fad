//! Dot merging: matmuls that share their left operand and have constant right operands become
//! one matmul over the concatenated weights, so the shared operand is read once.
//!
//! ```text
//! %q = matmul(%x, %wq)                       %w  = constant concat(wq, wk, wv) along N
//! %k = matmul(%x, %wk)            ==>        %y  = matmul(%x, %w)
//! %v = matmul(%x, %wv)                       %q  = slice(%y) [.., 0:Nq]   (and so on)
//! ```
//!
//! The slices are movement ops: the kernels that read `%q`, `%k` and `%v` read the merged result
//! through index arithmetic. A slice that is itself a graph output is copied, though, so the
//! merge is made only when the shared operand is at least as large as those copies: reading `x`
//! once must save more traffic than the copies add.

use std::collections::BTreeMap;

use kfuse_ir::{Array, Graph, NodeId, Op, Value};

use crate::rewrite::Rewriter;
use crate::{OptError, Pass, PassReport};

/// The dot-merging pass.
pub struct MergeDots;

/// The constant `[K, N]` right operand of a matmul, if it has one.
fn constant_rhs(graph: &Graph, id: NodeId) -> Option<&Array> {
    let node = graph.node(id);
    if node.op != Op::MatMul {
        return None;
    }
    match &graph.node(node.operands[1].node).op {
        Op::Constant { value } if value.shape().rank() == 2 => Some(value),
        _ => None,
    }
}

/// Groups of two or more matmuls with the same left operand, constant right operands of one
/// dtype and K, whose merge pays (see the module notes).
fn groups(graph: &Graph, report: &mut PassReport) -> Vec<Vec<NodeId>> {
    let mut by_lhs: BTreeMap<Value, Vec<NodeId>> = BTreeMap::new();
    for id in graph.node_ids() {
        if constant_rhs(graph, id).is_some() {
            by_lhs
                .entry(graph.node(id).operands[0])
                .or_default()
                .push(id);
        }
    }
    let mut out = Vec::new();
    for (lhs, ids) in by_lhs {
        let first = constant_rhs(graph, ids[0]).expect("grouped by constant rhs");
        let same: Vec<NodeId> = ids
            .into_iter()
            .filter(|&id| {
                let w = constant_rhs(graph, id).expect("grouped by constant rhs");
                w.dtype() == first.dtype() && w.shape().dims()[0] == first.shape().dims()[0]
            })
            .collect();
        if same.len() < 2 {
            continue;
        }
        let copies: usize = same
            .iter()
            .filter(|&&id| graph.outputs().iter().any(|o| o.value.node == id))
            .map(|&id| graph.node(id).types[0].size_bytes())
            .sum();
        let shared = graph.ty(lhs).size_bytes();
        if shared < copies {
            report.notes.push(format!(
                "matmuls {} share %{} but stay apart: copying their graph outputs out of a merged \
                 result ({copies} bytes) costs more than reading the shared operand once saves \
                 ({shared} bytes)",
                same.iter()
                    .map(|n| format!("%{}", n.0))
                    .collect::<Vec<_>>()
                    .join(", "),
                lhs.node.0
            ));
            continue;
        }
        out.push(same);
    }
    out
}

/// `[K, N1] ++ [K, N2] ++ ...` along N.
fn concat_columns(parts: &[&Array]) -> Array {
    let k = parts[0].shape().dims()[0];
    let n: usize = parts.iter().map(|p| p.shape().dims()[1]).sum();
    let mut values = Vec::with_capacity(k * n);
    for row in 0..k {
        for p in parts {
            let width = p.shape().dims()[1];
            values.extend((0..width).map(|c| p.get_f64(row * width + c)));
        }
    }
    let array = Array::from_vec(vec![k, n], values).expect("sizes add up");
    kfuse_interp::elementwise::cast(&array, parts[0].dtype())
}

impl Pass for MergeDots {
    fn name(&self) -> &'static str {
        "merge-dots"
    }

    fn run(&self, graph: &Graph, report: &mut PassReport) -> Result<Option<Graph>, OptError> {
        let groups = groups(graph, report);
        if groups.is_empty() {
            return Ok(None);
        }
        let mut out = Rewriter::new(self.name(), graph);
        for id in graph.node_ids() {
            if let Some(group) = groups.iter().find(|g| g[0] == id) {
                // The merged matmul goes where the first of the group was: every member's left
                // operand is the same value, defined before it.
                let parts: Vec<&Array> = group
                    .iter()
                    .map(|&m| constant_rhs(graph, m).expect("grouped"))
                    .collect();
                let weights = out.add(
                    Op::Constant {
                        value: concat_columns(&parts),
                    },
                    Vec::new(),
                )?;
                let lhs = graph.node(id).operands[0];
                let merged = out.add(Op::MatMul, vec![out.moved(lhs), weights])?;
                // The merged product has the first member's shape, wider along the last axis.
                let mut dims = graph.node(id).types[0].shape.dims().to_vec();
                let rank = dims.len();
                dims[rank - 1] = parts.iter().map(|p| p.shape().dims()[1]).sum();
                let mut at = 0;
                for (&member, part) in group.iter().zip(&parts) {
                    let width = part.shape().dims()[1];
                    let mut start = vec![0; rank];
                    let mut stop = dims.clone();
                    start[rank - 1] = at;
                    stop[rank - 1] = at + width;
                    let step = vec![1; rank];
                    let slice = out.add(Op::Slice { start, stop, step }, vec![merged])?;
                    out.replace(member, slice);
                    at += width;
                }
                report.notes.push(format!(
                    "matmuls {} read %{} once: one matmul over their concatenated weights",
                    group
                        .iter()
                        .map(|n| format!("%{}", n.0))
                        .collect::<Vec<_>>()
                        .join(", "),
                    lhs.node.0
                ));
                continue;
            }
            if !groups.iter().any(|g| g.contains(&id)) {
                out.copy(id)?;
            }
        }
        out.finish().map(Some)
    }
}
