//! Lowering a partition to a program: buffers for stored values, one kernel per fused group.
//!
//! Every inline node is evaluated at an *index* (coordinates in its own shape, and/or the flat
//! row-major offset): movement ops only transform the index, so views never copy. Elementwise
//! ops broadcast by zeroing or dropping coordinates. A reduction is evaluated once per row: its
//! operand is evaluated at the domain's own index inside the reduction's pass.

use std::collections::{BTreeSet, HashMap};

use kfuse_fusion::{ActivationNode, KernelKind, Partition};
use kfuse_ir::{
    Array, BinaryOp, CompareOp, DType, Graph, NodeId, Op, PadMode, ReduceOp, Shape, Value,
};

use crate::ir::{Access, Arg, IndexOp, Inst, InstId, InstKind, Kernel};
use crate::program::{
    Anchor, BufId, Buffer, BufferKind, Depthwise, Expand, Pooled, Program, Step, StructuredCall,
};
use crate::Activation;

/// Why lowering failed. Lowering only fails on partitions that violate their own invariants, so
/// this is always a kfuse bug, reported rather than panicking.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("lowering kernel {kernel}: {message}")]
pub struct LowerError {
    pub kernel: usize,
    pub message: String,
}

/// Lowers `graph` as cut by `partition`.
pub fn lower(graph: &Graph, partition: &Partition) -> Result<Program, LowerError> {
    let mut buffers = Vec::new();
    let mut buf_of: HashMap<Value, BufId> = HashMap::new();
    for &id in partition.stored.keys() {
        let node = graph.node(id);
        for (r, ty) in node.types.iter().enumerate() {
            let kind = match &node.op {
                Op::Input { name, .. } => BufferKind::Input(name.clone()),
                Op::Constant { value } => BufferKind::Constant(value.clone()),
                _ => BufferKind::Computed,
            };
            buf_of.insert(
                Value {
                    node: id,
                    result: r as u32,
                },
                BufId(buffers.len() as u32),
            );
            buffers.push(Buffer {
                ty: ty.clone(),
                kind,
                node: id.0,
                op: node.op.name(),
            });
        }
    }
    let mut steps = Vec::new();
    for (k, kernel) in partition.kernels.iter().enumerate() {
        match &kernel.kind {
            KernelKind::Library => {
                let id = kernel.nodes[0];
                let node = graph.node(id);
                steps.push(Step::Library {
                    node: id.0,
                    op: node.op.clone(),
                    inputs: node.operands.iter().map(|v| buf_of[v]).collect(),
                    outputs: (0..node.types.len() as u32)
                        .map(|r| {
                            buf_of[&Value {
                                node: id,
                                result: r,
                            }]
                        })
                        .collect(),
                });
            }
            KernelKind::Structured(group) => {
                let operand = |node: NodeId, i: usize| buf_of[&graph.node(node).operands[i]];
                let conv_attrs = |node: NodeId| match &graph.node(node).op {
                    Op::Conv2d(attrs) => attrs.clone(),
                    other => unreachable!("a depthwise producer is a conv2d, not {}", other.name()),
                };
                let mut inputs = Vec::new();
                let anchor = match &graph.node(group.anchor).op {
                    Op::Conv2d(conv) => {
                        let depthwise = group.depthwise.map(|d| {
                            let expand = group.expand.map(|e| {
                                inputs.push(operand(e.conv, 0));
                                inputs.push(operand(e.conv, 1));
                                if let Some((_, bias)) = e.bias {
                                    inputs.push(buf_of[&bias]);
                                }
                                Box::new(Expand {
                                    attrs: conv_attrs(e.conv),
                                    ty: graph.node(e.conv).types[0].clone(),
                                    bias: e.bias.is_some(),
                                    activation: e
                                        .activation
                                        .and_then(|a| Activation::of_node(graph, a)),
                                })
                            });
                            if expand.is_none() {
                                inputs.push(operand(d, 0));
                            }
                            inputs.push(operand(d, 1));
                            if let Some(bias) = group.depthwise_bias {
                                inputs.push(buf_of[&bias]);
                            }
                            Depthwise {
                                attrs: conv_attrs(d),
                                ty: graph.node(d).types[0].clone(),
                                bias: group.depthwise_bias.is_some(),
                                activation: group
                                    .depthwise_activation
                                    .and_then(|a| Activation::of_node(graph, a)),
                                expand,
                            }
                        });
                        if depthwise.is_none() {
                            inputs.push(operand(group.anchor, 0));
                        }
                        inputs.push(operand(group.anchor, 1));
                        Anchor::Conv {
                            depthwise,
                            conv: conv.clone(),
                        }
                    }
                    _ => {
                        let mut transposed = [None, None];
                        for (side, slot) in transposed.iter_mut().enumerate() {
                            match group.transposed[side] {
                                Some(t) => {
                                    let Op::Permute { perm } = &graph.node(t).op else {
                                        unreachable!("a folded transpose is a permute")
                                    };
                                    inputs.push(operand(t, 0));
                                    *slot = Some((perm.clone(), graph.node(t).types[0].clone()));
                                }
                                None => inputs.push(operand(group.anchor, side)),
                            }
                        }
                        Anchor::MatMul { transposed }
                    }
                };
                if let Some(bias) = group.bias {
                    inputs.push(buf_of[&bias]);
                }
                if let Some(scale) = group.scale {
                    inputs.push(buf_of[&scale]);
                }
                if let Some(residual) = group.residual {
                    inputs.push(buf_of[&residual]);
                }
                let last = group.last();
                steps.push(Step::Structured {
                    nodes: group.nodes().iter().map(|n| n.0).collect(),
                    call: StructuredCall {
                        anchor,
                        bias: group.bias.is_some(),
                        scale: group.scale.is_some(),
                        residual: group.residual.is_some(),
                        activation: group.activation.and_then(|a| Activation::of_node(graph, a)),
                        cast: group.cast.is_some(),
                        pool: group.pool.map(|p| {
                            let Op::Pool2d(attrs) = &graph.node(p).op else {
                                unreachable!("an absorbed pooling is a pool2d")
                            };
                            // The pooling's input: the convolution's result after its epilogue.
                            let input = graph.node(p).operands[0];
                            Box::new(Pooled {
                                attrs: attrs.clone(),
                                conv_ty: graph.ty(input).clone(),
                            })
                        }),
                    },
                    inputs,
                    outputs: vec![
                        buf_of[&Value {
                            node: last,
                            result: 0,
                        }],
                    ],
                });
            }
            KernelKind::Fused { domain, reduce } => {
                let mut b = Builder::new(
                    graph,
                    k,
                    kernel.nodes.iter().copied().collect(),
                    domain.clone(),
                    reduce.clone(),
                    &buf_of,
                    &buffers,
                );
                for &out in &kernel.outputs {
                    b.store_output(out)?;
                }
                let (kernel_ir, args) = b.finish();
                kernel_ir
                    .verify()
                    .map_err(|message| LowerError { kernel: k, message })?;
                steps.push(Step::Kernel {
                    kernel: kernel_ir,
                    args,
                });
            }
        }
    }
    let outputs = graph
        .outputs()
        .iter()
        .map(|o| (o.name.clone(), buf_of[&o.value]))
        .collect();
    Ok(Program {
        buffers,
        steps,
        outputs,
    })
}

/// An index into a value of `shape`: its coordinates, its flat row-major offset, or both.
#[derive(Clone, Debug)]
struct Index {
    shape: Shape,
    flat: Option<InstId>,
    coords: Option<Vec<InstId>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum IndexKey {
    Flat(InstId),
    Coords(Vec<InstId>),
}

/// Bits of `value` converted to `dtype` as constant fills are (see the interpreter's `take`).
fn literal_bits(dtype: DType, value: f64) -> u64 {
    let array = match dtype {
        DType::F32 => Array::scalar(value as f32),
        DType::F64 => Array::scalar(value),
        DType::F16 => Array::scalar(kfuse_ir::f16::from_f64(value)),
        DType::BF16 => Array::scalar(kfuse_ir::bf16::from_f64(value)),
        DType::I32 => Array::scalar(value as i32),
        DType::I64 => Array::scalar(value as i64),
        DType::U8 => Array::scalar(value as u8),
        DType::Bool => Array::scalar(value != 0.0),
    };
    array.get_bits(0)
}

fn min_bits(dtype: DType) -> u64 {
    match dtype {
        DType::I32 => i32::MIN as u32 as u64,
        DType::I64 => i64::MIN as u64,
        _ => 0,
    }
}

fn max_bits(dtype: DType) -> u64 {
    match dtype {
        DType::I32 => i32::MAX as u32 as u64,
        DType::I64 => i64::MAX as u64,
        _ => u8::MAX as u64,
    }
}

struct Builder<'a> {
    graph: &'a Graph,
    kernel: usize,
    inline: BTreeSet<NodeId>,
    domain: Shape,
    reduce: Vec<usize>,
    insts: Vec<Inst>,
    intern: HashMap<Inst, InstId>,
    args: Vec<(BufId, Access)>,
    buf_of: &'a HashMap<Value, BufId>,
    buffers: &'a [Buffer],
    domain_index: Index,
    memo: HashMap<(Value, IndexKey), InstId>,
    row_memo: HashMap<NodeId, InstId>,
}

impl<'a> Builder<'a> {
    fn new(
        graph: &'a Graph,
        kernel: usize,
        inline: BTreeSet<NodeId>,
        domain: Shape,
        reduce: Vec<usize>,
        buf_of: &'a HashMap<Value, BufId>,
        buffers: &'a [Buffer],
    ) -> Self {
        let placeholder = Index {
            shape: domain.clone(),
            flat: None,
            coords: None,
        };
        let mut b = Builder {
            graph,
            kernel,
            inline,
            domain,
            reduce,
            insts: Vec::new(),
            intern: HashMap::new(),
            args: Vec::new(),
            buf_of,
            buffers,
            domain_index: placeholder,
            memo: HashMap::new(),
            row_memo: HashMap::new(),
        };
        b.domain_index = b.make_domain_index();
        b
    }

    fn err<T>(&self, message: impl Into<String>) -> Result<T, LowerError> {
        Err(LowerError {
            kernel: self.kernel,
            message: message.into(),
        })
    }

    /// See [`kfuse_fusion::splits_rows`]: the partitioner's cost estimates rely on the same rule.
    fn split_rows(&self) -> bool {
        kfuse_fusion::splits_rows(&self.domain, &self.reduce)
    }

    /// The number of trailing domain axes a row spans ([`kfuse_fusion::row_axes`]).
    fn row_axes(&self) -> usize {
        kfuse_fusion::row_axes(&self.domain, &self.reduce)
    }

    fn outer_dims(&self) -> Vec<usize> {
        if self.split_rows() {
            self.domain.dims()[..self.domain.rank() - self.row_axes()].to_vec()
        } else if self.reduce.is_empty() {
            vec![]
        } else {
            (0..self.domain.rank())
                .filter(|k| !self.reduce.contains(k))
                .map(|k| self.domain.dims()[k])
                .collect()
        }
    }

    fn inner_dims(&self) -> Vec<usize> {
        if self.split_rows() {
            let rank = self.domain.rank();
            vec![self.domain.dims()[rank - self.row_axes()..]
                .iter()
                .product()]
        } else if self.reduce.is_empty() {
            vec![self.domain.n_elems()]
        } else {
            self.reduce.iter().map(|&a| self.domain.dims()[a]).collect()
        }
    }

    fn inst(&mut self, kind: InstKind, dtype: DType) -> InstId {
        let inst = Inst { kind, dtype };
        if let Some(&id) = self.intern.get(&inst) {
            return id;
        }
        let id = InstId(self.insts.len() as u32);
        self.insts.push(inst);
        if !matches!(kind, InstKind::Store { .. }) {
            self.intern.insert(inst, id);
        }
        id
    }

    fn int(&mut self, v: i64) -> InstId {
        self.inst(InstKind::Const(v as u64), DType::I64)
    }

    fn const_of(&self, id: InstId) -> Option<i64> {
        match self.insts[id.index()] {
            Inst {
                kind: InstKind::Const(bits),
                dtype: DType::I64,
            } => Some(bits as i64),
            _ => None,
        }
    }

    /// Index arithmetic with constant folding and identities.
    fn iop(&mut self, op: IndexOp, a: InstId, b: InstId) -> InstId {
        let (ca, cb) = (self.const_of(a), self.const_of(b));
        if let (Some(x), Some(y)) = (ca, cb) {
            return self.int(op.apply(x, y));
        }
        match (op, ca, cb) {
            (IndexOp::Add, Some(0), _) | (IndexOp::Mul, Some(1), _) => return b,
            (IndexOp::Add | IndexOp::Sub, _, Some(0))
            | (IndexOp::Mul | IndexOp::Div, _, Some(1)) => return a,
            (IndexOp::Mul, Some(0), _)
            | (IndexOp::Mul, _, Some(0))
            | (IndexOp::Rem, _, Some(1)) => return self.int(0),
            _ => {}
        }
        self.inst(InstKind::Index(op, a, b), DType::I64)
    }

    /// Coordinates of a flat index over `dims`: `(flat / stride) % dim`, simplified.
    fn unflatten(&mut self, flat: InstId, dims: &[usize]) -> Vec<InstId> {
        let strides = Shape::new(dims.to_vec()).strides();
        (0..dims.len())
            .map(|k| {
                if dims[k] == 1 {
                    return self.int(0);
                }
                let s = self.int(strides[k] as i64);
                let q = self.iop(IndexOp::Div, flat, s);
                // With only size-1 dims before axis k, flat / stride is already below dims[k].
                if dims[..k].iter().all(|&d| d == 1) {
                    q
                } else {
                    let d = self.int(dims[k] as i64);
                    self.iop(IndexOp::Rem, q, d)
                }
            })
            .collect()
    }

    fn make_domain_index(&mut self) -> Index {
        let j = self.inst(InstKind::InnerIndex, DType::I64);
        if self.split_rows() {
            let o = self.inst(InstKind::OuterIndex, DType::I64);
            let outer = self.outer_dims();
            let row_dims = self.domain.dims()[outer.len()..].to_vec();
            let row = self.int(row_dims.iter().product::<usize>() as i64);
            let mut coords = self.unflatten(o, &outer);
            coords.extend(self.unflatten(j, &row_dims));
            let start = self.iop(IndexOp::Mul, o, row);
            let flat = self.iop(IndexOp::Add, start, j);
            return Index {
                shape: self.domain.clone(),
                flat: Some(flat),
                coords: Some(coords),
            };
        }
        if self.reduce.is_empty() {
            return Index {
                shape: self.domain.clone(),
                flat: Some(j),
                coords: None,
            };
        }
        let o = self.inst(InstKind::OuterIndex, DType::I64);
        let outer = self.outer_dims();
        let inner = self.inner_dims();
        let oc = self.unflatten(o, &outer);
        let ic = self.unflatten(j, &inner);
        let (mut oi, mut ii) = (oc.into_iter(), ic.into_iter());
        let coords: Vec<InstId> = (0..self.domain.rank())
            .map(|k| {
                if self.reduce.contains(&k) {
                    ii.next().expect("inner coordinate")
                } else {
                    oi.next().expect("outer coordinate")
                }
            })
            .collect();
        let rank = self.domain.rank();
        let trailing = self
            .reduce
            .iter()
            .enumerate()
            .all(|(q, &a)| a == rank - self.reduce.len() + q);
        let flat = if trailing {
            let n = self.int(inner.iter().product::<usize>() as i64);
            let on = self.iop(IndexOp::Mul, o, n);
            Some(self.iop(IndexOp::Add, on, j))
        } else {
            None
        };
        Index {
            shape: self.domain.clone(),
            flat,
            coords: Some(coords),
        }
    }

    fn coords(&mut self, idx: &Index) -> Vec<InstId> {
        match (&idx.coords, idx.flat) {
            (Some(c), _) => c.clone(),
            (None, Some(flat)) => self.unflatten(flat, idx.shape.dims()),
            (None, None) => unreachable!("an index has coordinates or a flat offset"),
        }
    }

    fn flat(&mut self, idx: &Index) -> InstId {
        if let Some(f) = idx.flat {
            return f;
        }
        let coords = idx
            .coords
            .clone()
            .expect("an index has coordinates or a flat offset");
        let strides = idx.shape.strides();
        // Terms (coordinate, stride), adjacent coordinates that split one index recombined.
        let mut terms: Vec<(InstId, usize)> = Vec::new();
        for (k, &c) in coords.iter().enumerate() {
            if idx.shape.dims()[k] == 1 {
                continue;
            }
            terms.push((c, strides[k]));
            while terms.len() >= 2 {
                let (y, sy) = terms[terms.len() - 1];
                let (x, sx) = terms[terms.len() - 2];
                let Some(joined) = self.recombine(x, sx, y, sy) else {
                    break;
                };
                terms.truncate(terms.len() - 2);
                terms.push((joined, sy));
            }
        }
        let mut acc = self.int(0);
        for (c, stride) in terms {
            let s = self.int(stride as i64);
            let term = self.iop(IndexOp::Mul, c, s);
            acc = self.iop(IndexOp::Add, acc, term);
        }
        acc
    }

    /// `x * sx + y * sy` as one coordinate times `sy`, where `x` and `y` are the two halves of
    /// splitting an index `a` by `q = sx / sy`: `(a / q) * q + a % q == a`, and
    /// `((a / q) % m) * q + a % q == a % (q * m)` (indices are never negative). A row of an
    /// NCHW image's H and W, unflattened to read a permuted operand, reads it at `j * C`.
    fn recombine(&mut self, x: InstId, sx: usize, y: InstId, sy: usize) -> Option<InstId> {
        let split = |this: &Self, id: InstId, op: IndexOp| match this.insts[id.index()].kind {
            InstKind::Index(o, a, b) if o == op => Some((a, this.const_of(b)?)),
            _ => None,
        };
        let (a, q) = split(self, y, IndexOp::Rem)?;
        if q <= 0 || sy == 0 || sx != q as usize * sy {
            return None;
        }
        if split(self, x, IndexOp::Div) == Some((a, q)) {
            return Some(a);
        }
        let (inner, m) = split(self, x, IndexOp::Rem)?;
        if split(self, inner, IndexOp::Div) != Some((a, q)) {
            return None;
        }
        let qm = self.int(q.checked_mul(m)?);
        Some(self.iop(IndexOp::Rem, a, qm))
    }

    fn at(shape: &Shape, coords: Vec<InstId>) -> Index {
        Index {
            shape: shape.clone(),
            flat: None,
            coords: Some(coords),
        }
    }

    /// The index of a broadcast operand of shape `op_shape` read at `idx` (numpy alignment).
    fn broadcast_index(&mut self, idx: &Index, op_shape: &Shape) -> Index {
        if op_shape == &idx.shape {
            return idx.clone();
        }
        if op_shape.n_elems() == 1 {
            let zero = self.int(0);
            return Builder::at(op_shape, vec![zero; op_shape.rank()]);
        }
        let coords = self.coords(idx);
        let skip = idx.shape.rank() - op_shape.rank();
        let zero = self.int(0);
        let c = op_shape
            .dims()
            .iter()
            .enumerate()
            .map(|(a, &d)| if d == 1 { zero } else { coords[a + skip] })
            .collect();
        Builder::at(op_shape, c)
    }

    fn arg(&mut self, buf: BufId, access: Access) -> u32 {
        if let Some(i) = self.args.iter().position(|a| *a == (buf, access)) {
            return i as u32;
        }
        self.args.push((buf, access));
        (self.args.len() - 1) as u32
    }

    /// The value of `v` at `idx`.
    fn value_at(&mut self, v: Value, idx: &Index) -> Result<InstId, LowerError> {
        let key = (
            v,
            match idx.flat {
                Some(f) => IndexKey::Flat(f),
                None => IndexKey::Coords(idx.coords.clone().expect("index")),
            },
        );
        if let Some(&id) = self.memo.get(&key) {
            return Ok(id);
        }
        let id = self.compute(v, idx)?;
        self.memo.insert(key, id);
        Ok(id)
    }

    fn compute(&mut self, v: Value, idx: &Index) -> Result<InstId, LowerError> {
        let graph = self.graph;
        let node = graph.node(v.node);
        let ty = graph.ty(v).clone();
        if ty.shape.n_elems() == 0 {
            // A value without elements is never read at run time (every index into it would be
            // out of range), so any literal stands in for it.
            return Ok(self.inst(InstKind::Const(0), ty.dtype));
        }
        if !self.inline.contains(&v.node) {
            let Some(&buf) = self.buf_of.get(&v) else {
                return self.err(format!(
                    "%{} is neither computed in this kernel nor stored",
                    v.node.0
                ));
            };
            let arg = self.arg(buf, Access::Read);
            let offset = self.flat(idx);
            return Ok(self.inst(InstKind::Load { arg, offset }, ty.dtype));
        }
        let operand = |i: usize| node.operands[i];
        let op_shape = |i: usize| graph.ty(node.operands[i]).shape.clone();
        let dtype = ty.dtype;
        Ok(match &node.op {
            Op::Constant { value } => self.inst(InstKind::Const(value.get_bits(0)), dtype),
            Op::Unary(u) => {
                let a = self.value_at(operand(0), idx)?;
                self.inst(InstKind::Unary(*u, a), dtype)
            }
            Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Clamp => {
                let mut ops = Vec::new();
                for i in 0..node.operands.len() {
                    let oi = self.broadcast_index(idx, &op_shape(i));
                    ops.push(self.value_at(operand(i), &oi)?);
                }
                match &node.op {
                    Op::Binary(b) => self.inst(InstKind::Binary(*b, ops[0], ops[1]), dtype),
                    Op::Compare(c) => self.inst(InstKind::Compare(*c, ops[0], ops[1]), DType::Bool),
                    Op::Select => self.inst(InstKind::Select(ops[0], ops[1], ops[2]), dtype),
                    _ => {
                        let lo = self.inst(InstKind::Binary(BinaryOp::Max, ops[0], ops[1]), dtype);
                        self.inst(InstKind::Binary(BinaryOp::Min, lo, ops[2]), dtype)
                    }
                }
            }
            Op::Cast { .. } => {
                let a = self.value_at(operand(0), idx)?;
                if graph.ty(operand(0)).dtype == dtype {
                    a
                } else {
                    self.inst(InstKind::Cast(a), dtype)
                }
            }
            Op::Iota { axis, .. } => {
                let coords = self.coords(idx);
                self.inst(InstKind::Cast(coords[*axis]), dtype)
            }
            Op::Reshape { .. } => {
                let flat = self.flat(idx);
                let inner = Index {
                    shape: op_shape(0),
                    flat: Some(flat),
                    coords: None,
                };
                self.value_at(operand(0), &inner)?
            }
            Op::Broadcast { .. } => {
                let inner = self.broadcast_index(idx, &op_shape(0));
                self.value_at(operand(0), &inner)?
            }
            Op::Permute { perm } => {
                let coords = self.coords(idx);
                let mut c = coords.clone();
                for (k, &p) in perm.iter().enumerate() {
                    c[p] = coords[k];
                }
                self.value_at(operand(0), &Builder::at(&op_shape(0), c))?
            }
            Op::Slice { start, step, .. } => {
                let coords = self.coords(idx);
                let mut c = Vec::with_capacity(coords.len());
                for k in 0..coords.len() {
                    let s = self.int(step[k] as i64);
                    let scaled = self.iop(IndexOp::Mul, coords[k], s);
                    let b = self.int(start[k] as i64);
                    c.push(self.iop(IndexOp::Add, scaled, b));
                }
                self.value_at(operand(0), &Builder::at(&op_shape(0), c))?
            }
            Op::Flip { axes } => {
                let coords = self.coords(idx);
                let shape = op_shape(0);
                let mut c = coords.clone();
                for &a in axes {
                    let last = self.int(shape.dims()[a] as i64 - 1);
                    c[a] = self.iop(IndexOp::Sub, last, coords[a]);
                }
                self.value_at(operand(0), &Builder::at(&shape, c))?
            }
            Op::Pad {
                low, mode, value, ..
            } => self.pad(
                operand(0),
                &op_shape(0),
                idx,
                low,
                *mode,
                value.value(),
                dtype,
            )?,
            Op::Concat { axis } => self.concat(node.operands.clone(), idx, *axis, dtype)?,
            Op::Reduce { op, axes, .. } if axes.is_empty() => {
                self.empty_reduction(*op, operand(0), idx, dtype)?
            }
            Op::Reduce { .. } => self.reduction(v.node, idx)?,
            other => {
                return self.err(format!(
                    "%{} ({}) cannot be computed inside a fused kernel",
                    v.node.0,
                    other.name()
                ))
            }
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn pad(
        &mut self,
        src: Value,
        shape: &Shape,
        idx: &Index,
        low: &[usize],
        mode: PadMode,
        fill: f64,
        dtype: DType,
    ) -> Result<InstId, LowerError> {
        let fill_inst = self.inst(InstKind::Const(literal_bits(dtype, fill)), dtype);
        if shape.n_elems() == 0 {
            return Ok(fill_inst);
        }
        let coords = self.coords(idx);
        let zero = self.int(0);
        let mut inside: Option<InstId> = None;
        let mut c = Vec::with_capacity(coords.len());
        for k in 0..coords.len() {
            let d = shape.dims()[k] as i64;
            let out_d = idx.shape.dims()[k] as i64;
            if out_d == d {
                c.push(coords[k]);
                continue;
            }
            let lo = self.int(low[k] as i64);
            let pos = self.iop(IndexOp::Sub, coords[k], lo);
            let last = self.int(d - 1);
            let src_pos = match mode {
                PadMode::Constant | PadMode::Edge => {
                    let at_least_0 = self.iop(IndexOp::Max, pos, zero);
                    self.iop(IndexOp::Min, at_least_0, last)
                }
                PadMode::Reflect => {
                    // Mirror without repeating the edge; padding is below the dim, so one
                    // reflection on each side suffices.
                    let neg = self.inst(InstKind::Compare(CompareOp::Lt, pos, zero), DType::Bool);
                    let flipped = self.iop(IndexOp::Sub, zero, pos);
                    let left = self.inst(InstKind::Select(neg, flipped, pos), DType::I64);
                    let dd = self.int(d);
                    let over = self.inst(InstKind::Compare(CompareOp::Ge, left, dd), DType::Bool);
                    let twice = self.int(2 * (d - 1));
                    let mirrored = self.iop(IndexOp::Sub, twice, left);
                    self.inst(InstKind::Select(over, mirrored, left), DType::I64)
                }
            };
            if mode == PadMode::Constant {
                let ge = self.inst(InstKind::Compare(CompareOp::Ge, pos, zero), DType::Bool);
                let dd = self.int(d);
                let lt = self.inst(InstKind::Compare(CompareOp::Lt, pos, dd), DType::Bool);
                let both = self.inst(InstKind::Binary(BinaryOp::And, ge, lt), DType::Bool);
                inside = Some(match inside {
                    None => both,
                    Some(prev) => {
                        self.inst(InstKind::Binary(BinaryOp::And, prev, both), DType::Bool)
                    }
                });
            }
            c.push(src_pos);
        }
        let value = self.value_at(src, &Builder::at(shape, c))?;
        Ok(match inside {
            Some(cond) => self.inst(InstKind::Select(cond, value, fill_inst), dtype),
            None => value,
        })
    }

    fn concat(
        &mut self,
        parts: Vec<Value>,
        idx: &Index,
        axis: usize,
        dtype: DType,
    ) -> Result<InstId, LowerError> {
        let coords = self.coords(idx);
        let zero = self.int(0);
        let mut pieces = Vec::new();
        let mut offset = 0i64;
        for part in parts {
            let shape = self.graph.ty(part).shape.clone();
            let d = shape.dims()[axis] as i64;
            if d > 0 {
                let off = self.int(offset);
                let rel = self.iop(IndexOp::Sub, coords[axis], off);
                let last = self.int(d - 1);
                let lo = self.iop(IndexOp::Max, rel, zero);
                let clamped = self.iop(IndexOp::Min, lo, last);
                let mut c = coords.clone();
                c[axis] = clamped;
                let v = self.value_at(part, &Builder::at(&shape, c))?;
                pieces.push((offset + d, v));
            }
            offset += d;
        }
        let (_, mut acc) = pieces
            .pop()
            .expect("a non-empty concat has a non-empty part");
        while let Some((end, v)) = pieces.pop() {
            let e = self.int(end);
            let before = self.inst(
                InstKind::Compare(CompareOp::Lt, coords[axis], e),
                DType::Bool,
            );
            acc = self.inst(InstKind::Select(before, v, acc), dtype);
        }
        Ok(acc)
    }

    /// A reduction over no axes: each element is folded once into the identity, exactly as the
    /// reference interpreter does (`0 + x` turns `-0` into `+0`; arg reductions give 0).
    fn empty_reduction(
        &mut self,
        op: ReduceOp,
        src: Value,
        idx: &Index,
        dtype: DType,
    ) -> Result<InstId, LowerError> {
        if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) {
            return Ok(self.int(0));
        }
        let x = self.value_at(src, idx)?;
        let (binary, identity) = match op {
            ReduceOp::Sum | ReduceOp::Mean => (BinaryOp::Add, 0.0),
            ReduceOp::Prod => (BinaryOp::Mul, 1.0),
            ReduceOp::Max => (BinaryOp::Max, f64::NEG_INFINITY),
            _ => (BinaryOp::Min, f64::INFINITY),
        };
        let identity = match (dtype, op) {
            (d, ReduceOp::Max) if d.is_int() => self.inst(InstKind::Const(min_bits(d)), d),
            (d, ReduceOp::Min) if d.is_int() => self.inst(InstKind::Const(max_bits(d)), d),
            (d, _) => self.inst(InstKind::Const(literal_bits(d, identity)), d),
        };
        Ok(self.inst(InstKind::Binary(binary, identity, x), dtype))
    }

    /// The coordinates of a reduction's result at the current row.
    fn row_coords(&mut self, keep_rank: bool) -> Vec<InstId> {
        let domain_coords = self.coords(&self.domain_index.clone());
        let zero = self.int(0);
        (0..self.domain.rank())
            .filter_map(|k| {
                if self.reduce.contains(&k) {
                    keep_rank.then_some(zero)
                } else {
                    Some(if self.domain.dims()[k] == 1 {
                        zero
                    } else {
                        domain_coords[k]
                    })
                }
            })
            .collect()
    }

    fn reduction(&mut self, id: NodeId, idx: &Index) -> Result<InstId, LowerError> {
        let graph = self.graph;
        let node = graph.node(id);
        let Op::Reduce { op, axes, keepdims } = &node.op else {
            unreachable!("called on reductions")
        };
        let input = graph.ty(node.operands[0]).clone();
        if input.shape != self.domain || axes != &self.reduce {
            return self.err(format!(
                "reduction %{} over {} axes {axes:?} placed in a kernel over {} axes {:?}",
                id.0, input.shape, self.domain, self.reduce
            ));
        }
        let here = self.coords(idx);
        let want = self.row_coords(*keepdims);
        let normalized: Vec<InstId> = here
            .iter()
            .zip(node.types[0].shape.dims())
            .map(|(&c, &d)| if d == 1 { self.int(0) } else { c })
            .collect();
        if normalized != want {
            return self.err(format!("reduction %{} is read off its row", id.0));
        }
        if let Some(&r) = self.row_memo.get(&id) {
            return Ok(r);
        }
        let domain_index = self.domain_index.clone();
        let mut value = self.value_at(node.operands[0], &domain_index)?;
        let dtype = node.types[0].dtype;
        let compute = input.dtype.compute_type();
        if compute != input.dtype {
            value = self.inst(InstKind::Cast(value), compute);
        }
        let result = match op {
            ReduceOp::ArgMax | ReduceOp::ArgMin => {
                self.inst(InstKind::Reduce { op: *op, value }, DType::I64)
            }
            ReduceOp::Mean => {
                let sum = self.inst(
                    InstKind::Reduce {
                        op: ReduceOp::Sum,
                        value,
                    },
                    compute,
                );
                let wide = self.inst(InstKind::Cast(sum), DType::F64);
                let n = self.inst(
                    InstKind::Const((self.inner_dims().iter().product::<usize>() as f64).to_bits()),
                    DType::F64,
                );
                let q = self.inst(InstKind::Binary(BinaryOp::Div, wide, n), DType::F64);
                let back = self.inst(InstKind::Cast(q), compute);
                if compute != dtype {
                    self.inst(InstKind::Cast(back), dtype)
                } else {
                    back
                }
            }
            _ => {
                let r = self.inst(InstKind::Reduce { op: *op, value }, compute);
                if compute != dtype {
                    self.inst(InstKind::Cast(r), dtype)
                } else {
                    r
                }
            }
        };
        self.row_memo.insert(id, result);
        Ok(result)
    }

    /// Stores kernel output `id` at its own index: the domain index for element-level outputs,
    /// the current row for row-level ones.
    fn store_output(&mut self, id: NodeId) -> Result<(), LowerError> {
        let v = Value::of(id);
        let ty = self.graph.ty(v).clone();
        let idx = if ty.shape == self.domain {
            self.domain_index.clone()
        } else {
            let coords = self.row_coords(ty.shape.rank() == self.domain.rank());
            Builder::at(&ty.shape, coords)
        };
        let value = self.value_at(v, &idx)?;
        let offset = self.flat(&idx);
        let Some(&buf) = self.buf_of.get(&v) else {
            return self.err(format!("output %{} has no buffer", id.0));
        };
        let arg = self.arg(buf, Access::Write);
        self.inst(InstKind::Store { arg, offset, value }, ty.dtype);
        Ok(())
    }

    /// The kernel with dead instructions removed, and its argument buffers.
    fn finish(self) -> (Kernel, Vec<BufId>) {
        let mut live = vec![false; self.insts.len()];
        for i in (0..self.insts.len()).rev() {
            if matches!(self.insts[i].kind, InstKind::Store { .. }) {
                live[i] = true;
            }
            if live[i] {
                for o in self.insts[i].operands() {
                    live[o.index()] = true;
                }
            }
        }
        let mut renumber = vec![InstId(u32::MAX); self.insts.len()];
        let mut insts = Vec::new();
        for (i, inst) in self.insts.iter().enumerate().filter(|(i, _)| live[*i]) {
            let r = |x: InstId| renumber[x.index()];
            let kind = match inst.kind {
                InstKind::Index(op, a, b) => InstKind::Index(op, r(a), r(b)),
                InstKind::Unary(u, a) => InstKind::Unary(u, r(a)),
                InstKind::Binary(b, x, y) => InstKind::Binary(b, r(x), r(y)),
                InstKind::Compare(c, x, y) => InstKind::Compare(c, r(x), r(y)),
                InstKind::Select(c, x, y) => InstKind::Select(r(c), r(x), r(y)),
                InstKind::Cast(a) => InstKind::Cast(r(a)),
                InstKind::Load { arg, offset } => InstKind::Load {
                    arg,
                    offset: r(offset),
                },
                InstKind::Reduce { op, value } => InstKind::Reduce {
                    op,
                    value: r(value),
                },
                InstKind::Store { arg, offset, value } => InstKind::Store {
                    arg,
                    offset: r(offset),
                    value: r(value),
                },
                k @ (InstKind::OuterIndex | InstKind::InnerIndex | InstKind::Const(_)) => k,
            };
            renumber[i] = InstId(insts.len() as u32);
            insts.push(Inst {
                kind,
                dtype: inst.dtype,
            });
        }
        let args = self
            .args
            .iter()
            .map(|&(buf, access)| Arg {
                ty: self.buffers[buf.0 as usize].ty.clone(),
                access,
            })
            .collect();
        let kernel = Kernel {
            name: format!("k{}", self.kernel),
            outer: self.outer_dims(),
            inner: self.inner_dims(),
            args,
            insts,
        };
        (kernel, self.args.iter().map(|a| a.0).collect())
    }
}
