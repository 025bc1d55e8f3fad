//! kfuse graph passes.
//!
//! A [`Pass`] maps a graph to a graph and says what it did. A [`Pipeline`] runs passes in a
//! fixed order, verifying the graph after each in debug builds. The passes:
//!
//! - [`ConstantFold`]: nodes whose operands are all constants become constants, evaluated by the
//!   reference interpreter (so folding never changes a result);
//! - [`FoldAffine`]: inference folding. A per-channel affine chain after a convolution or matmul
//!   with constant weights (batchnorm, a bias, a scale) is folded into the weights and one bias
//!   add. This rounds differently from the original, so it belongs to fast numerics only;
//! - [`MergeDots`]: matmuls sharing their left operand, with constant weights, become one
//!   matmul over the concatenated weights (fast numerics: the wider GEMM blocks differently);
//! - [`ConvLayout`]: NHWC convolutions and poolings, with the elementwise ops between them,
//!   take their NCHW form where the layout changes at the region's edges cost less than the
//!   NCHW routines save (fast numerics: the compiled convolutions sum in another order);
//! - [`DeadCode`]: nodes no output depends on are dropped.
//!
//! [`freeze`] turns named inputs into constants (model weights known at compile time), which
//! is what lets the folding passes see them.

mod fold_affine;
mod layout;
mod merge_dots;
mod rewrite;

use kfuse_ir::{Array, Graph, IrError, Op};

pub use fold_affine::FoldAffine;
pub use layout::{nhwc_slowdown, ConvLayout};
pub use merge_dots::MergeDots;

/// Errors from passes: a rewrite produced an ill-typed graph (a bug), or a request was bad.
#[derive(Debug, thiserror::Error)]
pub enum OptError {
    /// A pass built a graph the IR rejects.
    #[error("pass {pass} produced an invalid graph: {error}")]
    Invalid { pass: &'static str, error: IrError },
    /// Freezing named an input the graph lacks, or gave the wrong type.
    #[error("{0}")]
    Freeze(String),
}

/// What a pass did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PassReport {
    /// One line per rewrite, naming the nodes involved.
    pub notes: Vec<String>,
}

/// A graph-to-graph transformation.
pub trait Pass {
    /// The pass's name, as in dumps and reports.
    fn name(&self) -> &'static str;
    /// The rewritten graph, or `None` if nothing changed.
    fn run(&self, graph: &Graph, report: &mut PassReport) -> Result<Option<Graph>, OptError>;
}

/// Passes in a fixed order.
pub struct Pipeline {
    passes: Vec<Box<dyn Pass>>,
}

impl Pipeline {
    /// A pipeline of `passes`, run in this order.
    pub fn new(passes: Vec<Box<dyn Pass>>) -> Pipeline {
        Pipeline { passes }
    }

    /// The passes for strict numerics: only rewrites that keep every result bit for bit.
    pub fn strict() -> Pipeline {
        Pipeline::new(vec![Box::new(ConstantFold::default()), Box::new(DeadCode)])
    }

    /// The passes for fast numerics: constant folding, then affine folding into convolutions
    /// and matmuls (after constant folding has computed `sqrt(var + eps)` and the like), dot
    /// merging, layout assignment (after the folding, so folded biases move with the
    /// convolutions), then dead code.
    pub fn fast() -> Pipeline {
        Pipeline::new(vec![
            Box::new(ConstantFold::default()),
            Box::new(FoldAffine),
            Box::new(MergeDots),
            Box::new(ConvLayout::default()),
            Box::new(DeadCode),
        ])
    }

    /// This pipeline without the pass named `name` (`conv-layout`, for instance).
    pub fn without(mut self, name: &str) -> Pipeline {
        self.passes.retain(|p| p.name() != name);
        self
    }

    /// Runs every pass; returns the final graph and, per pass, its name, the graph after it (if
    /// it changed anything) and its report.
    #[allow(clippy::type_complexity)]
    pub fn run(
        &self,
        graph: &Graph,
    ) -> Result<(Graph, Vec<(&'static str, Option<Graph>, PassReport)>), OptError> {
        let mut current = graph.clone();
        let mut trail = Vec::new();
        for pass in &self.passes {
            let mut report = PassReport::default();
            let changed = pass.run(&current, &mut report)?;
            if let Some(next) = &changed {
                if cfg!(debug_assertions) {
                    next.verify().map_err(|error| OptError::Invalid {
                        pass: pass.name(),
                        error,
                    })?;
                }
                current = next.clone();
            }
            trail.push((pass.name(), changed, report));
        }
        Ok((current, trail))
    }
}

/// Constant folding by the reference interpreter, for results up to `max_elems` elements (larger
/// constants would cost more memory than the work they save) and folds up to `max_work`
/// multiply-adds (compile time).
pub struct ConstantFold {
    pub max_elems: usize,
    /// The most multiply-adds (or elements, for other ops) one fold may cost.
    pub max_work: usize,
}

impl Default for ConstantFold {
    fn default() -> Self {
        ConstantFold {
            max_elems: 1 << 22,
            max_work: 1 << 26,
        }
    }
}

impl Pass for ConstantFold {
    fn name(&self) -> &'static str {
        "constant-fold"
    }

    fn run(&self, graph: &Graph, report: &mut PassReport) -> Result<Option<Graph>, OptError> {
        let mut out = rewrite::Rewriter::new(self.name(), graph);
        let mut changed = false;
        for id in graph.node_ids() {
            match self.fold(graph, &out, id, report) {
                Some(value) => {
                    let constant = out.add(Op::Constant { value }, Vec::new())?;
                    out.replace(id, constant);
                    changed = true;
                }
                None => out.copy(id)?,
            }
        }
        if changed {
            out.finish().map(Some)
        } else {
            Ok(None)
        }
    }
}

impl ConstantFold {
    /// The value of old node `id` if it folds: every operand is a constant in the graph being
    /// built, and the fold stays within the size and work bounds.
    fn fold(
        &self,
        graph: &Graph,
        out: &rewrite::Rewriter,
        id: kfuse_ir::NodeId,
        report: &mut PassReport,
    ) -> Option<Array> {
        let node = graph.node(id);
        let foldable = !matches!(
            node.op,
            Op::Input { .. } | Op::Constant { .. } | Op::Rng { .. } | Op::Custom { .. }
        ) && node.types.len() == 1
            && node.types[0].shape.n_elems() <= self.max_elems
            && !node.operands.is_empty();
        if !foldable {
            return None;
        }
        let mut values: Vec<&Array> = Vec::new();
        for v in &node.operands {
            match out.new_op(*v) {
                Op::Constant { value } => values.push(value),
                _ => return None,
            }
        }
        // Never grow data: a broadcast of a constant is cheaper computed than read.
        let largest = values.iter().map(|v| v.n_elems()).max().unwrap_or(0);
        let out_elems = node.types[0].shape.n_elems();
        if out_elems > largest.max(1) {
            return None;
        }
        // Nor spend long compiling: the interpreter folds at about 10^8 multiply-adds a
        // second, so products of constants larger than this wait for run time.
        let work = match node.op {
            Op::MatMul => out_elems * values[0].shape().dims().last().copied().unwrap_or(1),
            Op::Conv2d(_) => out_elems * (values[1].n_elems() / values[1].shape().dims()[0].max(1)),
            _ => out_elems,
        };
        if work > self.max_work {
            return None;
        }
        let custom = kfuse_interp::CustomOps::new();
        // An op that fails on these constants fails at run time too: it stays.
        let mut results = kfuse_interp::eval_op(&node.op, &node.types, &values, &custom).ok()?;
        report
            .notes
            .push(format!("%{} {} folded to a constant", id.0, node.op.name()));
        Some(results.remove(0))
    }
}

/// Drops nodes that no output depends on, except inputs and ops that can fail at run time.
pub struct DeadCode;

impl Pass for DeadCode {
    fn name(&self) -> &'static str {
        "dead-code"
    }

    fn run(&self, graph: &Graph, report: &mut PassReport) -> Result<Option<Graph>, OptError> {
        // Inputs stay even when unread: they are part of the program's signature. So do ops
        // that can fail at run time (indexing, custom functions): a program that fails on the
        // reference interpreter must fail the same way compiled.
        let mut needed: Vec<bool> = graph
            .nodes()
            .iter()
            .map(|n| {
                matches!(
                    n.op,
                    Op::Input { .. }
                        | Op::Gather { .. }
                        | Op::ScatterAdd { .. }
                        | Op::Custom { .. }
                )
            })
            .collect();
        for o in graph.outputs() {
            needed[o.value.node.index()] = true;
        }
        for i in (0..needed.len()).rev() {
            if needed[i] {
                for v in &graph.nodes()[i].operands {
                    needed[v.node.index()] = true;
                }
            }
        }
        let dropped = needed.iter().filter(|n| !**n).count();
        if dropped == 0 {
            return Ok(None);
        }
        report
            .notes
            .push(format!("{dropped} unused node(s) removed"));
        let mut out = rewrite::Rewriter::new(self.name(), graph);
        for id in graph.node_ids().filter(|id| needed[id.index()]) {
            out.copy(id)?;
        }
        out.finish().map(Some)
    }
}

/// Turns the named inputs into constants holding `values` (weights known at compile time).
pub fn freeze(graph: &Graph, values: &[(String, Array)]) -> Result<Graph, OptError> {
    let mut out = graph.clone();
    for (name, value) in values {
        let Some((id, _, ty)) = graph.inputs().find(|(_, n, _)| n == name) else {
            return Err(OptError::Freeze(format!(
                "the program has no input named `{name}`"
            )));
        };
        if value.ty() != *ty {
            return Err(OptError::Freeze(format!(
                "input `{name}` is {ty}, the value given is {}",
                value.ty()
            )));
        }
        out.nodes_mut()[id.index()].op = Op::Constant {
            value: value.clone(),
        };
    }
    out.verify().map_err(|error| OptError::Invalid {
        pass: "freeze",
        error,
    })?;
    Ok(out)
}
