//! Small constructors for the nodes the gradient rules emit.

use kfuse_ir::{
    BinaryOp, CompareOp, Graph, IrError, Op, ReduceOp, Shape, TensorType, UnaryOp, Value,
};

use crate::scalar_array;

/// Appends nodes to the graph under construction.
pub struct Builder {
    graph: Graph,
}

impl Builder {
    pub fn new(graph: Graph) -> Builder {
        Builder { graph }
    }

    pub fn finish(self) -> Graph {
        self.graph
    }

    pub fn ty(&self, value: Value) -> &TensorType {
        self.graph.ty(value)
    }

    pub fn add(&mut self, op: Op, operands: Vec<Value>) -> Result<Value, IrError> {
        self.graph.add(op, operands)
    }

    /// A scalar constant of `value`'s dtype; binary ops broadcast it.
    pub fn scalar_like(&mut self, like: Value, value: f64) -> Result<Value, IrError> {
        let dtype = self.ty(like).dtype;
        self.add(
            Op::Constant {
                value: scalar_array(dtype, value),
            },
            vec![],
        )
    }

    /// A tensor of type `ty` filled with `value`.
    pub fn full(&mut self, ty: &TensorType, value: f64) -> Result<Value, IrError> {
        let scalar = self.add(
            Op::Constant {
                value: scalar_array(ty.dtype, value),
            },
            vec![],
        )?;
        if ty.shape.rank() == 0 {
            return Ok(scalar);
        }
        self.broadcast(scalar, &ty.shape)
    }

    pub fn unary(&mut self, op: UnaryOp, x: Value) -> Result<Value, IrError> {
        self.add(Op::Unary(op), vec![x])
    }

    pub fn binary(&mut self, op: BinaryOp, a: Value, b: Value) -> Result<Value, IrError> {
        self.add(Op::Binary(op), vec![a, b])
    }

    pub fn mul(&mut self, a: Value, b: Value) -> Result<Value, IrError> {
        self.binary(BinaryOp::Mul, a, b)
    }

    pub fn div(&mut self, a: Value, b: Value) -> Result<Value, IrError> {
        self.binary(BinaryOp::Div, a, b)
    }

    /// `x * value` for a constant `value`.
    pub fn scale(&mut self, x: Value, value: f64) -> Result<Value, IrError> {
        let c = self.scalar_like(x, value)?;
        self.mul(x, c)
    }

    /// `value + x` for a constant `value`.
    pub fn offset(&mut self, x: Value, value: f64) -> Result<Value, IrError> {
        let c = self.scalar_like(x, value)?;
        self.binary(BinaryOp::Add, c, x)
    }

    pub fn compare(&mut self, op: CompareOp, a: Value, b: Value) -> Result<Value, IrError> {
        self.add(Op::Compare(op), vec![a, b])
    }

    /// `cond ? g : 0`.
    pub fn where_else_zero(&mut self, cond: Value, g: Value) -> Result<Value, IrError> {
        let zero = self.scalar_like(g, 0.0)?;
        self.add(Op::Select, vec![cond, g, zero])
    }

    /// `cond ? 0 : g`.
    pub fn zero_where(&mut self, cond: Value, g: Value) -> Result<Value, IrError> {
        let zero = self.scalar_like(g, 0.0)?;
        self.add(Op::Select, vec![cond, zero, g])
    }

    pub fn reshape(&mut self, x: Value, shape: &Shape) -> Result<Value, IrError> {
        if self.ty(x).shape == *shape {
            return Ok(x);
        }
        self.add(
            Op::Reshape {
                shape: shape.clone(),
            },
            vec![x],
        )
    }

    pub fn broadcast(&mut self, x: Value, shape: &Shape) -> Result<Value, IrError> {
        if self.ty(x).shape == *shape {
            return Ok(x);
        }
        self.add(
            Op::Broadcast {
                shape: shape.clone(),
            },
            vec![x],
        )
    }

    pub fn permute(&mut self, x: Value, perm: Vec<usize>) -> Result<Value, IrError> {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(x);
        }
        self.add(Op::Permute { perm }, vec![x])
    }

    pub fn reduce_sum(
        &mut self,
        x: Value,
        axes: Vec<usize>,
        keepdims: bool,
    ) -> Result<Value, IrError> {
        self.add(
            Op::Reduce {
                op: ReduceOp::Sum,
                axes,
                keepdims,
            },
            vec![x],
        )
    }

    /// Sums `ct` (of a broadcast result's shape) back to `target`, the shape of an operand that
    /// was broadcast into it: over the leading axes the operand lacked and over its size-1 axes
    /// that were stretched, then reshaped to `target`.
    pub fn unbroadcast(&mut self, ct: Value, target: &Shape) -> Result<Value, IrError> {
        let shape = self.ty(ct).shape.clone();
        if shape == *target {
            return Ok(ct);
        }
        let lead = shape.rank() - target.rank();
        let mut axes: Vec<usize> = (0..lead).collect();
        for (i, &d) in target.dims().iter().enumerate() {
            if d == 1 && shape.dims()[lead + i] != 1 {
                axes.push(lead + i);
            }
        }
        let summed = if axes.is_empty() {
            ct
        } else {
            self.reduce_sum(ct, axes, false)?
        };
        self.reshape(summed, target)
    }
}
