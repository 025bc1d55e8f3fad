//! Structured kernels: a convolution together with the neighbours a library routine can absorb.
//!
//! ```text
//! %d = conv2d(%x, %wd) groups=C          (depthwise)      one kernel:
//! %e = add(%d, %bd)   (per channel)      (optional)        depthwise tile -> its bias ->
//! %a = relu(%e)                          (optional)        its activation, in cache ->
//! %p = conv2d(%a, %wp)                   (1×1 pointwise)   pointwise GEMM
//! %b = add(%p, %bias)                    (per channel)     -> bias -> residual ->
//! %r = add(%b, %skip)                     (same shape)      activation, per output tile
//! %y = relu(%r)      (or another activation: GELU, sigmoid, tanh, SiLU, hard-swish, a clamp)
//! ```
//!
//! A matmul forms the same kind of group: operands that are transposes of the last two axes
//! are read in place through the GEMM's strides (never materialized), and a per-column bias, a
//! scale (one factor per column, or one for all: LayerScale, attention scores), a residual and
//! an activation are applied to its output.
//!
//! The depthwise half may carry its own per-channel bias and activation, as in MobileNet, where
//! inference folds each batchnorm into the convolution before it: `depthwise → bias → ReLU →
//! pointwise → bias → ReLU` is one kernel.
//!
//! Before: up to six kernels, with the depthwise output (as large as the input) and the
//! convolution's output written to memory and read back. After: one kernel that never stores
//! the depthwise output and applies the epilogues while each tile is in cache. Each
//! absorption requires the absorbed value to have exactly one user and not be a graph output;
//! when a neighbour is not absorbed the reason is recorded.

use std::collections::BTreeMap;

use kfuse_ir::{Activation, BinaryOp, Bounds, Graph, Layout, NodeId, Op, UnaryOp, Value};

/// A convolution or matmul with the neighbours it absorbs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StructuredGroup {
    /// A depthwise convolution whose only user is `anchor`, a 1×1 convolution, directly or
    /// through `depthwise_bias_add` and `depthwise_activation`: a depthwise-separable block.
    pub depthwise: Option<NodeId>,
    /// `add(depthwise, bias)` with one bias value per channel, between the depthwise and the
    /// pointwise convolutions.
    pub depthwise_bias_add: Option<NodeId>,
    /// The bias operand of `depthwise_bias_add`.
    pub depthwise_bias: Option<Value>,
    /// An [`Activation`] of the depthwise result (after its bias), before the pointwise
    /// convolution.
    pub depthwise_activation: Option<NodeId>,
    /// The inner nodes of a compound `depthwise_activation` (SiLU, hard-swish).
    pub depthwise_inner: Inner,
    /// A 1×1 convolution (with its own bias and activation) whose result only the depthwise
    /// convolution reads: MobileNetV2's expansion. Its output is never stored either.
    pub expand: Option<Chain>,
    /// Matmul only: `permute` nodes swapping the last two axes of the left and right operands,
    /// folded into the GEMM's strides.
    pub transposed: [Option<NodeId>; 2],
    /// The convolution or matmul.
    pub anchor: NodeId,
    /// `add(anchor, bias)` with one bias value per output channel (per column for a matmul).
    pub bias_add: Option<NodeId>,
    /// The bias operand of `bias_add`.
    pub bias: Option<Value>,
    /// Matmul only: `mul(previous, scale)` with one factor per output column, or a single
    /// factor (a scalar, or any shape of one element that does not widen the result).
    pub scale_mul: Option<NodeId>,
    /// The factor operand of `scale_mul`.
    pub scale: Option<Value>,
    /// `add(previous, residual)` with a residual of the output's own shape and dtype (a skip
    /// connection).
    pub residual_add: Option<NodeId>,
    /// The residual operand of `residual_add`.
    pub residual: Option<Value>,
    /// An [`Activation`] of the previous result.
    pub activation: Option<NodeId>,
    /// The inner nodes of a compound `activation` (SiLU, hard-swish).
    pub activation_inner: Inner,
    /// Matmul only: a `cast` of the previous result to another float dtype, the group's last
    /// step (the product is written in that dtype, tile by tile).
    pub cast: Option<NodeId>,
    /// Convolution only: a `pool2d` of the previous result, the group's last step (ResNet's
    /// stem: its max pool). The convolution's result is pooled band by band from cache.
    pub pool: Option<NodeId>,
}

/// The nodes inside a compound activation before its last node, in order: a SiLU's sigmoid;
/// a hard-swish's `add`, `clamp`, and `mul` or `div`.
pub type Inner = [Option<NodeId>; 3];

/// Recognising an [`Activation`] in a graph: the partitioner's half of the activation
/// vocabulary (the enum lives in `kfuse-ir`, shared with the routines that apply it).
pub trait ActivationNode {
    /// The activation node `id` applies to its input ([`ActivationNode::input`]), if it is one:
    /// a unary activation, a float `clamp` whose bounds are single-valued constants, or the last
    /// node of a compound activation: a SiLU's `mul`, a hard-swish's `div` or `mul` (see
    /// `compound_parts`).
    fn of_node(graph: &Graph, id: NodeId) -> Option<Activation>;

    /// The value activation node `id` (one [`ActivationNode::of_node`] accepts) applies to.
    fn input(graph: &Graph, id: NodeId) -> Value;
}

impl ActivationNode for Activation {
    fn of_node(graph: &Graph, id: NodeId) -> Option<Activation> {
        let node = graph.node(id);
        if matches!(node.op, Op::Binary(BinaryOp::Mul | BinaryOp::Div)) {
            return compound_parts(graph, id).map(|(a, _, _)| a);
        }
        if node.op != Op::Clamp {
            return Activation::of(&node.op);
        }
        let bound = |v: Value| match &graph.node(v.node).op {
            Op::Constant { value } if value.n_elems() == 1 && value.dtype().is_float() => {
                Some(value.get_f64(0))
            }
            _ => None,
        };
        let (lo, hi) = (bound(node.operands[1])?, bound(node.operands[2])?);
        // The bounds must not widen the value's shape.
        let x = graph.ty(node.operands[0]);
        (node.types[0].shape == x.shape && x.dtype.is_float())
            .then(|| Activation::Clamp(Bounds::new(lo, hi)))
    }

    fn input(graph: &Graph, id: NodeId) -> Value {
        compound_parts(graph, id).map_or(graph.node(id).operands[0], |(_, x, _)| x)
    }
}

impl StructuredGroup {
    /// The nodes of the group in order.
    pub fn nodes(&self) -> Vec<NodeId> {
        let mut transposes: Vec<NodeId> = self.transposed.iter().flatten().copied().collect();
        transposes.sort();
        let expand = self.expand.map_or(Vec::new(), |e| {
            let mut nodes = vec![e.conv];
            nodes.extend(e.bias.map(|(add, _)| add));
            nodes.extend(e.inner.iter().flatten());
            nodes.extend(e.activation);
            nodes
        });
        expand
            .into_iter()
            .chain(self.depthwise)
            .chain(self.depthwise_bias_add)
            .chain(self.depthwise_inner.iter().flatten().copied())
            .chain(self.depthwise_activation)
            .chain(transposes)
            .chain([self.anchor])
            .chain(self.bias_add)
            .chain(self.scale_mul)
            .chain(self.residual_add)
            .chain(self.activation_inner.iter().flatten().copied())
            .chain(self.activation)
            .chain(self.cast)
            .chain(self.pool)
            .collect()
    }

    /// The node whose result the group writes.
    pub fn last(&self) -> NodeId {
        self.pool
            .or(self.cast)
            .or(self.activation)
            .or(self.residual_add)
            .or(self.scale_mul)
            .or(self.bias_add)
            .unwrap_or(self.anchor)
    }

    /// Why the group's result is stored by one kernel: what it absorbed, and how.
    pub fn reason(&self, graph: &Graph) -> String {
        let name = |n: NodeId| match (Activation::of_node(graph, n), &graph.node(n).op) {
            (Some(a @ (Activation::Silu | Activation::HardSwish { .. })), _) => {
                format!("{} %{}", a.name(), n.0)
            }
            (_, Op::Cast { to }) => format!("cast %{} to {to}", n.0),
            (_, op) => format!("{} %{}", op.name(), n.0),
        };
        let mut parts = Vec::new();
        for (side, t) in ["left", "right"].iter().zip(self.transposed) {
            if let Some(t) = t {
                parts.push(format!(
                    "{} read in place as the transposed {side} operand",
                    name(t)
                ));
            }
        }
        if let Some(d) = self.depthwise {
            // A convolution's own bias and activation, absorbed with it.
            let own = |bias: Option<NodeId>, activation: Option<NodeId>| {
                let own: Vec<String> = bias.into_iter().chain(activation).map(name).collect();
                if own.is_empty() {
                    String::new()
                } else {
                    format!(" ({} applied to it in cache)", own.join(" + "))
                }
            };
            if let Some(e) = self.expand {
                parts.push(format!(
                    "expansion {}{} computed band by band for the depthwise one, never stored",
                    name(e.conv),
                    own(e.bias.map(|(add, _)| add), e.activation)
                ));
            }
            let own = own(self.depthwise_bias_add, self.depthwise_activation);
            parts.push(format!(
                "depthwise {}{own} consumed tile by tile, never stored",
                name(d)
            ));
        }
        let epilogue: Vec<String> = self
            .bias_add
            .into_iter()
            .chain(self.scale_mul)
            .chain(self.residual_add)
            .chain(self.activation)
            .chain(self.cast)
            .map(name)
            .collect();
        if !epilogue.is_empty() {
            parts.push(format!(
                "{} applied to each output tile",
                epilogue.join(" + ")
            ));
        }
        if let Some(p) = self.pool {
            parts.push(format!(
                "{} applied to the convolution's rows band by band in cache (the \
                 convolution's result is never stored)",
                name(p)
            ));
        }
        format!(
            "written by {} %{} with {}",
            graph.node(self.anchor).op.name(),
            self.anchor.0,
            parts.join("; ")
        )
    }

    /// Whether the group absorbs anything beyond the convolution.
    pub fn absorbs(&self) -> bool {
        self.depthwise.is_some()
            || self.expand.is_some()
            || self.transposed.iter().any(Option::is_some)
            || self.bias_add.is_some()
            || self.scale_mul.is_some()
            || self.residual_add.is_some()
            || self.activation.is_some()
            || self.cast.is_some()
            || self.pool.is_some()
    }
}

/// Users of each value (and one more for being a graph output).
fn use_counts(graph: &Graph) -> BTreeMap<Value, Vec<NodeId>> {
    let mut users: BTreeMap<Value, Vec<NodeId>> = BTreeMap::new();
    for id in graph.node_ids() {
        for v in &graph.node(id).operands {
            users.entry(*v).or_default().push(id);
        }
    }
    users
}

fn value(node: NodeId) -> Value {
    Value { node, result: 0 }
}

/// For the last node of a compound activation of `x` (a float value; the result of `x`'s
/// type): the activation, `x`, and its inner nodes. SiLU: `mul(x, sigmoid(x))`. Hard-swish:
/// `div(mul(x, c), 6)` or `mul(x, div(c, 6))` with `c = clamp(add(x, 3), 0, 6)`, the constants
/// single float values of `x`'s dtype; `mul` and `add` in either operand order.
fn compound_parts(graph: &Graph, id: NodeId) -> Option<(Activation, Value, Inner)> {
    let node = graph.node(id);
    let op = |v: Value| &graph.node(v.node).op;
    // The other operand of binary node `n`, given one of them.
    let other = |n: &kfuse_ir::Node, v: Value| {
        (n.operands[0] == v)
            .then_some(n.operands[1])
            .or((n.operands[1] == v).then_some(n.operands[0]))
    };
    let constant = |v: Value, want: f64| match op(v) {
        Op::Constant { value } => {
            value.n_elems() == 1 && value.dtype() == node.types[0].dtype && value.get_f64(0) == want
        }
        _ => false,
    };
    let result_of = |v: Value| v.result == 0 && graph.node(v.node).types[0] == node.types[0];
    // `c = clamp(add(x, 3), 0, 6)`: `x` and the add.
    let relu6_of_plus_3 = |c: Value| -> Option<(Value, NodeId)> {
        let clamp = graph.node(c.node);
        if *op(c) != Op::Clamp || !result_of(c) {
            return None;
        }
        let [a, lo, hi] = clamp.operands[..] else {
            return None;
        };
        if !constant(lo, 0.0)
            || !constant(hi, 6.0)
            || *op(a) != Op::Binary(BinaryOp::Add)
            || !result_of(a)
        {
            return None;
        }
        let add = graph.node(a.node);
        let x =
            (0..2).find_map(|i| constant(add.operands[1 - i], 3.0).then_some(add.operands[i]))?;
        Some((x, a.node))
    };
    let float_x = |x: Value| graph.ty(x).dtype.is_float() && *graph.ty(x) == node.types[0];
    match node.op {
        Op::Binary(BinaryOp::Mul) => (0..2).find_map(|i| {
            let (x, s) = (node.operands[i], node.operands[1 - i]);
            if !float_x(x) || !result_of(s) {
                return None;
            }
            let inner = graph.node(s.node);
            if inner.op == Op::Unary(UnaryOp::Sigmoid) && inner.operands[0] == x {
                return Some((Activation::Silu, x, [Some(s.node), None, None]));
            }
            // `mul(x, div(c, 6))`.
            if inner.op == Op::Binary(BinaryOp::Div) && constant(inner.operands[1], 6.0) {
                let (x2, add) = relu6_of_plus_3(inner.operands[0])?;
                return (x2 == x).then_some((
                    Activation::HardSwish { divide_last: false },
                    x,
                    [Some(add), Some(inner.operands[0].node), Some(s.node)],
                ));
            }
            None
        }),
        // `div(mul(x, c), 6)`.
        Op::Binary(BinaryOp::Div) if constant(node.operands[1], 6.0) => {
            let m = node.operands[0];
            if *op(m) != Op::Binary(BinaryOp::Mul) || !result_of(m) {
                return None;
            }
            let mul = graph.node(m.node);
            (0..2).find_map(|i| {
                let (x, c) = (mul.operands[i], mul.operands[1 - i]);
                let (x2, add) = relu6_of_plus_3(c)?;
                (x2 == x && float_x(x) && other(mul, x) == Some(c)).then_some((
                    Activation::HardSwish { divide_last: true },
                    x,
                    [Some(add), Some(c.node), Some(m.node)],
                ))
            })
        }
        _ => None,
    }
}

/// The activation node that alone consumes `v`, with the inner nodes of a compound one (SiLU,
/// hard-swish, which read `v` from more than one node): `v` is not a graph output, and its
/// users are the activation alone, or the nodes of a compound activation of `v` whose inner
/// nodes each have one user. Otherwise why not.
fn activation_user(
    graph: &Graph,
    users: &BTreeMap<Value, Vec<NodeId>>,
    v: Value,
) -> Result<Option<(NodeId, Inner)>, String> {
    let readers = users.get(&v).map(Vec::as_slice).unwrap_or_default();
    // A compound activation's last node lies at most three single-user steps after a reader.
    let only_user = |n: NodeId| match users.get(&value(n)).map(Vec::as_slice) {
        Some([u]) => Some(*u),
        _ => None,
    };
    for &r in readers {
        let mut at = Some(r);
        for _ in 0..4 {
            let Some(f) = at else { break };
            at = only_user(f);
            let Some((activation, x, inner)) = compound_parts(graph, f) else {
                continue;
            };
            let nodes: Vec<NodeId> = inner.iter().flatten().copied().chain([f]).collect();
            if x != v || !readers.iter().all(|r| nodes.contains(r)) {
                continue;
            }
            if graph.outputs().iter().any(|o| o.value == v) {
                return Err("it is a graph output".into());
            }
            for &n in inner.iter().flatten() {
                single_use(graph, users, value(n)).map_err(|why| {
                    format!(
                        "{} %{} of a {}: {why}",
                        graph.node(n).op.name(),
                        n.0,
                        activation.name()
                    )
                })?;
            }
            return Ok(Some((f, inner)));
        }
    }
    let user = single_use(graph, users, v)?;
    Ok(
        (Activation::of_node(graph, user).is_some() && Activation::input(graph, user) == v)
            .then_some((user, [None; 3])),
    )
}

fn single_use(
    graph: &Graph,
    users: &BTreeMap<Value, Vec<NodeId>>,
    v: Value,
) -> Result<NodeId, String> {
    if graph.outputs().iter().any(|o| o.value == v) {
        return Err("it is a graph output".into());
    }
    match users.get(&v).map(|u| u.as_slice()) {
        Some([only]) => Ok(*only),
        Some(many) => Err(format!("it has {} users", many.len())),
        None => Err("it has no users".into()),
    }
}

/// Whether a conv2d node is depthwise: one filter per input channel, one output per channel.
fn is_depthwise(graph: &Graph, id: NodeId) -> bool {
    let node = graph.node(id);
    let Op::Conv2d(attrs) = &node.op else {
        return false;
    };
    let x = &graph.ty(node.operands[0]).shape;
    let w = &graph.ty(node.operands[1]).shape;
    let channels = match attrs.layout {
        Layout::Nchw => x.dims()[1],
        Layout::Nhwc => x.dims()[3],
    };
    attrs.groups == channels && w.dims()[0] == channels && w.dims()[1] == 1
}

/// Whether a conv2d node is a plain 1×1 convolution.
fn is_pointwise(graph: &Graph, id: NodeId) -> bool {
    let node = graph.node(id);
    let Op::Conv2d(attrs) = &node.op else {
        return false;
    };
    let w = &graph.ty(node.operands[1]).shape;
    w.dims()[2] == 1
        && w.dims()[3] == 1
        && attrs.groups == 1
        && attrs.stride == [1, 1]
        && attrs.padding == [0; 4]
}

/// The other operand of `user` if it is an `add` of `v` and something else.
fn added_operand(graph: &Graph, user: NodeId, v: Value) -> Option<Value> {
    let node = graph.node(user);
    if node.op != Op::Binary(BinaryOp::Add) {
        return None;
    }
    let other = if node.operands[0] == v {
        node.operands[1]
    } else {
        node.operands[0]
    };
    (other != v).then_some(other)
}

/// The `mul` that scales `v` (matmul `anchor`'s result, after its bias) as its only user, with
/// its factor: one value per output column, or a single value, of the result's dtype, leaving
/// the result's type as it is.
fn scale_after(
    graph: &Graph,
    users: &BTreeMap<Value, Vec<NodeId>>,
    anchor: NodeId,
    v: Value,
) -> Option<(NodeId, Value)> {
    let user = single_use(graph, users, v).ok()?;
    let node = graph.node(user);
    if node.op != Op::Binary(BinaryOp::Mul) {
        return None;
    }
    let factor = if node.operands[0] == v {
        node.operands[1]
    } else {
        node.operands[0]
    };
    let ty = graph.ty(factor);
    let single = ty.shape.n_elems() == 1 && ty.dtype == graph.ty(v).dtype;
    (factor != v
        && node.types[0] == *graph.ty(v)
        && (single || is_channel_bias(graph, anchor, factor)))
    .then_some((user, factor))
}

/// The `cast` of `last`'s result (matmul `anchor`'s group so far) to another float dtype, if it is `v`'s only
/// user; a note says why a cast that reads `v` stays a kernel of its own.
fn cast_after(
    graph: &Graph,
    users: &BTreeMap<Value, Vec<NodeId>>,
    (anchor, last): (NodeId, NodeId),
    notes: &mut Vec<String>,
) -> Option<NodeId> {
    let v = value(last);
    let readers = users.get(&v).map(Vec::as_slice).unwrap_or_default();
    let cast = readers
        .iter()
        .copied()
        .find(|&u| matches!(graph.node(u).op, Op::Cast { .. }))?;
    let Op::Cast { to } = graph.node(cast).op else {
        unreachable!("found as a cast")
    };
    let from = graph.ty(v).dtype;
    let why = if !to.is_float() {
        format!("{to} is not a float type")
    } else if to == from {
        "it converts to the product's own dtype".to_string()
    } else {
        match read_once(graph, users, last) {
            Ok(()) => return Some(cast),
            Err(why) => why,
        }
    };
    notes.push(format!(
        "matmul %{} keeps cast %{} in a separate kernel: {why}",
        anchor.0, cast.0
    ));
    None
}

/// Whether node `last`'s result has one user and is not a graph output; else why not, naming
/// the node.
fn read_once(
    graph: &Graph,
    users: &BTreeMap<Value, Vec<NodeId>>,
    last: NodeId,
) -> Result<(), String> {
    single_use(graph, users, value(last))
        .map(|_| ())
        .map_err(|why| {
            format!(
                "{} %{} {}",
                graph.node(last).op.name(),
                last.0,
                why.trim_start_matches("it ")
            )
        })
}

/// The `pool2d` that alone reads the result of convolution group `group` (so far), where the
/// CPU backend may pool it in the convolution's pass: a strided f32 NCHW convolution with no
/// residual, not the end of a separable block, pooled in its own layout. A note says why a
/// pooling that reads such a convolution stays a kernel of its own.
fn pool_after(
    graph: &Graph,
    users: &BTreeMap<Value, Vec<NodeId>>,
    group: &StructuredGroup,
    notes: &mut Vec<String>,
) -> Option<NodeId> {
    let Op::Conv2d(attrs) = &graph.node(group.anchor).op else {
        return None;
    };
    let last = group.last();
    let v = value(last);
    let pool = users
        .get(&v)?
        .iter()
        .copied()
        .find(|&u| matches!(graph.node(u).op, Op::Pool2d(_)))?;
    let Op::Pool2d(pool_attrs) = &graph.node(pool).op else {
        unreachable!("found as a pool2d")
    };
    let why = if attrs.stride[0] < 2 || attrs.stride[1] < 2 {
        "the convolution is not strided (only a strided one is pooled in its own pass)".to_string()
    } else if attrs.layout != Layout::Nchw || pool_attrs.layout != Layout::Nchw {
        "only NCHW convolutions are pooled in their own pass".to_string()
    } else if graph.ty(v).dtype != kfuse_ir::DType::F32 {
        format!(
            "{} convolutions are not pooled in their own pass, only f32",
            graph.ty(v).dtype
        )
    } else if group.residual_add.is_some() {
        "the convolution adds a residual".to_string()
    } else if group.depthwise.is_some() {
        "the convolution ends a separable block".to_string()
    } else {
        match read_once(graph, users, last) {
            Ok(()) => return Some(pool),
            Err(why) => why,
        }
    };
    notes.push(format!(
        "conv2d %{} keeps pool2d %{} in a separate kernel: {why}",
        group.anchor.0, pool.0
    ));
    None
}

/// Whether `bias` adds one value per channel to `conv`'s output without changing its shape.
fn is_channel_bias(graph: &Graph, conv: NodeId, bias: Value) -> bool {
    let out = &graph.node(conv).types[0];
    let rank = out.shape.rank();
    let channel_axis = match &graph.node(conv).op {
        Op::Conv2d(attrs) => match attrs.layout {
            Layout::Nchw => 1,
            Layout::Nhwc => 3,
        },
        Op::MatMul => rank - 1,
        _ => return false,
    };
    let b = graph.ty(bias);
    if b.dtype != out.dtype || b.shape.rank() > rank {
        return false;
    }
    let skip = rank - b.shape.rank();
    b.shape.dims().iter().enumerate().all(|(i, &d)| {
        let axis = i + skip;
        if axis == channel_axis {
            d == out.shape.dims()[axis]
        } else {
            d == 1
        }
    }) && b.shape.rank() + channel_axis >= rank
}

/// A convolution with the per-channel bias add and the activation that follow it on the way
/// to the next convolution of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chain {
    pub conv: NodeId,
    /// The `add` and its bias operand.
    pub bias: Option<(NodeId, Value)>,
    pub activation: Option<NodeId>,
    /// The inner nodes of a compound `activation` (SiLU, hard-swish).
    pub inner: Inner,
}

impl Chain {
    /// The values from the convolution's output to the chain's last result, in order.
    fn links(&self) -> Vec<Value> {
        let mut links = vec![value(self.conv)];
        links.extend(self.bias.map(|(add, _)| value(add)));
        links.extend(self.activation.map(value));
        links
    }
}

/// Walking back from `v` through at most an activation and, before it, a per-channel bias add,
/// to a convolution `accept` takes (its result 0).
fn chain_back(graph: &Graph, mut v: Value, accept: &dyn Fn(NodeId) -> bool) -> Option<Chain> {
    let activation = Activation::of_node(graph, v.node).map(|_| v.node);
    let inner = activation
        .and_then(|a| compound_parts(graph, a))
        .map_or([None; 3], |(_, _, inner)| inner);
    if let Some(a) = activation {
        v = Activation::input(graph, a);
    }
    let mut bias = None;
    if graph.node(v.node).op == Op::Binary(BinaryOp::Add) {
        let operands = &graph.node(v.node).operands;
        let found = operands.iter().enumerate().find_map(|(i, &d)| {
            let other = operands[1 - i];
            (accept(d.node) && d.result == 0 && is_channel_bias(graph, d.node, other))
                .then_some((d, other))
        });
        if let Some((d, other)) = found {
            bias = Some((v.node, other));
            v = d;
        }
    }
    (accept(v.node) && v.result == 0).then_some(Chain {
        conv: v.node,
        bias,
        activation,
        inner,
    })
}

/// Why a chain's values cannot all be absorbed, if so: one of them has other users or is a
/// graph output.
fn chain_refused(
    graph: &Graph,
    users: &BTreeMap<Value, Vec<NodeId>>,
    chain: &Chain,
) -> Option<String> {
    chain.links().into_iter().find_map(|link| {
        // The value a compound activation reads is read by its inner nodes too.
        let into_compound = chain
            .activation
            .filter(|&a| chain.inner[0].is_some() && Activation::input(graph, a) == link);
        let check = match into_compound {
            Some(a) => match activation_user(graph, users, link) {
                Ok(Some((user, _))) if user == a => Ok(a),
                Ok(_) => Err("it has other users".to_string()),
                Err(why) => Err(why),
            },
            None => single_use(graph, users, link),
        };
        check.err().map(|why| {
            if link.node == chain.conv {
                why
            } else {
                format!(
                    "{} %{} between them: {why}",
                    graph.node(link.node).op.name(),
                    link.node.0
                )
            }
        })
    })
}

/// The convolutions a pointwise convolution absorbs as the end of a depthwise-separable block:
/// the depthwise chain before it, and, before that, a 1×1 expand chain (MobileNetV2's inverted
/// residual) where there is one; or why the depthwise chain cannot be absorbed.
fn separable_chain(
    graph: &Graph,
    users: &BTreeMap<Value, Vec<NodeId>>,
    pointwise: NodeId,
) -> Option<Result<(Chain, Option<Chain>), String>> {
    if !is_pointwise(graph, pointwise) {
        return None;
    }
    let depthwise = chain_back(graph, graph.node(pointwise).operands[0], &|n| {
        is_depthwise(graph, n)
    })?;
    if let Some(why) = chain_refused(graph, users, &depthwise) {
        return Some(Err(format!(
            "depthwise %{} stays a kernel of its own before pointwise %{}: {why}",
            depthwise.conv.0, pointwise.0
        )));
    }
    let layout = |n: NodeId| match &graph.node(n).op {
        Op::Conv2d(attrs) => Some(attrs.layout),
        _ => None,
    };
    let expand = chain_back(graph, graph.node(depthwise.conv).operands[0], &|n| {
        is_pointwise(graph, n) && layout(n) == layout(depthwise.conv)
    })
    .filter(|e| chain_refused(graph, users, e).is_none());
    Some(Ok((depthwise, expand)))
}

/// Whether `id` is a permute swapping the last two axes (a matrix transpose, batch axes kept).
fn is_transpose(graph: &Graph, id: NodeId) -> bool {
    let Op::Permute { perm } = &graph.node(id).op else {
        return false;
    };
    let r = perm.len();
    r >= 2
        && perm[..r - 2].iter().enumerate().all(|(i, &p)| i == p)
        && perm[r - 2] == r - 1
        && perm[r - 1] == r - 2
}

/// Finds every convolution group in `graph`; notes say what a convolution could not absorb.
pub fn structured_groups(graph: &Graph, notes: &mut Vec<String>) -> Vec<StructuredGroup> {
    let users = use_counts(graph);
    let mut groups = Vec::new();
    let mut taken: Vec<NodeId> = Vec::new();
    // Depthwise convolutions absorbed by a later pointwise one, found first so that they are
    // not made groups of their own.
    let chains: BTreeMap<NodeId, _> = graph
        .node_ids()
        .filter_map(|id| Some((id, separable_chain(graph, &users, id)?)))
        .collect();
    let absorbed: Vec<NodeId> = chains
        .values()
        .filter_map(|c| c.as_ref().ok())
        .flat_map(|(d, e)| [Some(d.conv), e.map(|e| e.conv)])
        .flatten()
        .collect();
    for id in graph.node_ids() {
        if !matches!(graph.node(id).op, Op::Conv2d(_) | Op::MatMul)
            || taken.contains(&id)
            || absorbed.contains(&id)
        {
            continue;
        }
        let mut group = StructuredGroup {
            depthwise: None,
            depthwise_bias_add: None,
            depthwise_bias: None,
            depthwise_activation: None,
            depthwise_inner: [None; 3],
            expand: None,
            transposed: [None, None],
            anchor: id,
            bias_add: None,
            bias: None,
            scale_mul: None,
            scale: None,
            residual_add: None,
            residual: None,
            activation: None,
            activation_inner: [None; 3],
            cast: None,
            pool: None,
        };
        if graph.node(id).op == Op::MatMul {
            let operands = &graph.node(id).operands;
            for (side, operand) in operands.iter().enumerate() {
                if is_transpose(graph, operand.node) && operands[0] != operands[1] {
                    match single_use(graph, &users, *operand) {
                        Ok(_) => group.transposed[side] = Some(operand.node),
                        Err(why) => notes.push(format!(
                            "transpose %{} is materialized before matmul %{}: {why}",
                            operand.node.0, id.0
                        )),
                    }
                }
            }
        }
        match chains.get(&id) {
            Some(Ok((d, expand))) => {
                group.depthwise = Some(d.conv);
                group.depthwise_bias_add = d.bias.map(|(add, _)| add);
                group.depthwise_bias = d.bias.map(|(_, b)| b);
                group.depthwise_activation = d.activation;
                group.depthwise_inner = d.inner;
                group.expand = *expand;
            }
            Some(Err(why)) => notes.push(why.clone()),
            None => {}
        }
        // The epilogue, in this order: a per-channel bias, a scale (matmuls: one factor per
        // output column, or one for all), a residual (an operand of the output's own shape), an
        // activation. Each joins only if the value before it has that one user and is not a
        // graph output.
        let mut last = id;
        let mut refused_add = None;
        for residual in [false, true] {
            if residual && graph.node(id).op == Op::MatMul {
                if let Some((mul, factor)) = scale_after(graph, &users, id, value(last))
                    .filter(|(mul, _)| !taken.contains(mul))
                {
                    group.scale_mul = Some(mul);
                    group.scale = Some(factor);
                    last = mul;
                }
            }
            // No add here: none for the bias, but the scale and the residual may follow.
            let Ok(user) = single_use(graph, &users, value(last)) else {
                continue;
            };
            let Some(other) = added_operand(graph, user, value(last)) else {
                continue;
            };
            // An add of two products (`conv(x) + conv(y)`) is the epilogue of the first one
            // only: the second product is its residual, computed before it.
            if taken.contains(&user) {
                continue;
            }
            let fits = if residual {
                graph.ty(other) == graph.ty(value(last))
            } else {
                is_channel_bias(graph, id, other)
            };
            if !fits {
                refused_add = Some(user);
                continue;
            }
            refused_add = None;
            if residual {
                group.residual_add = Some(user);
                group.residual = Some(other);
            } else {
                group.bias_add = Some(user);
                group.bias = Some(other);
            }
            last = user;
        }
        if let Some(add) = refused_add {
            notes.push(format!(
                "{} %{} keeps add %{} in a separate kernel: the other operand is neither one \
                 value per output channel nor of the output's shape",
                graph.node(id).op.name(),
                id.0,
                add.0
            ));
        }
        match activation_user(graph, &users, value(last)) {
            Ok(Some((user, inner)))
                if !taken.contains(&user) && inner.iter().flatten().all(|n| !taken.contains(n)) =>
            {
                group.activation = Some(user);
                group.activation_inner = inner;
            }
            Ok(_) => {}
            Err(why) => {
                // Worth a note only where an epilogue was there to absorb.
                let epilogue_user = users.get(&value(last)).into_iter().flatten().any(|&u| {
                    matches!(graph.node(u).op, Op::Binary(BinaryOp::Add))
                        || Activation::of_node(graph, u).is_some()
                });
                if epilogue_user {
                    notes.push(format!(
                        "{} %{} keeps the rest of its epilogue in a separate kernel: {why}",
                        graph.node(last).op.name(),
                        last.0
                    ));
                }
            }
        }
        if graph.node(id).op == Op::MatMul {
            group.cast =
                cast_after(graph, &users, (id, group.last()), notes).filter(|c| !taken.contains(c));
        }
        group.pool = pool_after(graph, &users, &group, notes).filter(|p| !taken.contains(p));
        if group.absorbs() {
            taken.extend(group.nodes());
            groups.push(group);
        }
    }
    groups
}
