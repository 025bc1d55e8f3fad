//! The cone of a kernel's output, walked from the output towards its inputs, and the size of
//! the kernel it makes.
//!
//! The walk visits nodes in decreasing id order, so that each node is reached after every
//! consumer that keeps it inline, and adds up what lowering will emit for it. Where the sum
//! passes the cost model's [`KernelLimits`], the walk stops and names the value to store there:
//! the kernel ends at it, and the rest of the cone becomes that value's own kernel.

use std::collections::{BTreeSet, BinaryHeap};

use kfuse_ir::{Graph, NodeId, Op};

use super::{class, Class};
use crate::cost::{transcendental, KernelLimits};

/// What a kernel holds, counted as lowering emits it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Size {
    pub instructions: usize,
    pub transcendentals: usize,
}

impl Size {
    pub fn plus(self, other: Size) -> Size {
        Size {
            instructions: self.instructions + other.instructions,
            transcendentals: self.transcendentals + other.transcendentals,
        }
    }

    pub fn within(self, limits: KernelLimits) -> bool {
        self.instructions <= limits.instructions && self.transcendentals <= limits.transcendentals
    }

    /// The limit this size passes, in words.
    fn passed(self, limits: KernelLimits) -> String {
        if self.transcendentals > limits.transcendentals {
            format!("{} transcendental functions", limits.transcendentals)
        } else {
            format!("{} instructions", limits.instructions)
        }
    }
}

/// The result of walking the cone of a kernel's output.
pub(super) enum Walk {
    /// The whole cone: the nodes the kernel computes, the stored values it reads, its size.
    Cone {
        nodes: BTreeSet<NodeId>,
        inputs: BTreeSet<NodeId>,
        size: Size,
    },
    /// The kernel passes a limit: storing `node` ends it there, for `reason`.
    Cut { node: NodeId, reason: String },
}

/// Instructions lowering emits for one evaluation of inline node `id`, index arithmetic
/// included; at least one, so that the estimate bounds the number of nodes too.
fn instructions(graph: &Graph, id: NodeId) -> usize {
    let node = graph.node(id);
    let out = &node.types[0].shape;
    let moved_axes = |moved: &dyn Fn(usize) -> bool| (0..out.rank()).filter(|&k| moved(k)).count();
    let n = match &node.op {
        Op::Clamp => 2,
        Op::Reduce { op, axes, .. } if !axes.is_empty() => match op {
            kfuse_ir::ReduceOp::Mean => 6,
            _ => 3,
        },
        Op::Reduce { .. } => 2,
        Op::Reshape { .. } => 2 * out.rank() + 2,
        Op::Slice { start, step, .. } => 2 * moved_axes(&|k| start[k] != 0 || step[k] != 1),
        Op::Pad { low, high, .. } => 8 * moved_axes(&|k| low[k] != 0 || high[k] != 0),
        Op::Flip { axes } => 2 * axes.len(),
        Op::Concat { .. } => 6 * node.operands.len(),
        _ => 1,
    };
    n.max(1)
}

/// One evaluation of `id` inside a kernel.
fn node_size(graph: &Graph, id: NodeId) -> Size {
    Size {
        instructions: instructions(graph, id),
        transcendentals: usize::from(transcendental(&graph.node(id).op)),
    }
}

/// Walks the inline cone of `root` (the nodes a kernel writing `root` computes, up to the values
/// `is_stored` names), adding up its size. With `limits`, the walk stops where the size first
/// passes them and names the node to store there; the root itself is never named, so a root too
/// large on its own ends its kernel at the first node below it.
pub(super) fn walk(
    graph: &Graph,
    root: NodeId,
    is_stored: &dyn Fn(NodeId) -> bool,
    limits: Option<KernelLimits>,
) -> Walk {
    let mut heap = BinaryHeap::from([root]);
    let mut queued = BTreeSet::from([root]);
    let mut nodes = BTreeSet::new();
    let mut inputs = BTreeSet::new();
    // The loop index and the store of the output.
    let mut size = Size {
        instructions: 2,
        transcendentals: 0,
    };
    // The limit the root alone passes, if it does: the kernel then ends at the next node.
    let mut passed: Option<String> = None;
    while let Some(id) = heap.pop() {
        // Each queued node was charged a load, what it costs should it be stored: the size then
        // never grows when a walk is repeated after a store, and a cut stays where it was.
        let mut grown = size.plus(node_size(graph, id));
        if id != root {
            grown.instructions -= 1;
        }
        let operands = &graph.node(id).operands;
        for v in operands {
            let p = v.node;
            let fresh = if is_stored(p) {
                !inputs.contains(&p)
            } else if class(graph, p) == Class::Scalar {
                !nodes.contains(&p)
            } else {
                !queued.contains(&p)
            };
            grown.instructions += usize::from(fresh);
        }
        if let Some(limits) = limits {
            let fits = grown.within(limits);
            if id != root && (passed.is_some() || !fits) {
                let why = passed.unwrap_or_else(|| grown.passed(limits));
                return Walk::Cut {
                    node: id,
                    reason: format!(
                        "the kernel of %{} would pass the limit of {why} with it",
                        root.0
                    ),
                };
            }
            if !fits {
                passed = Some(grown.passed(limits));
            }
        }
        size = grown;
        nodes.insert(id);
        for v in operands {
            let p = v.node;
            if is_stored(p) {
                inputs.insert(p);
            } else if class(graph, p) == Class::Scalar {
                nodes.insert(p);
            } else if queued.insert(p) {
                heap.push(p);
            }
        }
    }
    Walk::Cone {
        nodes,
        inputs,
        size,
    }
}
