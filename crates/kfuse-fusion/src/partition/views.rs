//! The indices a kernel evaluates its inline nodes at.
//!
//! Lowering evaluates an inline node once per distinct index expression it is read at, and
//! interns index arithmetic, so that two paths that build the same expression share one
//! evaluation: `exp(x) * exp(x)` evaluates `exp` once per element, `y + flip(y)` evaluates `y`
//! twice, and ten steps of a stencil written with shifted slices evaluate the first step at
//! thousands of indices. A *view* names such an index the way lowering builds it: elementwise
//! ops keep their consumer's index, broadcasts zero and drop coordinates, and movement ops
//! transform them (a slice scales and shifts, a pad shifts and clamps, a flip mirrors, a concat
//! offsets and clamps, a reshape unflattens). Equal views get equal ids.

use std::collections::HashMap;

use kfuse_ir::{Graph, NodeId, Op, PadMode, Shape};

/// An interned view: one coordinate term per axis of the viewed value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct ViewId(u32);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct TermId(u32);

/// One coordinate of a view, as an expression of the kernel's loop indices.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Term {
    /// Always 0: an axis of size 1.
    Zero,
    /// The output's own coordinate along an axis.
    Axis(usize),
    /// `of * step + start` (a slice).
    Affine {
        of: TermId,
        step: usize,
        start: usize,
    },
    /// `of - low`, clamped or reflected into `0..dim` (a pad).
    Padded {
        of: TermId,
        low: usize,
        dim: usize,
        mode: PadMode,
    },
    /// `dim - 1 - of` (a flip).
    Flipped { of: TermId, dim: usize },
    /// `of - offset`, clamped into `0..dim` (one part of a concat).
    Part {
        of: TermId,
        offset: usize,
        dim: usize,
    },
    /// Coordinate `axis` of the flat offset of view `of` over `dims` (a reshape).
    Unflattened {
        of: ViewId,
        dims: Vec<usize>,
        axis: usize,
    },
}

/// The interning tables of terms and views.
#[derive(Default)]
pub(super) struct Views {
    terms: HashMap<Term, TermId>,
    views: HashMap<Vec<TermId>, ViewId>,
    coords: Vec<Vec<TermId>>,
}

impl Views {
    fn term(&mut self, term: Term) -> TermId {
        let next = TermId(self.terms.len() as u32);
        *self.terms.entry(term).or_insert(next)
    }

    fn view(&mut self, coords: Vec<TermId>) -> ViewId {
        if let Some(&id) = self.views.get(&coords) {
            return id;
        }
        let id = ViewId(self.coords.len() as u32);
        self.coords.push(coords.clone());
        self.views.insert(coords, id);
        id
    }

    /// The view of a value of `shape` at its own index: a kernel's output, or the operand of a
    /// reduction, which lowering evaluates at the kernel's domain index.
    pub fn identity(&mut self, shape: &Shape) -> ViewId {
        let coords = shape
            .dims()
            .iter()
            .enumerate()
            .map(|(k, &d)| self.term(if d == 1 { Term::Zero } else { Term::Axis(k) }))
            .collect();
        self.view(coords)
    }

    /// The view operand `i` of node `id` is read at when `id` is evaluated at `view`.
    pub fn operand(&mut self, graph: &Graph, id: NodeId, i: usize, view: ViewId) -> ViewId {
        let node = graph.node(id);
        let out = &node.types[0].shape;
        let shape = &graph.ty(node.operands[i]).shape;
        let coords = self.coords[view.0 as usize].clone();
        let zero = self.term(Term::Zero);
        let mapped: Vec<TermId> = match &node.op {
            Op::Reduce { axes, .. } if !axes.is_empty() => return self.identity(shape),
            Op::Unary(_) | Op::Cast { .. } | Op::Reduce { .. } => return view,
            Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Clamp | Op::Broadcast { .. } => {
                if shape == out {
                    return view;
                }
                let skip = out.rank() - shape.rank();
                shape
                    .dims()
                    .iter()
                    .enumerate()
                    .map(|(a, &d)| if d == 1 { zero } else { coords[a + skip] })
                    .collect()
            }
            Op::Permute { perm } => {
                let mut c = vec![zero; perm.len()];
                for (k, &p) in perm.iter().enumerate() {
                    c[p] = coords[k];
                }
                c
            }
            Op::Slice { start, step, .. } => (0..coords.len())
                .map(|k| {
                    if start[k] == 0 && step[k] == 1 {
                        coords[k]
                    } else {
                        self.term(Term::Affine {
                            of: coords[k],
                            step: step[k],
                            start: start[k],
                        })
                    }
                })
                .collect(),
            Op::Pad { low, mode, .. } => (0..coords.len())
                .map(|k| {
                    let dim = shape.dims()[k];
                    if dim == out.dims()[k] {
                        coords[k]
                    } else {
                        self.term(Term::Padded {
                            of: coords[k],
                            low: low[k],
                            dim,
                            mode: *mode,
                        })
                    }
                })
                .collect(),
            Op::Flip { axes } => (0..coords.len())
                .map(|k| {
                    let dim = shape.dims()[k];
                    if !axes.contains(&k) {
                        coords[k]
                    } else if dim == 1 {
                        zero
                    } else {
                        self.term(Term::Flipped { of: coords[k], dim })
                    }
                })
                .collect(),
            Op::Concat { axis } => {
                let offset: usize = node.operands[..i]
                    .iter()
                    .map(|v| graph.ty(*v).shape.dims()[*axis])
                    .sum();
                let mut c = coords;
                c[*axis] = self.term(Term::Part {
                    of: c[*axis],
                    offset,
                    dim: shape.dims()[*axis],
                });
                c
            }
            Op::Reshape { .. } => (0..shape.rank())
                .map(|axis| {
                    if shape.dims()[axis] == 1 {
                        zero
                    } else {
                        self.term(Term::Unflattened {
                            of: view,
                            dims: shape.dims().to_vec(),
                            axis,
                        })
                    }
                })
                .collect(),
            other => unreachable!("{} is not computed inside a fused kernel", other.name()),
        };
        self.view(mapped)
    }
}
