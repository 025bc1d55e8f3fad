//! Inference folding: a per-channel affine chain after a convolution or matmul with constant
//! weights is folded into the weights and a single bias add.
//!
//! ```text
//! %c = conv2d(%x, %w)                       %w' = constant (w[o] * s[o])
//! %n = sub(%c, %mean)              ==>      %c' = conv2d(%x, %w')
//! %q = div(%n, %std)                        %y  = add(%c', %t)      t[o] = (beta - mean s)[o]
//! %g = mul(%q, %gamma)
//! %y = add(%g, %beta)
//! ```
//!
//! The chain may mix `add`, `sub`, `mul` and `div` by constants holding one value per output
//! channel (or one value in all). Its intermediate values must have one user and not be graph
//! outputs. Batchnorm in inference, a bias, and a scale all take this form once constant folding
//! has computed `sqrt(var + eps)`. For a matmul the channel is the last axis and the weights are
//! a constant `[K, N]` matrix. The folded weights round differently from the chain, so the pass
//! belongs to fast numerics.

use kfuse_ir::{Array, BinaryOp, DType, Graph, Layout, NodeId, Op, TensorType, Value};

use crate::rewrite::Rewriter;
use crate::{OptError, Pass, PassReport};

/// The affine-folding pass.
pub struct FoldAffine;

/// A matched chain: the anchor (conv2d or matmul), the chain's nodes, and the folded scale and
/// shift per channel.
struct Chain {
    anchor: NodeId,
    nodes: Vec<NodeId>,
    scale: Vec<f64>,
    shift: Vec<f64>,
}

/// The channel axis of an anchor's result and its constant weights, if it can fold.
fn anchor_info(graph: &Graph, id: NodeId) -> Option<(usize, &Array)> {
    let node = graph.node(id);
    let weights = match &graph.node(node.operands.get(1)?.node).op {
        Op::Constant { value } => value,
        _ => return None,
    };
    if !matches!(weights.dtype(), DType::F32 | DType::F64) {
        return None;
    }
    let rank = node.types[0].shape.rank();
    match &node.op {
        Op::Conv2d(attrs) => Some((
            match attrs.layout {
                Layout::Nchw => 1,
                Layout::Nhwc => 3,
            },
            weights,
        )),
        Op::MatMul if weights.shape().rank() == 2 => Some((rank - 1, weights)),
        _ => None,
    }
}

/// One value per channel from a constant that broadcasts along everything but `axis`, without
/// enlarging `out`.
fn per_channel(value: &Array, out: &TensorType, axis: usize) -> Option<Vec<f64>> {
    let (rank, c) = (out.shape.rank(), out.shape.dims()[axis]);
    let dims = value.shape().dims();
    if dims.len() > rank {
        return None;
    }
    let skip = rank - dims.len();
    let mut along = 1;
    for (i, &d) in dims.iter().enumerate() {
        if i + skip == axis {
            if d != c && d != 1 {
                return None;
            }
            along = d;
        } else if d != 1 {
            return None;
        }
    }
    Some(
        (0..c)
            .map(|ch| value.get_f64(if along == 1 { 0 } else { ch }))
            .collect(),
    )
}

fn users(graph: &Graph, v: Value) -> Vec<NodeId> {
    graph
        .node_ids()
        .filter(|&id| graph.node(id).operands.contains(&v))
        .collect()
}

fn match_chain(graph: &Graph, anchor: NodeId) -> Option<Chain> {
    let (axis, _) = anchor_info(graph, anchor)?;
    let ty = graph.node(anchor).types[0].clone();
    let c = ty.shape.dims()[axis];
    let (mut scale, mut shift) = (vec![1.0; c], vec![0.0; c]);
    let mut nodes = Vec::new();
    let mut current = Value::of(anchor);
    let mut scales = false;
    loop {
        if graph.outputs().iter().any(|o| o.value == current) {
            break;
        }
        let [user] = users(graph, current)[..] else {
            break;
        };
        let node = graph.node(user);
        let Op::Binary(op) = &node.op else { break };
        if node.types[0] != ty || node.operands[0] == node.operands[1] {
            break;
        }
        let (mine_first, other) = if node.operands[0] == current {
            (true, node.operands[1])
        } else {
            (false, node.operands[0])
        };
        let Op::Constant { value } = &graph.node(other.node).op else {
            break;
        };
        let Some(k) = per_channel(value, &ty, axis) else {
            break;
        };
        match (op, mine_first) {
            (BinaryOp::Add, _) => shift.iter_mut().zip(&k).for_each(|(t, k)| *t += k),
            (BinaryOp::Sub, true) => shift.iter_mut().zip(&k).for_each(|(t, k)| *t -= k),
            (BinaryOp::Sub, false) => {
                scale.iter_mut().for_each(|s| *s = -*s);
                shift.iter_mut().zip(&k).for_each(|(t, k)| *t = k - *t);
            }
            (BinaryOp::Mul, _) => {
                scales = true;
                scale.iter_mut().zip(&k).for_each(|(s, k)| *s *= k);
                shift.iter_mut().zip(&k).for_each(|(t, k)| *t *= k);
            }
            (BinaryOp::Div, true) => {
                scales = true;
                scale.iter_mut().zip(&k).for_each(|(s, k)| *s /= k);
                shift.iter_mut().zip(&k).for_each(|(t, k)| *t /= k);
            }
            _ => break,
        }
        nodes.push(user);
        current = Value::of(user);
    }
    // Only a chain that scales changes the weights; a lone bias add is already the folded form.
    (scales && !nodes.is_empty()).then_some(Chain {
        anchor,
        nodes,
        scale,
        shift,
    })
}

/// The anchor's weights scaled per output channel.
fn scaled_weights(graph: &Graph, chain: &Chain) -> Array {
    let node = graph.node(chain.anchor);
    let (_, weights) = anchor_info(graph, chain.anchor).expect("matched anchors fold");
    let dims = weights.shape().dims().to_vec();
    let n = weights.n_elems();
    let values: Vec<f64> = match node.op {
        // Weights are [C_out, C_in / groups, KH, KW]: output channel is the first axis.
        Op::Conv2d(_) => {
            let per = n / dims[0].max(1);
            (0..n)
                .map(|i| weights.get_f64(i) * chain.scale[i / per.max(1)])
                .collect()
        }
        // [K, N]: the output channel is the column.
        _ => (0..n)
            .map(|i| weights.get_f64(i) * chain.scale[i % dims[1]])
            .collect(),
    };
    let array = Array::from_vec(dims, values).expect("same element count");
    kfuse_interp::elementwise::cast(&array, weights.dtype())
}

/// The shift as a constant shaped to broadcast along the channel axis.
fn shift_constant(graph: &Graph, chain: &Chain) -> Array {
    let (axis, weights) = anchor_info(graph, chain.anchor).expect("matched anchors fold");
    let rank = graph.node(chain.anchor).types[0].shape.rank();
    let c = chain.shift.len();
    let dims: Vec<usize> = (axis..rank)
        .map(|a| if a == axis { c } else { 1 })
        .collect();
    let array = Array::from_vec(dims, chain.shift.clone()).expect("one value per channel");
    kfuse_interp::elementwise::cast(&array, weights.dtype())
}

impl Pass for FoldAffine {
    fn name(&self) -> &'static str {
        "fold-affine"
    }

    fn run(&self, graph: &Graph, report: &mut PassReport) -> Result<Option<Graph>, OptError> {
        let chains: Vec<Chain> = graph
            .node_ids()
            .filter(|&id| matches!(graph.node(id).op, Op::Conv2d(_) | Op::MatMul))
            .filter_map(|id| match_chain(graph, id))
            .collect();
        if chains.is_empty() {
            return Ok(None);
        }
        let mut out = Rewriter::new(self.name(), graph);
        for id in graph.node_ids() {
            if let Some(chain) = chains.iter().find(|c| c.nodes.last() == Some(&id)) {
                let anchor = graph.node(chain.anchor);
                let weights = out.add(
                    Op::Constant {
                        value: scaled_weights(graph, chain),
                    },
                    Vec::new(),
                )?;
                let x = out.moved(anchor.operands[0]);
                let mut y = out.add(anchor.op.clone(), vec![x, weights])?;
                if chain.shift.iter().any(|t| *t != 0.0) {
                    let shift = out.add(
                        Op::Constant {
                            value: shift_constant(graph, chain),
                        },
                        Vec::new(),
                    )?;
                    y = out.add(Op::Binary(BinaryOp::Add), vec![y, shift])?;
                }
                out.replace(id, y);
                let folded: Vec<String> = chain
                    .nodes
                    .iter()
                    .map(|n| format!("{} %{}", graph.node(*n).op.name(), n.0))
                    .collect();
                report.notes.push(format!(
                    "{} folded into the weights of {} %{} and one bias add",
                    folded.join(", "),
                    anchor.op.name(),
                    chain.anchor.0
                ));
                continue;
            }
            let absorbed = chains
                .iter()
                .any(|c| c.anchor == id || c.nodes.contains(&id));
            if !absorbed {
                out.copy(id)?;
            }
        }
        out.finish().map(Some)
    }
}
