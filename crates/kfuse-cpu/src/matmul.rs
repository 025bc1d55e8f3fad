//! Matrix products on the `gemm` crate (AVX-512 kernels on x86-64), for fast numerics.
//!
//! `gemm` blocks and uses fused multiply-adds, so its sums are not bit-identical to the reference
//! interpreter's sequential `k` loop: strict numerics keep the reference matmul.

use kfuse_ir::{Array, DType, Shape, Storage, TensorType};

/// Whether [`matmul`] handles this operand dtype.
pub fn supported(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F64)
}

/// `[..., M, K] @ [..., K, N]` with numpy batch broadcasting, for f32 and f64 operands.
pub fn matmul(a: &Array, b: &Array, out: &TensorType, threads: usize) -> Result<Array, String> {
    let (ra, rb) = (a.shape().rank(), b.shape().rank());
    let (m, k) = (a.shape().dims()[ra - 2], a.shape().dims()[ra - 1]);
    let n = b.shape().dims()[rb - 1];
    let rank = out.shape.rank();
    let batch = Shape::new(out.shape.dims()[..rank - 2].to_vec());
    // Batch offsets of each operand, in matrices, for every output batch index.
    let batch_offsets = |shape: &Shape, r: usize| -> Vec<usize> {
        let own = Shape::new(shape.dims()[..r - 2].to_vec());
        let strides = own.strides();
        let skip = batch.rank() - own.rank();
        (0..batch.n_elems())
            .map(|flat| {
                let mut rest = flat;
                let mut offset = 0;
                for axis in (0..batch.rank()).rev() {
                    let coord = rest % batch.dims()[axis];
                    rest /= batch.dims()[axis];
                    if axis >= skip && own.dims()[axis - skip] != 1 {
                        offset += coord * strides[axis - skip];
                    }
                }
                offset
            })
            .collect()
    };
    let (oa, ob) = (batch_offsets(a.shape(), ra), batch_offsets(b.shape(), rb));
    let parallelism = if threads > 1 && m * n * k >= 1 << 18 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    macro_rules! run {
        ($t:ty, $x:expr, $y:expr, $wrap:ident) => {{
            let mut c = vec![0 as $t; out.shape.n_elems()];
            for (bi, (&ia, &ib)) in oa.iter().zip(&ob).enumerate() {
                let lhs = $x[ia * m * k..].as_ptr();
                let rhs = $y[ib * k * n..].as_ptr();
                let dst = c[bi * m * n..].as_mut_ptr();
                // SAFETY: the slices hold at least an M x K, K x N and M x N row-major matrix at
                // these offsets (shapes checked by inference), and do not overlap.
                unsafe {
                    gemm::gemm(
                        m,
                        n,
                        k,
                        dst,
                        1,
                        n as isize,
                        false,
                        lhs,
                        1,
                        k as isize,
                        rhs,
                        1,
                        n as isize,
                        0 as $t,
                        1 as $t,
                        false,
                        false,
                        false,
                        parallelism,
                    );
                }
            }
            Storage::$wrap(c)
        }};
    }
    let storage = match (a.storage(), b.storage()) {
        (Storage::F32(x), Storage::F32(y)) => run!(f32, x, y, F32),
        (Storage::F64(x), Storage::F64(y)) => run!(f64, x, y, F64),
        _ => {
            return Err(format!(
                "gemm matmul supports f32 and f64, not {}",
                a.dtype()
            ))
        }
    };
    Array::new(out.shape.clone(), storage).map_err(|e| e.to_string())
}
