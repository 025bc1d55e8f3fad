//! The partitioner: which values are stored to memory, and which nodes each kernel computes.
//!
//! A value is either *materialized* (written to a buffer by the kernel that computes it, with the
//! reason recorded) or *inline* (recomputed inside every kernel that reads it, from registers).
//! Each materialized fusible node roots a kernel whose body is its inline cone. Kernels that share
//! a domain are then merged into multi-output kernels when neither depends on the other. Every
//! decision is a value: `FusionDecision::Forbid(reason)` for boundaries. A kernel also ends where
//! its estimated size would pass the cost model's `KernelLimits` (see `size`): the value there is
//! stored.
//!
//! A kernel's *domain* is the index space it loops over: the shape of its element-level outputs,
//! with `reduce` axes looped innermost when it contains reductions. A reduction may stay inline
//! only where it is read at the current row (its kept coordinates equal the domain's outer
//! coordinates), which is what makes softmax and layer norm single, row-persistent kernels.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use crate::structured::{structured_groups, StructuredGroup};
use kfuse_ir::{Graph, NodeId, Op, Shape};

use crate::cost::{CostModel, KernelLimits};

mod size;
mod views;

use size::{walk, Size, Walk};
use views::{ViewId, Views};

/// How aggressively to fuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FusePolicy {
    /// Every op is its own kernel (a compiled version of the unfused interpreter).
    None,
    /// Fuse everything legal; recompute shared values wherever they are read.
    Greedy,
    /// Fuse where the cost model says it pays; store shared values when recomputing costs more.
    Cost,
}

impl FusePolicy {
    pub fn name(self) -> &'static str {
        match self {
            FusePolicy::None => "none",
            FusePolicy::Greedy => "greedy",
            FusePolicy::Cost => "cost",
        }
    }

    pub fn from_name(name: &str) -> Option<FusePolicy> {
        [FusePolicy::None, FusePolicy::Greedy, FusePolicy::Cost]
            .into_iter()
            .find(|p| p.name() == name)
    }
}

/// The outcome of asking whether a value may stay inline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FusionDecision {
    Allow,
    Forbid(String),
}

/// What a kernel is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelKind {
    /// Generated code over `domain`; the `reduce` axes of the domain are looped innermost and
    /// reduced by the kernel's reductions.
    Fused { domain: Shape, reduce: Vec<usize> },
    /// One structured or opaque op run by a library routine.
    Library,
    /// A convolution with the neighbours it absorbs, run by one library routine.
    Structured(StructuredGroup),
}

/// One kernel of a partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    pub kind: KernelKind,
    /// Nodes computed in this kernel, in topological order.
    pub nodes: Vec<NodeId>,
    /// Nodes whose results this kernel writes to memory.
    pub outputs: Vec<NodeId>,
    /// Materialized nodes this kernel reads.
    pub inputs: Vec<NodeId>,
}

/// A graph cut into kernels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    pub policy: FusePolicy,
    /// Kernels in an order that respects their dependencies.
    pub kernels: Vec<Kernel>,
    /// Every materialized node and why it is stored.
    pub stored: BTreeMap<NodeId, String>,
    /// Fusion choices the cost model made in favour of recomputation.
    pub notes: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Input,
    ConstData,
    /// A one-element constant: inlined as a literal.
    Scalar,
    Fusible,
    Library,
}

fn class(graph: &Graph, id: NodeId) -> Class {
    match &graph.node(id).op {
        Op::Input { .. } => Class::Input,
        Op::Constant { value } if value.n_elems() == 1 => Class::Scalar,
        Op::Constant { .. } => Class::ConstData,
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Clamp
        | Op::Cast { .. }
        | Op::Reduce { .. }
        | Op::Reshape { .. }
        | Op::Permute { .. }
        | Op::Broadcast { .. }
        | Op::Slice { .. }
        | Op::Pad { .. }
        | Op::Concat { .. }
        | Op::Flip { .. }
        | Op::Iota { .. } => Class::Fusible,
        Op::MatMul
        | Op::Conv2d(_)
        | Op::Pool2d(_)
        | Op::Gather { .. }
        | Op::ScatterAdd { .. }
        | Op::Sort { .. }
        | Op::TopK { .. }
        | Op::Custom { .. }
        | Op::Rng { .. } => Class::Library,
    }
}

/// Cuts `graph` into kernels under `policy`, consulting `cost` for recompute-or-store choices.
pub fn partition(graph: &Graph, policy: FusePolicy, cost: &dyn CostModel) -> Partition {
    let mut stored: BTreeMap<NodeId, String> = BTreeMap::new();
    let mut notes = Vec::new();
    let groups = if policy == FusePolicy::None {
        Vec::new()
    } else {
        structured_groups(graph, &mut notes)
    };
    let mut grouped: BTreeMap<NodeId, usize> = BTreeMap::new();
    for (g, group) in groups.iter().enumerate() {
        for n in group.nodes() {
            grouped.insert(n, g);
        }
    }
    for id in graph.node_ids() {
        let node = graph.node(id);
        if let Some(&g) = grouped.get(&id) {
            let group = &groups[g];
            if id == group.last() {
                stored.insert(id, group.reason(graph));
            }
            for v in &node.operands {
                if !grouped.contains_key(&v.node) || grouped[&v.node] != g {
                    stored.entry(v.node).or_insert_with(|| {
                        format!("read by the structured kernel of %{}", group.anchor.0)
                    });
                }
            }
            continue;
        }
        match class(graph, id) {
            Class::Input => {
                stored.insert(id, "graph input".into());
            }
            Class::ConstData => {
                stored.insert(id, "constant data".into());
            }
            Class::Library => {
                stored.insert(id, format!("{} runs as a library kernel", node.op.name()));
                for v in &node.operands {
                    stored.entry(v.node).or_insert_with(|| {
                        format!(
                            "read by %{} ({}), a library kernel that reads buffers",
                            id.0,
                            node.op.name()
                        )
                    });
                }
            }
            Class::Fusible if policy == FusePolicy::None => {
                stored.insert(id, "fusion disabled (--fuse none)".into());
            }
            _ => {}
        }
    }
    for out in graph.outputs() {
        stored
            .entry(out.value.node)
            .or_insert_with(|| "graph output".into());
    }
    let mut views = Views::default();
    loop {
        let formed = form_kernels(
            graph,
            &stored,
            policy,
            &groups,
            cost.kernel_limits(),
            &mut views,
        );
        let (kernels, bodies) = match formed {
            Ok(k) => k,
            Err((id, reason)) => {
                stored.insert(id, reason);
                continue;
            }
        };
        if policy == FusePolicy::Cost {
            if let Some((id, reason)) = costly_duplicate(graph, &kernels, &bodies, cost, &mut notes)
            {
                stored.insert(id, reason);
                continue;
            }
        }
        let kernels = order(graph, kernels);
        return Partition {
            policy,
            kernels,
            stored,
            notes,
        };
    }
}

/// A reduction over at least one axis. A reduction over no axes is elementwise (`0 + x`, ...).
fn is_reduce(graph: &Graph, id: NodeId) -> bool {
    matches!(&graph.node(id).op, Op::Reduce { axes, .. } if !axes.is_empty())
}

fn reduce_axes(graph: &Graph, id: NodeId) -> Vec<usize> {
    match &graph.node(id).op {
        Op::Reduce { axes, .. } => axes.clone(),
        _ => Vec::new(),
    }
}

/// The shape a reduction reduces.
fn reduce_input(graph: &Graph, id: NodeId) -> Shape {
    graph.ty(graph.node(id).operands[0]).shape.clone()
}

fn out_shape(graph: &Graph, id: NodeId) -> Shape {
    graph.node(id).types[0].shape.clone()
}

/// One fused kernel per stored fusible node, and one library kernel per library node; then
/// merges. An `Err` names a value to store and why: a reduction that cannot stay inline, or
/// where a kernel passes the cost model's size limits.
fn form_kernels(
    graph: &Graph,
    stored: &BTreeMap<NodeId, String>,
    policy: FusePolicy,
    groups: &[StructuredGroup],
    limits: KernelLimits,
    views: &mut Views,
) -> Result<(Vec<Kernel>, Vec<Body>), (NodeId, String)> {
    let mut kernels = Vec::new();
    let mut bodies = Vec::new();
    for id in graph.node_ids() {
        if let Some(group) = groups.iter().find(|g| g.nodes().contains(&id)) {
            if id == group.last() {
                let nodes = group.nodes();
                let inputs: BTreeSet<NodeId> = nodes
                    .iter()
                    .flat_map(|&n| graph.node(n).operands.iter().map(|v| v.node))
                    .filter(|n| !nodes.contains(n))
                    .collect();
                kernels.push(Kernel {
                    kind: KernelKind::Structured(group.clone()),
                    nodes,
                    outputs: vec![id],
                    inputs: inputs.into_iter().collect(),
                });
                bodies.push(Body::default());
            }
            continue;
        }
        match class(graph, id) {
            Class::Library => {
                kernels.push(Kernel {
                    kind: KernelKind::Library,
                    nodes: vec![id],
                    outputs: vec![id],
                    inputs: graph
                        .node(id)
                        .operands
                        .iter()
                        .map(|v| v.node)
                        .collect::<BTreeSet<_>>()
                        .into_iter()
                        .collect(),
                });
                bodies.push(Body::default());
            }
            Class::Fusible if stored.contains_key(&id) => {
                // Without fusion a kernel is one op, and there is nothing to split.
                let limits = (policy != FusePolicy::None).then_some(limits);
                let (nodes, inputs, body) =
                    match walk(graph, id, &|n| stored.contains_key(&n), limits, views) {
                        Walk::Cone {
                            nodes,
                            inputs,
                            size,
                            views,
                        } => (nodes, inputs, Body { size, views }),
                        Walk::Cut { node, reason } => return Err((node, reason)),
                    };
                let kind = domain_of(graph, id, &nodes)?;
                kernels.push(Kernel {
                    kind,
                    nodes: nodes.into_iter().collect(),
                    outputs: vec![id],
                    inputs: inputs.into_iter().collect(),
                });
                bodies.push(body);
            }
            _ => {}
        }
    }
    // Without fusion every op stays its own kernel; otherwise siblings over one domain merge.
    Ok(if policy == FusePolicy::None {
        (kernels, bodies)
    } else {
        merge(kernels, bodies, limits)
    })
}

/// What a fused kernel computes, beyond its nodes: its size, and the views each inline node is
/// evaluated at. Empty for library and structured kernels.
#[derive(Clone, Debug, Default)]
struct Body {
    size: Size,
    views: BTreeMap<NodeId, Vec<ViewId>>,
}

impl Body {
    /// How many views kernel evaluates `id` at (one for a node it does not hold).
    fn view_count(&self, id: NodeId) -> usize {
        self.views.get(&id).map_or(1, |v| v.len().max(1))
    }

    fn absorb(&mut self, other: Body) {
        self.size = self.size.plus(other.size);
        for (id, views) in other.views {
            let mine = self.views.entry(id).or_default();
            for v in views {
                if !mine.contains(&v) {
                    mine.push(v);
                }
            }
        }
    }
}

/// The domain of the kernel rooted at `root` with inline `nodes`, checking that every inline
/// reduction can be computed once per row.
fn domain_of(
    graph: &Graph,
    root: NodeId,
    nodes: &BTreeSet<NodeId>,
) -> Result<KernelKind, (NodeId, String)> {
    let inline_reductions: Vec<NodeId> = nodes
        .iter()
        .rev()
        .copied()
        .filter(|&n| n != root && is_reduce(graph, n))
        .collect();
    let (domain, reduce) = if is_reduce(graph, root) {
        (reduce_input(graph, root), reduce_axes(graph, root))
    } else if let Some(&first) = inline_reductions.first() {
        (reduce_input(graph, first), reduce_axes(graph, first))
    } else {
        return Ok(KernelKind::Fused {
            domain: out_shape(graph, root),
            reduce: vec![],
        });
    };
    for &r in &inline_reductions {
        if reduce_input(graph, r) != domain || reduce_axes(graph, r) != reduce {
            return Err((
                r,
                format!(
                    "reduction over {} axes {:?} cannot share a kernel with %{} over {} axes {:?}",
                    reduce_input(graph, r),
                    reduce_axes(graph, r),
                    root.0,
                    domain,
                    reduce
                ),
            ));
        }
    }
    let root_coords = if is_reduce(graph, root) {
        row_coords(graph, root, &domain, &reduce)
    } else if out_shape(graph, root) == domain {
        identity(&domain)
    } else {
        let first = inline_reductions[0];
        let reduced = out_shape(graph, first);
        if out_shape(graph, root) != reduced {
            return Err((
                first,
                format!(
                    "reduction feeds %{} of shape {}, neither its input shape {} nor its result shape {}",
                    root.0,
                    out_shape(graph, root),
                    domain,
                    reduced
                ),
            ));
        }
        row_coords(graph, first, &domain, &reduce)
    };
    check_rows(graph, root, root_coords, nodes, &domain, &reduce)?;
    Ok(KernelKind::Fused { domain, reduce })
}

/// Where a node's coordinate along one of its axes comes from, relative to the kernel domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Coord {
    /// Always 0 (an axis of size 1 or a broadcast).
    Zero,
    /// Exactly the domain's coordinate along this axis.
    Dom(usize),
    /// Anything else: shifted, reversed, reshaped or mixed.
    Other,
}

impl std::fmt::Display for Coord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Coord::Zero => f.write_str("0"),
            Coord::Dom(k) => write!(f, "i{k}"),
            Coord::Other => f.write_str("?"),
        }
    }
}

fn coords_text(coords: &[Coord]) -> String {
    format!(
        "[{}]",
        coords
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn identity(shape: &Shape) -> Vec<Coord> {
    shape
        .dims()
        .iter()
        .enumerate()
        .map(|(k, &d)| if d == 1 { Coord::Zero } else { Coord::Dom(k) })
        .collect()
}

/// Coordinates of a reduction's result when it is evaluated at the current row.
fn row_coords(graph: &Graph, r: NodeId, domain: &Shape, reduce: &[usize]) -> Vec<Coord> {
    let keepdims = matches!(graph.node(r).op, Op::Reduce { keepdims: true, .. });
    let mut coords = Vec::new();
    for (k, &d) in domain.dims().iter().enumerate() {
        if reduce.contains(&k) {
            if keepdims {
                coords.push(Coord::Zero);
            }
        } else {
            coords.push(if d == 1 { Coord::Zero } else { Coord::Dom(k) });
        }
    }
    coords
}

/// Propagates coordinates from the root through the inline nodes and checks that every inline
/// reduction is read at the current row.
fn check_rows(
    graph: &Graph,
    root: NodeId,
    root_coords: Vec<Coord>,
    nodes: &BTreeSet<NodeId>,
    domain: &Shape,
    reduce: &[usize],
) -> Result<(), (NodeId, String)> {
    const MAX_VIEWS: usize = 32;
    let mut seen: BTreeMap<NodeId, BTreeSet<Vec<Coord>>> = BTreeMap::new();
    seen.entry(root).or_default().insert(root_coords);
    for &id in nodes.iter().rev() {
        let Some(views) = seen.get(&id).cloned() else {
            continue;
        };
        let node = graph.node(id);
        for coords in views {
            if is_reduce(graph, id) {
                let want = row_coords(graph, id, domain, reduce);
                if coords != want {
                    return Err((
                        id,
                        format!(
                            "read at {} instead of its own row {} (domain indices i0, i1, ...), so a row kernel cannot keep it inline",
                            coords_text(&coords),
                            coords_text(&want)
                        ),
                    ));
                }
            }
            for v in &node.operands {
                if !nodes.contains(&v.node) {
                    continue;
                }
                let op_shape = &graph.ty(*v).shape;
                let c = operand_coords(graph, id, &coords, op_shape, domain);
                let set = seen.entry(v.node).or_default();
                if set.len() < MAX_VIEWS {
                    set.insert(c);
                } else {
                    set.insert(vec![Coord::Other; op_shape.rank()]);
                }
            }
        }
    }
    Ok(())
}

/// Coordinates of operand `i` of `id` given the node's own coordinates.
fn operand_coords(
    graph: &Graph,
    id: NodeId,
    coords: &[Coord],
    op_shape: &Shape,
    domain: &Shape,
) -> Vec<Coord> {
    let node = graph.node(id);
    let out = &node.types[0].shape;
    let aligned = || -> Vec<Coord> {
        let skip = out.rank().saturating_sub(op_shape.rank());
        op_shape
            .dims()
            .iter()
            .enumerate()
            .map(|(a, &d)| {
                if d == 1 {
                    Coord::Zero
                } else {
                    coords[a + skip]
                }
            })
            .collect()
    };
    match &node.op {
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Clamp
        | Op::Cast { .. }
        | Op::Broadcast { .. } => aligned(),
        Op::Permute { perm } => {
            let mut c = vec![Coord::Zero; perm.len()];
            for (k, &p) in perm.iter().enumerate() {
                c[p] = coords[k];
            }
            c
        }
        Op::Reshape { .. } => {
            let non1_in: Vec<usize> = op_shape
                .dims()
                .iter()
                .copied()
                .filter(|&d| d != 1)
                .collect();
            let non1_out: Vec<usize> = out.dims().iter().copied().filter(|&d| d != 1).collect();
            if non1_in == non1_out {
                let mut from = out
                    .dims()
                    .iter()
                    .zip(coords)
                    .filter(|(d, _)| **d != 1)
                    .map(|(_, c)| *c);
                op_shape
                    .dims()
                    .iter()
                    .map(|&d| {
                        if d == 1 {
                            Coord::Zero
                        } else {
                            from.next().unwrap_or(Coord::Other)
                        }
                    })
                    .collect()
            } else {
                op_shape
                    .dims()
                    .iter()
                    .map(|&d| if d == 1 { Coord::Zero } else { Coord::Other })
                    .collect()
            }
        }
        Op::Slice { start, step, .. } => (0..op_shape.rank())
            .map(|k| {
                if start[k] == 0 && step[k] == 1 && op_shape.dims()[k] == out.dims()[k] {
                    coords[k]
                } else {
                    Coord::Other
                }
            })
            .collect(),
        Op::Pad { low, high, .. } => (0..op_shape.rank())
            .map(|k| {
                if low[k] == 0 && high[k] == 0 {
                    coords[k]
                } else {
                    Coord::Other
                }
            })
            .collect(),
        Op::Flip { axes } => (0..op_shape.rank())
            .map(|k| {
                if axes.contains(&k) && op_shape.dims()[k] > 1 {
                    Coord::Other
                } else {
                    coords[k]
                }
            })
            .collect(),
        Op::Concat { axis } => (0..op_shape.rank())
            .map(|k| if k == *axis { Coord::Other } else { coords[k] })
            .collect(),
        Op::Reduce { axes, keepdims, .. } => {
            // A reduction's operand is evaluated over the whole row: at the domain's identity
            // when the reduction is placed correctly (checked by the caller).
            let _ = (axes, keepdims);
            identity(domain)
        }
        _ => vec![Coord::Other; op_shape.rank()],
    }
}

/// Whether kernel `a` (transitively) reads what kernel `b` writes.
fn depends(kernels: &[Kernel], a: usize, b: usize) -> bool {
    let writer: BTreeMap<NodeId, usize> = kernels
        .iter()
        .enumerate()
        .flat_map(|(k, kern)| kern.outputs.iter().map(move |&o| (o, k)))
        .collect();
    let mut stack = vec![a];
    let mut seen = BTreeSet::new();
    while let Some(k) = stack.pop() {
        if !seen.insert(k) {
            continue;
        }
        for input in &kernels[k].inputs {
            if let Some(&w) = writer.get(input) {
                if w == b {
                    return true;
                }
                stack.push(w);
            }
        }
    }
    false
}

/// Merges fused kernels over the same domain that share inline nodes or inputs (multi-output and
/// horizontal fusion), never two where one depends on the other, nor two whose sizes together
/// pass `limits`.
fn merge(
    mut kernels: Vec<Kernel>,
    mut bodies: Vec<Body>,
    limits: KernelLimits,
) -> (Vec<Kernel>, Vec<Body>) {
    loop {
        let mut merged = false;
        'search: for a in 0..kernels.len() {
            for b in a + 1..kernels.len() {
                let (
                    KernelKind::Fused {
                        domain: da,
                        reduce: ra,
                    },
                    KernelKind::Fused {
                        domain: db,
                        reduce: rb,
                    },
                ) = (kernels[a].kind.clone(), kernels[b].kind.clone())
                else {
                    continue;
                };
                if da != db || (!ra.is_empty() && !rb.is_empty() && ra != rb) {
                    continue;
                }
                let shares = kernels[a]
                    .nodes
                    .iter()
                    .any(|n| kernels[b].nodes.contains(n))
                    || kernels[a]
                        .inputs
                        .iter()
                        .any(|n| kernels[b].inputs.contains(n));
                if !shares
                    || !bodies[a].size.plus(bodies[b].size).within(limits)
                    || depends(&kernels, a, b)
                    || depends(&kernels, b, a)
                {
                    continue;
                }
                let reduce = if ra.is_empty() { rb } else { ra };
                let kb = kernels.remove(b);
                let body = bodies.remove(b);
                bodies[a].absorb(body);
                let ka = &mut kernels[a];
                ka.kind = KernelKind::Fused { domain: da, reduce };
                for n in kb.nodes {
                    if !ka.nodes.contains(&n) {
                        ka.nodes.push(n);
                    }
                }
                ka.nodes.sort();
                ka.outputs.extend(kb.outputs);
                ka.outputs.sort();
                for n in kb.inputs {
                    if !ka.inputs.contains(&n) {
                        ka.inputs.push(n);
                    }
                }
                ka.inputs.sort();
                merged = true;
                break 'search;
            }
        }
        if !merged {
            return (kernels, bodies);
        }
    }
}

/// Pointwise kernels over rank >= 2 domains with rows of at least this many elements are lowered
/// as loops over rows with the row's axes inside: loads stay contiguous in the inner loop, a
/// broadcast along the leading axes (a bias) becomes a plain row load, and values constant along
/// the row are computed once per row. A row is the last axis, or the last few where the last is
/// shorter (an NCHW image's H and W: a per-channel bias is then constant along the row). Other
/// pointwise kernels loop over the flattened domain.
pub const MIN_ROW: usize = 64;

/// How many trailing axes of `domain` form the row of a kernel reducing `reduce` (see
/// [`MIN_ROW`]): the fewest whose elements number at least `MIN_ROW`, leaving one axis or more
/// outside; 0 where the kernel loops over its flattened domain (or reduces). Lowering follows
/// this rule, and [`partition`] counts evaluations by it.
pub fn row_axes(domain: &Shape, reduce: &[usize]) -> usize {
    let dims = domain.dims();
    if !reduce.is_empty() || dims.len() < 2 {
        return 0;
    }
    let mut len = 1usize;
    for k in 1..dims.len() {
        len = len.saturating_mul(dims[dims.len() - k]);
        if len >= MIN_ROW {
            return k;
        }
    }
    0
}

/// Whether a kernel over `domain` reducing `reduce` is lowered as a loop over rows
/// ([`row_axes`]).
pub fn splits_rows(domain: &Shape, reduce: &[usize]) -> bool {
    row_axes(domain, reduce) > 0
}

/// Whether inline node `id` is constant along the inner loop of `kernel` (the reduced axes, or
/// the last axis of a row-split kernel), so lowering computes it once per outer index: its
/// shape, aligned to the domain's right, is 1 along every inner axis, and the kernel moves no
/// data except by broadcasts (a permute or reshape could carry an inner coordinate into it).
fn per_outer_index(
    graph: &Graph,
    id: NodeId,
    kernel: &Kernel,
    domain: &Shape,
    inner: &[usize],
) -> bool {
    let dims = graph.node(id).types[0].shape.dims().to_vec();
    let rank = domain.rank();
    if inner.is_empty() || dims.len() > rank {
        return false;
    }
    let offset = rank - dims.len();
    let aligned = (0..rank).all(|a| {
        let d = if a < offset { 1 } else { dims[a - offset] };
        d == 1 || (d == domain.dims()[a] && !inner.contains(&a))
    });
    let moves = kernel.nodes.iter().any(|&n| {
        matches!(
            graph.node(n).op,
            Op::Reshape { .. }
                | Op::Permute { .. }
                | Op::Slice { .. }
                | Op::Pad { .. }
                | Op::Concat { .. }
                | Op::Flip { .. }
        )
    });
    aligned && !moves
}

/// How many times kernel `kernel` evaluates inline node `id`: once per element of its own shape
/// for row-level values (those computed from a reduction), once per outer index for values
/// constant along the inner loop, once per domain element otherwise.
fn evaluations(graph: &Graph, id: NodeId, kernel: &Kernel) -> f64 {
    let KernelKind::Fused { domain, reduce } = &kernel.kind else {
        return 0.0;
    };
    let own = graph.node(id).types[0].shape.n_elems() as f64;
    let inner: Vec<usize> = if !reduce.is_empty() {
        reduce.clone()
    } else if splits_rows(domain, reduce) {
        (domain.rank() - row_axes(domain, reduce)..domain.rank()).collect()
    } else {
        vec![]
    };
    if per_outer_index(graph, id, kernel, domain, &inner) {
        let inner_len: usize = inner.iter().map(|&a| domain.dims()[a]).product();
        return (domain.n_elems() / inner_len.max(1)) as f64;
    }
    let mut stack = vec![id];
    let mut seen = BTreeSet::new();
    while let Some(n) = stack.pop() {
        if !seen.insert(n) || !kernel.nodes.contains(&n) {
            continue;
        }
        if is_reduce(graph, n) {
            return own;
        }
        stack.extend(graph.node(n).operands.iter().map(|v| v.node));
    }
    domain.n_elems() as f64
}

/// Seconds to compute `id`'s inline cone in `kernel` for `evals` evaluations.
fn cone_seconds(
    graph: &Graph,
    id: NodeId,
    kernel: &Kernel,
    cost: &dyn CostModel,
    evals: f64,
) -> f64 {
    let mut total = 0.0;
    let mut stack = vec![id];
    let mut seen = BTreeSet::new();
    while let Some(n) = stack.pop() {
        if !seen.insert(n) || !kernel.nodes.contains(&n) {
            continue;
        }
        let node = graph.node(n);
        total += cost.element_seconds(&node.op, node.types[0].dtype) * evals;
        stack.extend(node.operands.iter().map(|v| v.node));
    }
    total
}

/// Under the cost policy: the inline node whose recomputation (in several kernels, or many times
/// over a broadcast within one) costs most more than storing it once, if any.
fn costly_duplicate(
    graph: &Graph,
    kernels: &[Kernel],
    bodies: &[Body],
    cost: &dyn CostModel,
    notes: &mut Vec<String>,
) -> Option<(NodeId, String)> {
    let mut homes: BTreeMap<NodeId, Vec<usize>> = BTreeMap::new();
    for (k, kernel) in kernels.iter().enumerate() {
        if matches!(kernel.kind, KernelKind::Fused { .. }) {
            for &n in &kernel.nodes {
                if !kernel.outputs.contains(&n) && class(graph, n) == Class::Fusible {
                    homes.entry(n).or_default().push(k);
                }
            }
        }
    }
    let mut worst: Option<(f64, NodeId, String)> = None;
    for (n, ks) in homes {
        let ty = &graph.node(n).types[0];
        let own = ty.shape.n_elems() as f64;
        // A kernel evaluates the node at each index it is read at (each view), once per element
        // of its loop or less (`evaluations`).
        let views: Vec<usize> = ks.iter().map(|&k| bodies[k].view_count(n)).collect();
        let evals: Vec<f64> = ks
            .iter()
            .zip(&views)
            .map(|(&k, &v)| evaluations(graph, n, &kernels[k]) * v as f64)
            .collect();
        if ks.len() == 1 && evals[0] <= own {
            continue; // Computed once per element, in one kernel: nothing is recomputed.
        }
        let recompute: f64 = ks
            .iter()
            .zip(&evals)
            .map(|(&k, &e)| cone_seconds(graph, n, &kernels[k], cost, e))
            .sum();
        let bytes = ty.size_bytes() as f64;
        let once = cone_seconds(graph, n, &kernels[ks[0]], cost, own)
            + cost.memory_seconds(bytes * (1.0 + ks.len() as f64))
            + cost.kernel_seconds();
        let how = if ks.len() > 1 {
            format!("read by {} kernels", ks.len())
        } else if views[0] > 1 {
            format!(
                "read at {} indices, evaluated {:.0} times per element",
                views[0],
                evals[0] / own.max(1.0)
            )
        } else {
            format!(
                "evaluated {:.0} times per element through a broadcast",
                evals[0] / own.max(1.0)
            )
        };
        if once < recompute {
            let saving = recompute - once;
            let reason = format!(
                "{how}: recomputing it costs {:.1} us, storing it once costs {:.1} us",
                recompute * 1e6,
                once * 1e6
            );
            if worst.as_ref().is_none_or(|w| saving > w.0) {
                worst = Some((saving, n, reason));
            }
        } else {
            let note = format!(
                "%{} ({}) is recomputed ({how}): {:.1} us, cheaper than storing it ({:.1} us)",
                n.0,
                graph.node(n).op.name(),
                recompute * 1e6,
                once * 1e6
            );
            if !notes.contains(&note) {
                notes.push(note);
            }
        }
    }
    worst.map(|(_, n, r)| (n, r))
}

/// Kernels in dependency order (ties by their first output).
fn order(graph: &Graph, kernels: Vec<Kernel>) -> Vec<Kernel> {
    let _ = graph;
    let mut remaining = kernels;
    remaining.sort_by_key(|k| k.outputs[0]);
    let mut done: BTreeSet<NodeId> = BTreeSet::new();
    let written: BTreeSet<NodeId> = remaining
        .iter()
        .flat_map(|k| k.outputs.iter().copied())
        .collect();
    let mut ordered = Vec::new();
    while !remaining.is_empty() {
        let ready = remaining
            .iter()
            .position(|k| {
                k.inputs
                    .iter()
                    .all(|i| done.contains(i) || !written.contains(i))
            })
            .expect("kernels form a DAG");
        let k = remaining.remove(ready);
        done.extend(k.outputs.iter().copied());
        ordered.push(k);
    }
    ordered
}

/// The partition as text: one line per kernel and one per stored value.
pub fn print_partition(graph: &Graph, p: &Partition) -> String {
    let mut s = String::new();
    let list = |ids: &[NodeId]| {
        ids.iter()
            .map(|n| format!("%{}", n.0))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for (k, kernel) in p.kernels.iter().enumerate() {
        match &kernel.kind {
            KernelKind::Fused { domain, reduce } => {
                write!(s, "k{k} fused {domain}").unwrap();
                if !reduce.is_empty() {
                    write!(s, " reduce {reduce:?}").unwrap();
                }
            }
            KernelKind::Library => write!(s, "k{k} library").unwrap(),
            KernelKind::Structured(_) => write!(s, "k{k} structured").unwrap(),
        }
        let ops: Vec<String> = kernel
            .nodes
            .iter()
            .filter(|&&n| class(graph, n) != Class::Scalar)
            .map(|&n| format!("{} %{}", graph.node(n).op.name(), n.0))
            .collect();
        let reads = if kernel.inputs.is_empty() {
            "-".to_string()
        } else {
            list(&kernel.inputs)
        };
        writeln!(
            s,
            ": {} | reads {reads} | writes {}",
            ops.join(", "),
            list(&kernel.outputs)
        )
        .unwrap();
    }
    for (id, why) in &p.stored {
        writeln!(s, "%{} stored: {why}", id.0).unwrap();
    }
    for note in &p.notes {
        writeln!(s, "note: {note}").unwrap();
    }
    s
}
