//! Static shapes and numpy broadcasting.

use std::fmt;

use crate::DType;

/// The largest rank kfuse accepts.
pub const MAX_RANK: usize = 8;

/// A static shape: the extent of each axis, outermost first. Rank 0 is a scalar.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Shape(pub Vec<usize>);

impl Shape {
    /// A shape from its dims.
    pub fn new(dims: impl Into<Vec<usize>>) -> Shape {
        Shape(dims.into())
    }

    /// The rank-0 shape.
    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }

    /// The number of axes.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// The dims, outermost first.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// The number of elements (1 for a scalar, 0 if any dim is 0). A count that overflows
    /// `usize` saturates at `usize::MAX`; inference refuses such shapes in a graph, and
    /// [`Shape::checked_n_elems`] tells them apart.
    pub fn n_elems(&self) -> usize {
        self.checked_n_elems().unwrap_or(usize::MAX)
    }

    /// The number of elements, or `None` if it overflows `usize`. A shape with an empty dim
    /// has no elements, whatever the product of the dims before it.
    pub fn checked_n_elems(&self) -> Option<usize> {
        if self.0.contains(&0) {
            return Some(0);
        }
        self.0.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }

    /// Row-major (C order) strides in elements.
    ///
    /// A shape with no elements may have dims whose product overflows (`[0, 2^62, 4]`); its
    /// strides saturate instead of wrapping, and are never used to address an element.
    pub fn strides(&self) -> Vec<usize> {
        let mut strides = vec![0; self.rank()];
        let mut acc = 1usize;
        for (axis, &dim) in self.0.iter().enumerate().rev() {
            strides[axis] = acc;
            acc = acc.saturating_mul(dim);
        }
        strides
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// The numpy broadcast of two shapes: dims are aligned at the right, and each pair must be equal
/// or contain a 1. Returns `None` when the shapes do not broadcast.
pub fn broadcast_shapes(a: &Shape, b: &Shape) -> Option<Shape> {
    let rank = a.rank().max(b.rank());
    let mut dims = vec![0; rank];
    for (i, dim) in dims.iter_mut().enumerate() {
        let da = dim_from_right(a, rank - 1 - i);
        let db = dim_from_right(b, rank - 1 - i);
        *dim = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(Shape(dims))
}

/// Whether `from` broadcasts to exactly `to` (numpy rules, `to` fixed).
pub fn broadcasts_to(from: &Shape, to: &Shape) -> bool {
    from.rank() <= to.rank()
        && (0..from.rank()).all(|i| {
            let f = dim_from_right(from, i);
            f == 1 || f == dim_from_right(to, i)
        })
}

fn dim_from_right(shape: &Shape, i: usize) -> usize {
    if i < shape.rank() {
        shape.0[shape.rank() - 1 - i]
    } else {
        1
    }
}

/// The type of a value: dtype and static shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
}

impl TensorType {
    pub fn new(dtype: DType, shape: impl Into<Vec<usize>>) -> TensorType {
        TensorType {
            dtype,
            shape: Shape::new(shape),
        }
    }

    /// Bytes of a dense row-major buffer holding this type, saturating at `usize::MAX` (which
    /// no type in a graph reaches: inference refuses it).
    pub fn size_bytes(&self) -> usize {
        self.checked_size_bytes().unwrap_or(usize::MAX)
    }

    /// Bytes of a dense row-major buffer holding this type, or `None` if they overflow `usize`.
    pub fn checked_size_bytes(&self) -> Option<usize> {
        self.shape
            .checked_n_elems()?
            .checked_mul(self.dtype.size_bytes())
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        let s = |d: &[usize]| Shape::new(d.to_vec());
        assert_eq!(broadcast_shapes(&s(&[4, 1]), &s(&[3])), Some(s(&[4, 3])));
        assert_eq!(broadcast_shapes(&s(&[]), &s(&[2, 0])), Some(s(&[2, 0])));
        assert_eq!(broadcast_shapes(&s(&[1, 0]), &s(&[5, 1])), Some(s(&[5, 0])));
        assert_eq!(broadcast_shapes(&s(&[2]), &s(&[3])), None);
        assert!(broadcasts_to(&s(&[3]), &s(&[2, 3])));
        assert!(!broadcasts_to(&s(&[2, 3]), &s(&[3])));
        assert_eq!(s(&[2, 3, 4]).strides(), vec![12, 4, 1]);
    }

    #[test]
    fn sizes_that_overflow_saturate_instead_of_wrapping() {
        let huge = Shape::new(vec![0, 1 << 62, 8]);
        assert_eq!(huge.n_elems(), 0);
        assert_eq!(huge.strides(), vec![usize::MAX, 8, 1]);
        assert_eq!(Shape::new(vec![8, 1 << 62, 0]).checked_n_elems(), Some(0));
        let too_many = Shape::new(vec![1 << 40, 1 << 40]);
        assert_eq!(too_many.checked_n_elems(), None);
        assert_eq!(too_many.n_elems(), usize::MAX);
        let ty = TensorType::new(DType::F32, [1usize << 62]);
        assert_eq!(ty.checked_size_bytes(), None);
        assert_eq!(ty.size_bytes(), usize::MAX);
    }
}
