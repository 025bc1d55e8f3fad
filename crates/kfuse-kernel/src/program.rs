//! A lowered graph: buffers, and the steps that fill them.

use kfuse_ir::{Array, Conv2dAttrs, Op, Pool2dAttrs, TensorType};

use crate::{Activation, Kernel};

/// Index of a buffer in a program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufId(pub u32);

/// Where a buffer's contents come from.
#[derive(Clone, Debug, PartialEq)]
pub enum BufferKind {
    /// Bound to the named graph input.
    Input(String),
    /// Constant data.
    Constant(Array),
    /// Written by a step.
    Computed,
}

/// A dense row-major buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct Buffer {
    pub ty: TensorType,
    pub kind: BufferKind,
    /// The graph node whose result it holds, and that node's op, for messages about it.
    pub node: u32,
    pub op: &'static str,
}

/// One unit of work.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// A fused kernel; `args[i]` is the buffer bound to kernel argument `i`.
    Kernel { kernel: Kernel, args: Vec<BufId> },
    /// A structured or opaque op run by a library routine on whole buffers.
    Library {
        node: u32,
        op: Op,
        inputs: Vec<BufId>,
        outputs: Vec<BufId>,
    },
    /// A convolution or matmul with the neighbours it absorbed (`kfuse_fusion::StructuredGroup`),
    /// run by one library routine. `inputs` are, for a convolution, the activations, the
    /// expand weights and bias (if any), the depthwise weights and bias (if any) and the
    /// weights; for a matmul its two operands (the
    /// untransposed sources where a transpose was folded); then the bias (if any). `outputs` is
    /// the group's one result.
    Structured {
        nodes: Vec<u32>,
        call: StructuredCall,
        inputs: Vec<BufId>,
        outputs: Vec<BufId>,
    },
}

/// The structured op of a structured step.
#[derive(Clone, Debug, PartialEq)]
pub enum Anchor {
    /// A convolution, after a depthwise convolution whose result is never stored.
    Conv {
        depthwise: Option<Depthwise>,
        conv: Conv2dAttrs,
    },
    /// A matmul; an operand marked with its transpose's permutation and result type is read
    /// through swapped strides from the transpose's source.
    MatMul {
        transposed: [Option<(Vec<usize>, TensorType)>; 2],
    },
}

/// The depthwise half of a depthwise-separable structured step.
#[derive(Clone, Debug, PartialEq)]
pub struct Depthwise {
    pub attrs: Conv2dAttrs,
    /// Its result's type (the same after its bias and activation).
    pub ty: TensorType,
    /// Add a per-channel bias (the input after the depthwise weights) to its result.
    pub bias: bool,
    /// Then this activation, before the result feeds the convolution.
    pub activation: Option<Activation>,
    /// A 1×1 expand convolution before it, whose result it alone reads (MobileNetV2's
    /// inverted residual): computed band by band with the depthwise half, never stored.
    pub expand: Option<Box<Expand>>,
}

/// The expansion of an inverted-residual structured step: a 1×1 convolution of the step's
/// activations, with its own per-channel bias (the input after its weights) and activation.
#[derive(Clone, Debug, PartialEq)]
pub struct Expand {
    pub attrs: Conv2dAttrs,
    /// Its result's type.
    pub ty: TensorType,
    pub bias: bool,
    pub activation: Option<Activation>,
}

/// What a structured step computes.
#[derive(Clone, Debug, PartialEq)]
pub struct StructuredCall {
    pub anchor: Anchor,
    /// Add a per-channel bias (the input after the operands) to the anchor's result.
    pub bias: bool,
    /// Then multiply by one factor per output column, or one factor (the input after the
    /// bias); matmuls only.
    pub scale: bool,
    /// Then add a residual of the output's shape (the last input).
    pub residual: bool,
    /// Then this activation.
    pub activation: Option<Activation>,
    /// Matmuls only: then a conversion to the output buffer's float dtype (the product is
    /// computed in its operands' dtype).
    pub cast: bool,
    /// Convolutions only: then this pooling, whose result is the output (the convolution's is
    /// never stored).
    pub pool: Option<Box<Pooled>>,
}

/// The pooling a structured convolution step ends with.
#[derive(Clone, Debug, PartialEq)]
pub struct Pooled {
    pub attrs: Pool2dAttrs,
    /// The type of the convolution's result (after its epilogue), the pooling's input.
    pub conv_ty: TensorType,
}

impl StructuredCall {
    /// A name listing the work, such as `conv2d+add+relu`.
    pub fn name(&self) -> String {
        let mut parts = Vec::new();
        match &self.anchor {
            Anchor::Conv { depthwise, .. } => {
                if let Some(d) = depthwise {
                    if let Some(e) = &d.expand {
                        parts.push("conv2d.expand");
                        if e.bias {
                            parts.push("add");
                        }
                        if let Some(a) = e.activation {
                            parts.push(a.name());
                        }
                    }
                    parts.push("conv2d.depthwise");
                    if d.bias {
                        parts.push("add");
                    }
                    if let Some(a) = d.activation {
                        parts.push(a.name());
                    }
                }
                parts.push("conv2d");
            }
            Anchor::MatMul { transposed } => {
                if transposed.iter().any(Option::is_some) {
                    parts.push("transpose");
                }
                parts.push("matmul");
            }
        }
        if self.bias {
            parts.push("add");
        }
        if self.scale {
            parts.push("mul");
        }
        if self.residual {
            parts.push("add");
        }
        if let Some(a) = self.activation {
            parts.push(a.name());
        }
        if self.cast {
            parts.push("cast");
        }
        if self.pool.is_some() {
            parts.push("pool2d");
        }
        parts.join("+")
    }
}

/// A graph lowered to buffers and steps, ready for a backend.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    pub buffers: Vec<Buffer>,
    /// Steps in execution order.
    pub steps: Vec<Step>,
    /// The graph's outputs and the buffers holding them.
    pub outputs: Vec<(String, BufId)>,
}

impl Program {
    pub fn buffer(&self, id: BufId) -> &Buffer {
        &self.buffers[id.0 as usize]
    }

    /// The kernels of the program, in order.
    pub fn kernels(&self) -> impl Iterator<Item = &Kernel> {
        self.steps.iter().filter_map(|s| match s {
            Step::Kernel { kernel, .. } => Some(kernel),
            Step::Library { .. } | Step::Structured { .. } => None,
        })
    }
}
