//! Layout assignment: NHWC convolutions and poolings take their NCHW form where that pays.
//!
//! The CPU backend's NCHW convolutions have Winograd and direct kernels; NHWC ones run as one
//! GEMM per tap or on im2col columns, 1.4–2.5 times slower beyond 1×1 filters. So this pass
//! gives NHWC `conv2d` and `pool2d` nodes their NCHW form, with the elementwise ops between
//! them (bias, batchnorm, activations, residual adds) carried along, and changes the layout
//! only where the region meets the rest of the graph:
//!
//! ```text
//! %c = conv2d(%x, %w) layout=nhwc              %t  = permute(%x) perm=[0, 3, 1, 2]
//! %b = add(%c, %bias)        (bias: [C])  ==>  %c' = conv2d(%t, %w) layout=nchw
//! %r = relu(%b)                                %b' = add(%c', %bias')   (bias': [C, 1, 1])
//! %d = conv2d(%r, %w2) layout=nhwc             %r' = relu(%b')
//! output "y" = %d                              %d' = conv2d(%r', %w2) layout=nchw
//!                                              %y  = permute(%d') perm=[0, 2, 3, 1]
//! ```
//!
//! A *region* is a connected set of NHWC `conv2d`/`pool2d` nodes and rank-4 elementwise ops,
//! joined through the activations they pass one another (a convolution's weights are not a
//! join). Its *edges* are the values that change layout: activations entering it, and its
//! values read outside it or returned. Entering constants are permuted at compile time, scalars
//! need nothing, values a `permute` already produced compose with it, results read by a
//! `permute` compose into it, and a reduction of a region value reduces the NCHW value where
//! that keeps the reduced axes in order (so it sums in the same order). Weights keep their
//! `[C_out, C_in / groups, KH, KW]` form, which both layouts share.
//!
//! Whether a region changes layout is priced: each convolution's estimated time at the
//! reference machine's peak (`max(flops / F, bytes / B)`) times its NHWC slowdown less one
//! ([`nhwc_slowdown`]), against a copy (read and write at `B`) of every other edge value. A
//! region of one depthwise convolution between graph inputs and outputs stays NHWC; a network
//! of them changes, edges at its input and output only.
//!
//! Every rewrite is exact: elementwise ops and permutes do not round, and a convolution or
//! pooling sums the same products in either layout on the reference interpreter. The compiled
//! convolutions' summation orders differ between layouts, which is why the pass runs in fast
//! numerics only (strict numerics runs convolutions on the reference anyway).

use std::collections::{HashMap, HashSet};

use kfuse_ir::{Graph, Layout, NodeId, Op, Shape, TensorType, Value};

use crate::rewrite::Rewriter;
use crate::{OptError, Pass, PassReport};

/// `permute(nhwc, TO_NCHW)` is the NCHW form of an NHWC value.
const TO_NCHW: [usize; 4] = [0, 3, 1, 2];
/// `permute(nchw, TO_NHWC)` is the NHWC form of an NCHW value.
const TO_NHWC: [usize; 4] = [0, 2, 3, 1];

/// The layout-assignment pass, with the machine figures it prices regions by.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvLayout {
    /// Convolution throughput of the NCHW routines, FLOP/s (both cores).
    pub flops_per_second: f64,
    /// Memory bandwidth for a layout change, bytes/s (read and write each count).
    pub bytes_per_second: f64,
}

impl Default for ConvLayout {
    /// The reference machine: 2 cores with AVX-512 (about 350 GFLOP/s at the FMA peak, NCHW
    /// convolutions reaching 200–340), about 20 GB/s.
    fn default() -> Self {
        ConvLayout {
            flops_per_second: 250e9,
            bytes_per_second: 20e9,
        }
    }
}

/// How many times longer the CPU backend takes for a node's NHWC form than for its NCHW form
/// (1 for no difference), rounded from `conv::conv2d` timed alone in both layouts
/// (`docs/structured-ops.md`, "Measurements behind design choices"): convolutions beyond 1×1
/// filters and stride-1 depthwise ones are slower in NHWC, 1×1 ones lead one way or the other
/// by shape, and strided depthwise ones run alike. Pooling has 16-lane kernels in both layouts.
pub fn nhwc_slowdown(graph: &Graph, id: NodeId) -> f64 {
    let node = graph.node(id);
    let Op::Conv2d(attrs) = &node.op else {
        return 1.0;
    };
    let w = graph.ty(node.operands[1]).shape.dims();
    let c_in = graph.ty(node.operands[0]).shape.dims()[3];
    if w[2] * w[3] == 1 {
        // Mixed, one way and the other: no claim either way.
        1.0
    } else if attrs.groups > 1 && attrs.groups == c_in {
        if attrs.stride == [1, 1] {
            1.6
        } else {
            1.0
        }
    } else {
        1.5
    }
}

/// Whether `id` is an NHWC convolution or pooling.
fn is_nhwc(graph: &Graph, id: NodeId) -> bool {
    match &graph.node(id).op {
        Op::Conv2d(a) => a.layout == Layout::Nhwc,
        Op::Pool2d(a) => a.layout == Layout::Nhwc,
        _ => false,
    }
}

/// Whether `id` is an elementwise op with one rank-4 result.
fn is_elementwise(graph: &Graph, id: NodeId) -> bool {
    let node = graph.node(id);
    matches!(
        node.op,
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Clamp | Op::Cast { .. }
    ) && node.types.len() == 1
        && node.types[0].shape.rank() == 4
}

/// Whether operand `i` of `id` carries an activation in the node's layout.
fn is_flow(graph: &Graph, id: NodeId, i: usize) -> bool {
    if is_nhwc(graph, id) {
        i == 0
    } else {
        is_elementwise(graph, id)
    }
}

/// `permute(permute(x, p), q) == permute(x, compose(p, q))`.
fn compose(p: &[usize], q: &[usize]) -> Vec<usize> {
    q.iter().map(|&i| p[i]).collect()
}

fn is_identity(p: &[usize]) -> bool {
    p.iter().enumerate().all(|(i, &a)| i == a)
}

/// Whether permuting `dims` by `perm` keeps the order of the axes longer than 1, so the
/// permute is a reshape.
fn only_moves_ones(dims: &[usize], perm: &[usize]) -> bool {
    let kept: Vec<usize> = perm.iter().copied().filter(|&a| dims[a] != 1).collect();
    kept.windows(2).all(|w| w[0] < w[1])
}

/// A reduction of a region value, redone on the NCHW value: the axes it reduces there, and
/// the permutation taking its result to the original one. `None` where the reduced axes would
/// change order (the sum's order would change).
fn reduce_on_nchw(axes: &[usize], keepdims: bool) -> Option<(Vec<usize>, Vec<usize>)> {
    // NHWC axis `a` is NCHW axis `TO_NHWC[a]`.
    let mapped: Vec<usize> = axes.iter().map(|&a| TO_NHWC[a]).collect();
    if !mapped.windows(2).all(|w| w[0] < w[1]) {
        return None;
    }
    let perm = if keepdims {
        TO_NHWC.to_vec()
    } else {
        let nhwc_kept: Vec<usize> = (0..4).filter(|a| !axes.contains(a)).collect();
        let nchw_kept: Vec<usize> = (0..4).filter(|a| !mapped.contains(a)).collect();
        nhwc_kept
            .iter()
            .map(|&a| {
                nchw_kept
                    .iter()
                    .position(|&b| b == TO_NHWC[a])
                    .expect("kept axes map to kept axes")
            })
            .collect()
    };
    Some((mapped, perm))
}

/// How a value leaves its region at one use.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Exit {
    /// Read by a `permute`, which composes with the layout change.
    Permute,
    /// Reduced, on the NCHW value.
    Reduce,
    /// Read in NHWC: a permute back.
    Copy,
}

/// A region's nodes and its price.
struct Region {
    nodes: Vec<NodeId>,
    /// The layout-bearing nodes, for the report.
    anchors: Vec<NodeId>,
    saving: f64,
    cost: f64,
    /// The layout changes that cost anything (not constants, scalars or composed permutes).
    edges: usize,
    /// Nodes whose value is read in NHWC outside the region (or returned).
    exits: Vec<NodeId>,
}

struct Plan {
    /// Per node, the index of its region, if it is in one that changes layout.
    region_of: Vec<Option<usize>>,
    /// Nodes whose value is read in NHWC outside the region (or returned).
    copied_out: Vec<bool>,
}

/// `s` seconds in ms, or in us below 0.1 ms.
fn seconds(s: f64) -> String {
    if s >= 1e-4 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.2} us", s * 1e6)
    }
}

fn find(parent: &mut [usize], mut i: usize) -> usize {
    while parent[i] != i {
        parent[i] = parent[parent[i]];
        i = parent[i];
    }
    i
}

impl ConvLayout {
    /// The estimated seconds that node `id`'s NCHW form saves.
    fn saving(&self, graph: &Graph, id: NodeId) -> f64 {
        let slowdown = nhwc_slowdown(graph, id);
        if slowdown <= 1.0 {
            return 0.0;
        }
        let node = graph.node(id);
        let out = &node.types[0];
        let w = graph.ty(node.operands[1]);
        let [_, cg, kh, kw] = w.shape.dims()[..] else {
            return 0.0;
        };
        let flops = 2.0 * (out.shape.n_elems() * cg * kh * kw) as f64;
        let bytes =
            (graph.ty(node.operands[0]).size_bytes() + w.size_bytes() + out.size_bytes()) as f64;
        let t = (flops / self.flops_per_second).max(bytes / self.bytes_per_second);
        t * (slowdown - 1.0)
    }

    /// Seconds to copy a value of `bytes` to another layout.
    fn copy(&self, bytes: usize) -> f64 {
        2.0 * bytes as f64 / self.bytes_per_second
    }

    fn exit(graph: &Graph, user: NodeId, i: usize, region: &[bool]) -> Option<Exit> {
        if region[user.index()] && is_flow(graph, user, i) {
            return None;
        }
        Some(match &graph.node(user).op {
            Op::Permute { .. } => Exit::Permute,
            Op::Reduce { axes, keepdims, .. } if reduce_on_nchw(axes, *keepdims).is_some() => {
                Exit::Reduce
            }
            _ => Exit::Copy,
        })
    }

    /// The entry price of value `v` (an operand of a region node from outside it).
    fn entry_cost(&self, graph: &Graph, v: Value) -> f64 {
        let ty = graph.ty(v);
        match &graph.node(v.node).op {
            Op::Constant { .. } => 0.0,
            _ if ty.shape.rank() == 0 => 0.0,
            Op::Permute { perm } if is_identity(&compose(perm, &TO_NCHW)) => 0.0,
            _ => self.copy(ty.size_bytes()),
        }
    }

    fn plan(&self, graph: &Graph, report: &mut PassReport) -> Plan {
        let n = graph.nodes().len();
        let member = |id: NodeId| is_nhwc(graph, id) || is_elementwise(graph, id);
        let mut parent: Vec<usize> = (0..n).collect();
        for id in graph.node_ids().filter(|&id| member(id)) {
            for (i, v) in graph.node(id).operands.iter().enumerate() {
                if is_flow(graph, id, i) && member(v.node) {
                    let (a, b) = (
                        find(&mut parent, id.index()),
                        find(&mut parent, v.node.index()),
                    );
                    parent[a] = b;
                }
            }
        }
        let mut by_root: HashMap<usize, Vec<NodeId>> = HashMap::new();
        for id in graph.node_ids().filter(|&id| member(id)) {
            by_root
                .entry(find(&mut parent, id.index()))
                .or_default()
                .push(id);
        }
        let mut users: Vec<Vec<(NodeId, usize)>> = vec![Vec::new(); n];
        for id in graph.node_ids() {
            for (i, v) in graph.node(id).operands.iter().enumerate() {
                users[v.node.index()].push((id, i));
            }
        }
        let returned: Vec<bool> = {
            let mut r = vec![false; n];
            graph
                .outputs()
                .iter()
                .for_each(|o| r[o.value.node.index()] = true);
            r
        };
        let mut regions: Vec<Region> = by_root
            .into_values()
            .filter(|nodes| nodes.iter().any(|&id| is_nhwc(graph, id)))
            .map(|mut nodes| {
                nodes.sort();
                let mut inside = vec![false; n];
                nodes.iter().for_each(|id| inside[id.index()] = true);
                let mut entries: Vec<Value> = Vec::new();
                let mut entered: HashSet<Value> = HashSet::new();
                let mut exits: Vec<NodeId> = Vec::new();
                for &id in &nodes {
                    for (i, &v) in graph.node(id).operands.iter().enumerate() {
                        if is_flow(graph, id, i) && !inside[v.node.index()] && entered.insert(v) {
                            entries.push(v);
                        }
                    }
                    let copied = returned[id.index()]
                        || users[id.index()]
                            .iter()
                            .any(|&(u, i)| Self::exit(graph, u, i, &inside) == Some(Exit::Copy));
                    if copied {
                        exits.push(id);
                    }
                }
                let costs: Vec<f64> = entries
                    .iter()
                    .map(|&v| self.entry_cost(graph, v))
                    .chain(
                        exits
                            .iter()
                            .map(|&id| self.copy(graph.node(id).types[0].size_bytes())),
                    )
                    .collect();
                let anchors: Vec<NodeId> = nodes
                    .iter()
                    .copied()
                    .filter(|&id| is_nhwc(graph, id))
                    .collect();
                let saving = anchors.iter().map(|&id| self.saving(graph, id)).sum();
                Region {
                    nodes,
                    anchors,
                    saving,
                    cost: costs.iter().sum(),
                    edges: costs.iter().filter(|&&c| c > 0.0).count(),
                    exits,
                }
            })
            .collect();
        regions.sort_by_key(|r| r.nodes[0]);
        let mut region_of = vec![None; n];
        let mut copied_out = vec![false; n];
        let mut chosen = 0;
        for r in &regions {
            let names: Vec<String> = r
                .anchors
                .iter()
                .map(|id| format!("{} %{}", graph.node(*id).op.name(), id.0))
                .collect();
            let figures = format!(
                "about {} saved against {} for {} layout change(s) at the edges",
                seconds(r.saving),
                seconds(r.cost),
                r.edges
            );
            if r.saving <= r.cost {
                report
                    .notes
                    .push(format!("NHWC kept for {}: {figures}", names.join(", ")));
                continue;
            }
            report.notes.push(format!(
                "NCHW for {} and {} elementwise op(s) between them: {figures}",
                names.join(", "),
                r.nodes.len() - r.anchors.len()
            ));
            for &id in &r.nodes {
                region_of[id.index()] = Some(chosen);
            }
            for &id in &r.exits {
                copied_out[id.index()] = true;
            }
            chosen += 1;
        }
        Plan {
            region_of,
            copied_out,
        }
    }
}

/// The rewrite: per old value in a changed region, its NCHW form; entries memoized.
struct Assign<'g> {
    graph: &'g Graph,
    plan: Plan,
    out: Rewriter<'g>,
    nchw: HashMap<Value, Value>,
    entries: HashMap<Value, Value>,
}

impl Assign<'_> {
    /// Old value `v` as a new value and the permutation from it: `v == permute(new, perm)`.
    fn view(&self, v: Value) -> (Value, Vec<usize>) {
        match self.nchw.get(&v) {
            Some(&n) => (n, TO_NHWC.to_vec()),
            None => (
                self.out.moved(v),
                (0..self.graph.ty(v).shape.rank()).collect(),
            ),
        }
    }

    /// `permute(x, perm)`, as `x` itself where `perm` is the identity and as a reshape where it
    /// only moves axes of length 1.
    fn permute(&mut self, x: Value, perm: Vec<usize>) -> Result<Value, OptError> {
        if is_identity(&perm) {
            return Ok(x);
        }
        let dims = self.out_dims(x);
        if only_moves_ones(&dims, &perm) {
            let shape = Shape::new(perm.iter().map(|&a| dims[a]).collect::<Vec<_>>());
            return self.out.add(Op::Reshape { shape }, vec![x]);
        }
        self.out.add(Op::Permute { perm }, vec![x])
    }

    fn out_dims(&self, x: Value) -> Vec<usize> {
        self.out.ty(x).shape.dims().to_vec()
    }

    /// The NCHW form of old value `v`, which enters a region: a rank-4 activation, or an
    /// operand of lower rank broadcast against one (aligned at the last axis, as numpy does),
    /// then shaped to broadcast against the NCHW form with its leading ones dropped.
    fn entry(&mut self, v: Value) -> Result<Value, OptError> {
        if let Some(&e) = self.entries.get(&v) {
            return Ok(e);
        }
        let dims = self.graph.ty(v).shape.dims().to_vec();
        if dims.is_empty() {
            return Ok(self.out.moved(v));
        }
        let rank4: Vec<usize> = std::iter::repeat_n(1, 4 - dims.len())
            .chain(dims.iter().copied())
            .collect();
        let nchw: Vec<usize> = TO_NCHW.iter().map(|&a| rank4[a]).collect();
        let trimmed: Vec<usize> = match dims.len() {
            4 => nchw.clone(),
            _ => nchw.iter().copied().skip_while(|&d| d == 1).collect(),
        };
        let e = match &self.graph.node(v.node).op {
            Op::Constant { value } => {
                let shaped = value
                    .clone()
                    .reshaped(Shape::new(rank4))
                    .expect("same element count");
                let ty = TensorType::new(shaped.dtype(), nchw);
                let permuted = kfuse_interp::eval_op(
                    &Op::Permute {
                        perm: TO_NCHW.to_vec(),
                    },
                    &[ty],
                    &[&shaped],
                    &kfuse_interp::CustomOps::default(),
                )
                .expect("a permute of a rank-4 constant evaluates")
                .remove(0);
                let value = permuted
                    .reshaped(Shape::new(trimmed))
                    .expect("same element count");
                self.out.add(Op::Constant { value }, Vec::new())?
            }
            Op::Permute { perm } if dims.len() == 4 => {
                let source = self.graph.node(v.node).operands[0];
                let (x, p) = self.view(source);
                self.permute(x, compose(&compose(&p, perm), &TO_NCHW))?
            }
            // A value from outside the region: no region's NCHW form to start from.
            _ if only_moves_ones(&rank4, &TO_NCHW) => {
                let x = self.out.moved(v);
                let shape = Shape::new(trimmed);
                self.out.add(Op::Reshape { shape }, vec![x])?
            }
            _ => {
                let mut x = self.out.moved(v);
                if dims.len() < 4 {
                    let shape = Shape::new(rank4);
                    x = self.out.add(Op::Reshape { shape }, vec![x])?;
                }
                let perm = TO_NCHW.to_vec();
                x = self.out.add(Op::Permute { perm }, vec![x])?;
                if nchw != trimmed {
                    let shape = Shape::new(trimmed);
                    x = self.out.add(Op::Reshape { shape }, vec![x])?;
                }
                x
            }
        };
        self.entries.insert(v, e);
        Ok(e)
    }

    fn node(&mut self, id: NodeId) -> Result<(), OptError> {
        let graph = self.graph;
        let node = graph.node(id);
        if self.plan.region_of[id.index()].is_some() {
            let mut operands = Vec::with_capacity(node.operands.len());
            for (i, &v) in node.operands.iter().enumerate() {
                operands.push(if !is_flow(graph, id, i) {
                    self.out.moved(v)
                } else if let Some(&n) = self.nchw.get(&v) {
                    n
                } else {
                    self.entry(v)?
                });
            }
            let op = match &node.op {
                Op::Conv2d(a) => Op::Conv2d(kfuse_ir::Conv2dAttrs {
                    layout: Layout::Nchw,
                    ..a.clone()
                }),
                Op::Pool2d(a) => Op::Pool2d(kfuse_ir::Pool2dAttrs {
                    layout: Layout::Nchw,
                    ..a.clone()
                }),
                op => op.clone(),
            };
            let new = self.out.add(op, operands)?;
            self.nchw.insert(Value::of(id), new);
            if self.plan.copied_out[id.index()] {
                let back = self.permute(new, TO_NHWC.to_vec())?;
                self.out.replace(id, back);
            }
            return Ok(());
        }
        let from_region = node
            .operands
            .first()
            .and_then(|v| self.nchw.get(v).copied());
        match (&node.op, from_region) {
            (Op::Permute { perm }, Some(x)) => {
                let value = self.permute(x, compose(&TO_NHWC, perm))?;
                self.out.replace(id, value);
            }
            (Op::Reduce { op, axes, keepdims }, Some(x))
                if reduce_on_nchw(axes, *keepdims).is_some() =>
            {
                let (axes, perm) = reduce_on_nchw(axes, *keepdims).expect("checked above");
                let reduced = self.out.add(
                    Op::Reduce {
                        op: *op,
                        axes,
                        keepdims: *keepdims,
                    },
                    vec![x],
                )?;
                let value = self.permute(reduced, perm)?;
                self.out.replace(id, value);
            }
            _ => self.out.copy(id)?,
        }
        Ok(())
    }
}

impl Pass for ConvLayout {
    fn name(&self) -> &'static str {
        "conv-layout"
    }

    fn run(&self, graph: &Graph, report: &mut PassReport) -> Result<Option<Graph>, OptError> {
        let plan = self.plan(graph, report);
        if plan.region_of.iter().all(Option::is_none) {
            return Ok(None);
        }
        let mut assign = Assign {
            graph,
            plan,
            out: Rewriter::new(self.name(), graph),
            nchw: HashMap::new(),
            entries: HashMap::new(),
        };
        for id in graph.node_ids() {
            assign.node(id)?;
        }
        assign.out.finish().map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reductions_move_to_nchw_only_in_order() {
        // Mean over H and W: NCHW axes 2 and 3; [N, C] is already in order.
        assert_eq!(
            reduce_on_nchw(&[1, 2], false),
            Some((vec![2, 3], vec![0, 1]))
        );
        // Kept dims: the [N, C, 1, 1] result permutes back to [N, 1, 1, C].
        assert_eq!(
            reduce_on_nchw(&[1, 2], true),
            Some((vec![2, 3], TO_NHWC.to_vec()))
        );
        // Over W and C: NCHW axes 3 and 1, the other way round.
        assert_eq!(reduce_on_nchw(&[2, 3], false), None);
        // Over C alone: [N, H, W] from NCHW's [N, H, W] too.
        assert_eq!(reduce_on_nchw(&[3], false), Some((vec![1], vec![0, 1, 2])));
        // Over N and H: [W, C] from NCHW's [C, W].
        assert_eq!(
            reduce_on_nchw(&[0, 1], false),
            Some((vec![0, 2], vec![1, 0]))
        );
    }

    #[test]
    fn permutes_compose() {
        // NHWC back to NCHW is the identity.
        assert!(is_identity(&compose(&TO_NHWC, &TO_NCHW)));
        assert!(is_identity(&compose(&TO_NCHW, &TO_NHWC)));
        assert_eq!(compose(&[1, 2, 0], &[2, 0, 1]), vec![0, 1, 2]);
        assert!(only_moves_ones(&[8, 1, 1, 64], &[0, 3, 1, 2]));
        assert!(!only_moves_ones(&[8, 7, 1, 64], &[0, 3, 1, 2]));
    }
}
