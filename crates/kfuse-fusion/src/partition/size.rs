//! The cone of a kernel's output, walked from the output towards its inputs, and the size of
//! the kernel it makes.
//!
//! The walk visits nodes in decreasing id order, so that each node is reached after every
//! consumer that keeps it inline, and adds up what lowering will emit for it. Where the sum
//! passes the cost model's [`KernelLimits`], the walk stops and names the value to store there:
//! the kernel ends at it, and the rest of the cone becomes that value's own kernel.

use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use kfuse_ir::{Graph, NodeId, Op};

use super::views::{ViewId, Views};
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
    /// The whole cone: the nodes the kernel computes, the stored values it reads, its size, and
    /// the views each inline node is evaluated at.
    Cone {
        nodes: BTreeSet<NodeId>,
        inputs: BTreeSet<NodeId>,
        size: Size,
        views: BTreeMap<NodeId, Vec<ViewId>>,
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

/// What the walk knows of a node it has queued.
#[derive(Default)]
struct Reached {
    /// The views its consumers read it at so far.
    views: Vec<ViewId>,
    /// The most views any consumer is evaluated at.
    consumer_views: usize,
    /// Where recomputation last multiplied on the way from the output to this node: the node
    /// evaluated at more views than any of its consumers, and at how many. Storing it keeps
    /// what is above it and ends the multiplication.
    duplicated: Option<(NodeId, usize)>,
}

/// Walks the inline cone of `root` (the nodes a kernel writing `root` computes, up to the values
/// `is_stored` names), adding up its size over every view each node is evaluated at. With
/// `limits`, the walk stops where the size first passes them and names the node to store: where
/// recomputation last multiplied on the way there, if it did (storing it ends the
/// multiplication, and a stencil's steps then fuse as far as the limits allow), else the node
/// where the size passed. The root itself is never named, so a root too large on its own ends
/// its kernel at the first node below it.
pub(super) fn walk(
    graph: &Graph,
    root: NodeId,
    is_stored: &dyn Fn(NodeId) -> bool,
    limits: Option<KernelLimits>,
    views: &mut Views,
) -> Walk {
    let mut heap = BinaryHeap::from([root]);
    let mut reached: BTreeMap<NodeId, Reached> = BTreeMap::new();
    let root_view = views.identity(&graph.node(root).types[0].shape);
    reached.entry(root).or_default().views.push(root_view);
    let mut nodes = BTreeSet::new();
    let mut inputs: BTreeMap<NodeId, Vec<ViewId>> = BTreeMap::new();
    let mut node_views = BTreeMap::new();
    // The loop index and the store of the output.
    let mut size = Size {
        instructions: 2,
        transcendentals: 0,
    };
    // The limit the root alone passes, if it does: the kernel then ends at the next node.
    let mut passed: Option<String> = None;
    while let Some(id) = heap.pop() {
        let here = reached.remove(&id).expect("a queued node was reached");
        let n_views = here.views.len();
        let duplicated = if id != root && n_views > here.consumer_views {
            Some((id, n_views))
        } else {
            here.duplicated
        };
        // Each view of a queued node was charged a load, what the view costs should the node
        // be stored: the size never grows when a walk is repeated after a store, so a cut stays
        // where it was made.
        let one = node_size(graph, id);
        let mut grown = Size {
            instructions: size.instructions + n_views * one.instructions,
            transcendentals: size.transcendentals + n_views * one.transcendentals,
        };
        if id != root {
            grown.instructions -= n_views;
        }
        let node = graph.node(id);
        // The views of each operand, and what they add: a load per new view of a stored value,
        // a literal per scalar constant, a charge per new view of a node still to walk.
        let mut operand_views = Vec::with_capacity(node.operands.len());
        for (i, v) in node.operands.iter().enumerate() {
            let p = v.node;
            if class(graph, p) == Class::Scalar && !is_stored(p) {
                grown.instructions += usize::from(!nodes.contains(&p));
                operand_views.push(Vec::new());
                continue;
            }
            let mut fresh = Vec::new();
            for &view in &here.views {
                let w = views.operand(graph, id, i, view);
                let known = if is_stored(p) {
                    inputs.get(&p).is_some_and(|vs| vs.contains(&w))
                } else {
                    reached.get(&p).is_some_and(|r| r.views.contains(&w))
                };
                if !known && !fresh.contains(&w) {
                    fresh.push(w);
                }
            }
            grown.instructions += fresh.len();
            operand_views.push(fresh);
        }
        if let Some(limits) = limits {
            let fits = grown.within(limits);
            if id != root && (passed.is_some() || !fits) {
                let why = passed.unwrap_or_else(|| grown.passed(limits));
                let (node, reason) = match duplicated {
                    Some((d, count)) => (
                        d,
                        format!(
                            "the kernel of %{} would pass the limit of {why} evaluating it at each of the {count} indices it is read at",
                            root.0
                        ),
                    ),
                    _ => (
                        id,
                        format!(
                            "the kernel of %{} would pass the limit of {why} with it",
                            root.0
                        ),
                    ),
                };
                return Walk::Cut { node, reason };
            }
            if !fits {
                passed = Some(grown.passed(limits));
            }
        }
        size = grown;
        nodes.insert(id);
        node_views.insert(id, here.views);
        for (v, fresh) in node.operands.iter().zip(operand_views) {
            let p = v.node;
            if is_stored(p) {
                inputs.entry(p).or_default().extend(fresh);
            } else if class(graph, p) == Class::Scalar {
                nodes.insert(p);
            } else {
                let entry = reached.entry(p).or_insert_with(|| {
                    heap.push(p);
                    Reached::default()
                });
                entry.views.extend(fresh);
                entry.consumer_views = entry.consumer_views.max(n_views);
                entry.duplicated = entry.duplicated.max(duplicated);
            }
        }
    }
    Walk::Cone {
        nodes,
        inputs: inputs.into_keys().collect(),
        size,
        views: node_views,
    }
}
