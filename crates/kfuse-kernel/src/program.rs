//! A lowered graph: buffers, and the steps that fill them.

use kfuse_ir::{Array, Conv2dAttrs, Op, TensorType};

use crate::Kernel;

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
    /// A convolution with the neighbours it absorbed (`kfuse_fusion::ConvGroup`), run by one
    /// library routine. `inputs` are the activations, the depthwise weights (if any), the
    /// convolution weights and the bias (if any); `outputs` the group's one result.
    Structured {
        nodes: Vec<u32>,
        call: ConvCall,
        inputs: Vec<BufId>,
        outputs: Vec<BufId>,
    },
}

/// What a structured convolution step computes.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvCall {
    /// A depthwise convolution first, with the type of its (never stored) result.
    pub depthwise: Option<(Conv2dAttrs, TensorType)>,
    /// The convolution.
    pub conv: Conv2dAttrs,
    /// Add a per-channel bias (the last input) to the convolution's result.
    pub bias: bool,
    /// Then `relu`.
    pub relu: bool,
}

impl ConvCall {
    /// A name listing the work, such as `conv2d+add+relu`.
    pub fn name(&self) -> String {
        let mut parts = Vec::new();
        if self.depthwise.is_some() {
            parts.push("conv2d.depthwise");
        }
        parts.push("conv2d");
        if self.bias {
            parts.push("add");
        }
        if self.relu {
            parts.push("relu");
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
