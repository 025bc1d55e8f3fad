//! Building blocks composed from primitive ops: stacking and splitting, one-hot encoding,
//! triangles, cumulative sums and IEEE class tests. Each is written with the ops the fusion
//! compiler already fuses, so none needs a kernel of its own.

use std::panic::Location;

use kfuse_ir::{DType, Op, PadMode, Shape};

use crate::tensor::norm_axis;
use crate::{where_, Context, Tensor};

/// The first of `parts` that failed to build, to pass its error along.
fn first_failure(parts: &[&Tensor]) -> Option<Tensor> {
    parts.iter().find(|t| !t.is_ok()).map(|t| (*t).clone())
}

/// Joins tensors of one shape along a new axis `axis` (numpy `stack`); `axis` counts axes of
/// the result, so it may equal the parts' rank.
///
/// ```
/// let cx = kfuse::Context::new();
/// let a = cx.tensor(&[1, 2], &[2]);
/// let b = cx.tensor(&[3, 4], &[2]);
/// assert_eq!(kfuse::stack(&[&a, &b], 1).to_vec::<i32>().unwrap(), vec![1, 3, 2, 4]);
/// ```
#[track_caller]
pub fn stack(parts: &[&Tensor], axis: isize) -> Tensor {
    let loc = Location::caller();
    let Some(first) = parts.first() else {
        return Context::new().error(loc, "stack: no tensors given");
    };
    if let Some(failed) = first_failure(parts) {
        return failed;
    }
    let dims = first.dims();
    let a = match norm_axis(axis, dims.len() + 1) {
        Ok(a) => a,
        Err(m) => return first.cx.error(loc, format!("stack: {m}")),
    };
    let mut grown = dims.clone();
    grown.insert(a, 1);
    let mut unsqueezed = Vec::with_capacity(parts.len());
    for (k, part) in parts.iter().enumerate() {
        if part.dims() != dims {
            return first.cx.error(
                loc,
                format!(
                    "stack: tensor {k} has shape {:?}, tensor 0 {dims:?}",
                    part.dims()
                ),
            );
        }
        let shape = Shape::new(grown.clone());
        unsqueezed.push(part.op(loc, Op::Reshape { shape }, &[]));
    }
    let refs: Vec<&Tensor> = unsqueezed.iter().collect();
    first.cx.node1(loc, Op::Concat { axis: a }, &refs)
}

impl Tensor {
    /// Splits along `axis` into consecutive pieces of the given `sizes` (PyTorch `split` with a
    /// list), which must add up to the axis's length. On a bad call every piece carries the
    /// error (one piece where `sizes` is empty).
    ///
    /// ```
    /// let cx = kfuse::Context::new();
    /// let parts = cx.arange(5, kfuse::DType::I64).split(&[2, 0, 3], 0);
    /// assert_eq!(parts[0].to_vec::<i64>().unwrap(), vec![0, 1]);
    /// assert_eq!(parts[1].shape().unwrap(), vec![0]);
    /// assert_eq!(parts[2].to_vec::<i64>().unwrap(), vec![2, 3, 4]);
    /// ```
    #[track_caller]
    pub fn split(&self, sizes: &[usize], axis: isize) -> Vec<Tensor> {
        let loc = Location::caller();
        let failed = |error: Tensor| vec![error; sizes.len().max(1)];
        if let Some(error) = self.axis_error(loc, "split", axis) {
            return failed(error);
        }
        let dims = self.dims();
        let Ok(a) = norm_axis(axis, dims.len()) else {
            return failed(self.clone());
        };
        let total = sizes.iter().try_fold(0usize, |sum, &s| sum.checked_add(s));
        if total != Some(dims[a]) {
            return failed(self.cx.error(
                loc,
                format!(
                    "split: sizes {sizes:?} do not add up to axis {a}'s length {}",
                    dims[a]
                ),
            ));
        }
        let mut pieces = Vec::with_capacity(sizes.len());
        let mut start = 0;
        for &size in sizes {
            let mut starts = vec![0; dims.len()];
            let mut stops = dims.clone();
            starts[a] = start;
            stops[a] = start + size;
            let slice = Op::Slice {
                start: starts,
                stop: stops,
                step: vec![1; dims.len()],
            };
            pieces.push(self.op(loc, slice, &[]));
            start += size;
        }
        pieces
    }

    /// One-hot encoding of integer indices: shape `[..., num_classes]`, 1 where the last
    /// coordinate equals the index and 0 elsewhere, in `dtype`. As in `jax.nn.one_hot`, an
    /// index outside `0..num_classes` (a negative one included) gives a row of zeros, so a
    /// padding label such as -1 needs no masking.
    ///
    /// ```
    /// let cx = kfuse::Context::new();
    /// let labels = cx.tensor(&[2i64, 0, -1], &[3]);
    /// let hot = labels.one_hot(3, kfuse::DType::F32);
    /// assert_eq!(hot.to_vec::<f32>().unwrap(), vec![0., 0., 1., 1., 0., 0., 0., 0., 0.]);
    /// ```
    #[track_caller]
    pub fn one_hot(&self, num_classes: usize, dtype: DType) -> Tensor {
        let loc = Location::caller();
        if !self.is_ok() {
            return self.clone();
        }
        let index_dtype = self.dtype_or_f32();
        if !index_dtype.is_int() {
            return self.cx.error(
                loc,
                format!("one_hot: the indices must be integers, found {index_dtype}"),
            );
        }
        // Classes are compared in i64 so that no index wraps (a u8 iota stops at 255).
        let classes = self.cx.iota(DType::I64, &[num_classes], 0);
        let hot = self.cast(DType::I64).unsqueeze(-1).eq(&classes);
        if dtype == DType::Bool {
            hot
        } else {
            hot.cast(dtype)
        }
    }

    /// The lower triangle of the last two axes (numpy `tril`): elements with
    /// `column - row <= k` are kept, the others become 0. `k = 0` keeps the diagonal, `k = -1`
    /// drops it.
    ///
    /// ```
    /// let cx = kfuse::Context::new();
    /// let x = cx.ones(kfuse::DType::I32, &[2, 3]);
    /// assert_eq!(x.tril(0).to_vec::<i32>().unwrap(), vec![1, 0, 0, 1, 1, 0]);
    /// ```
    #[track_caller]
    pub fn tril(&self, k: isize) -> Tensor {
        self.triangle(Location::caller(), "tril", k)
    }

    /// The upper triangle of the last two axes (numpy `triu`): elements with
    /// `column - row >= k` are kept, the others become 0.
    ///
    /// ```
    /// let cx = kfuse::Context::new();
    /// let x = cx.ones(kfuse::DType::I32, &[2, 3]);
    /// assert_eq!(x.triu(1).to_vec::<i32>().unwrap(), vec![0, 1, 1, 0, 0, 1]);
    /// ```
    #[track_caller]
    pub fn triu(&self, k: isize) -> Tensor {
        self.triangle(Location::caller(), "triu", k)
    }

    /// `tril` (`name == "tril"`) or `triu`. The mask is a select, not a product with a 0/1
    /// matrix, so that NaN and infinities outside the triangle become 0 as numpy's do.
    #[track_caller]
    fn triangle(&self, loc: &Location, name: &str, k: isize) -> Tensor {
        if !self.is_ok() {
            return self.clone();
        }
        let dims = self.dims();
        if dims.len() < 2 {
            return self.cx.error(
                loc,
                format!("{name}: expects at least 2 axes, found rank {}", dims.len()),
            );
        }
        let square = [dims[dims.len() - 2], dims[dims.len() - 1]];
        let rows = self.cx.iota(DType::I64, &square, 0);
        let columns = self.cx.iota(DType::I64, &square, 1);
        let offset = columns - rows;
        let keep = if name == "tril" {
            offset.le(k as i64)
        } else {
            offset.ge(k as i64)
        };
        where_(&keep, self, 0)
    }

    /// Cumulative sum along `axis` (numpy `cumsum`): element `i` is the sum of elements `0..=i`.
    ///
    /// It is computed as a scan of `ceil(log2 n)` steps, each adding the running sums shifted
    /// by a power of two (Hillis and Steele): `n log n` additions, all of them elementwise ops
    /// that fuse. A product with a triangular matrix of ones would be shorter to write but
    /// multiplies every later element by 0, so one infinity would turn every earlier sum into
    /// NaN; the scan adds only elements that belong to each sum. The shifted-in identity is -0,
    /// which leaves every value (-0 included) unchanged. Integer sums are exact; float sums
    /// are added in a tree order rather than left to right, so they round like a pairwise sum.
    ///
    /// ```
    /// let cx = kfuse::Context::new();
    /// let x = cx.tensor(&[1, 2, 3, 4, 5], &[5]);
    /// assert_eq!(x.cumsum(0).to_vec::<i32>().unwrap(), vec![1, 3, 6, 10, 15]);
    /// ```
    #[track_caller]
    pub fn cumsum(&self, axis: isize) -> Tensor {
        let loc = Location::caller();
        if let Some(error) = self.axis_error(loc, "cumsum", axis) {
            return error;
        }
        let dtype = self.dtype_or_f32();
        if !dtype.is_numeric() {
            return self.cx.error(
                loc,
                format!("cumsum: expects a numeric dtype, found {dtype}"),
            );
        }
        let dims = self.dims();
        let Ok(a) = norm_axis(axis, dims.len()) else {
            return self.clone();
        };
        let n = dims[a];
        let mut sums = self.clone();
        let mut shift = 1;
        while shift < n {
            let mut widths = vec![(0, 0); dims.len()];
            widths[a] = (shift, 0);
            let shifted =
                sums.narrow(a as isize, 0, n - shift)
                    .pad(&widths, PadMode::Constant, -0.0);
            sums = &sums + &shifted;
            shift *= 2;
        }
        sums
    }

    /// Whether each element is NaN (bool). Always false for integer and bool tensors.
    ///
    /// ```
    /// let cx = kfuse::Context::new();
    /// let x = cx.tensor(&[1.0f32, f32::NAN, f32::INFINITY], &[3]);
    /// assert_eq!(x.isnan().to_vec::<bool>().unwrap(), vec![false, true, false]);
    /// ```
    #[track_caller]
    pub fn isnan(&self) -> Tensor {
        // NaN is the one value unequal to itself; the fast numerics keep that (they allow
        // reassociation and contraction, not the assumption that values are finite).
        self.ne(self)
    }

    /// Whether each element is +inf or -inf (bool). Always false for integer and bool tensors.
    ///
    /// ```
    /// let cx = kfuse::Context::new();
    /// let x = cx.tensor(&[1.0f32, f32::NAN, f32::NEG_INFINITY], &[3]);
    /// assert_eq!(x.isinf().to_vec::<bool>().unwrap(), vec![false, false, true]);
    /// ```
    #[track_caller]
    pub fn isinf(&self) -> Tensor {
        if self.dtype_or_f32().is_float() {
            self.abs().eq(f64::INFINITY)
        } else {
            // A value is never unequal to itself here: an all-false mask of the right shape.
            self.ne(self)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cat;

    /// `stack` is `cat` of the parts with the new axis inserted, for every axis.
    #[test]
    fn stack_matches_cat_of_unsqueezed_parts() {
        let cx = Context::new();
        let a = cx.arange(6, DType::I64).reshape(&[2, 3]);
        let b = &a * 10;
        for axis in [0isize, 1, 2, -1, -3] {
            let stacked = stack(&[&a, &b], axis);
            let joined = cat(&[&a.unsqueeze(axis), &b.unsqueeze(axis)], axis);
            assert_eq!(stacked.shape().unwrap(), joined.shape().unwrap(), "{axis}");
            assert_eq!(
                stacked.to_vec::<i64>().unwrap(),
                joined.to_vec::<i64>().unwrap(),
                "{axis}"
            );
        }
    }
}
