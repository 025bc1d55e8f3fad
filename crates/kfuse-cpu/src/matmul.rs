//! Matrix products on the `gemm` crate (AVX-512 kernels on x86-64), for fast numerics.
//!
//! `gemm` blocks and uses fused multiply-adds, so its sums are not bit-identical to the reference
//! interpreter's sequential `k` loop: strict numerics keep the reference matmul.

use kfuse_ir::{DType, Shape, Storage};

use crate::conv::{gemm_into, Out, Real, View};
use crate::Pool;

/// Whether [`matmul`] handles this operand dtype.
pub fn supported(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F64)
}

/// `[..., M, K] @ [..., K, N]` with numpy batch broadcasting, for f32 and f64 operands, written
/// into `out` (the output's dtype and element count; its contents are overwritten). Operands
/// are read where they live, without copies.
pub fn matmul(
    a: View,
    b: View,
    out_dims: &[usize],
    out: &mut Storage,
    threads: usize,
) -> Result<(), String> {
    let (ra, rb) = (a.dims.len(), b.dims.len());
    let (m, k) = (a.dims[ra - 2], a.dims[ra - 1]);
    let n = b.dims[rb - 1];
    let rank = out_dims.len();
    let batch = Shape::new(out_dims[..rank - 2].to_vec());
    let out_elems: usize = out_dims.iter().product();
    if out.len() != out_elems {
        return Err(format!(
            "the output holds {} elements, not {out_elems}",
            out.len()
        ));
    }
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
    let (oa, ob) = (
        batch_offsets(&Shape::new(a.dims.to_vec()), ra),
        batch_offsets(&Shape::new(b.dims.to_vec()), rb),
    );
    // Tasks on the kernel pool: every batch matrix, its rows split across the threads when
    // the product is large enough to pay for a split. Each task runs a single-threaded GEMM.
    let chunks = if threads > 1 && m * n * k >= 1 << 22 {
        threads.min(m.div_ceil(16)).max(1)
    } else {
        1
    };
    let rows = m.div_ceil(chunks);
    fn run<T: Real>(
        x: &[T],
        y: &[T],
        c: &mut [T],
        (m, k, n, rows, chunks): (usize, usize, usize, usize, usize),
        oa: &[usize],
        ob: &[usize],
    ) {
        let dst = Out(c.as_mut_ptr());
        Pool::global().run(oa.len() * chunks, &|task| {
            let (bi, chunk) = (task / chunks, task % chunks);
            let (r0, r1) = (chunk * rows, ((chunk + 1) * rows).min(m));
            if r0 >= r1 {
                return;
            }
            let lhs = x[oa[bi] * m * k + r0 * k..].as_ptr();
            let rhs = y[ob[bi] * k * n..].as_ptr();
            // SAFETY: the operands hold an M x K and a K x N row-major matrix at these offsets
            // (shapes checked by inference); rows r0..r1 of output matrix bi are this task's.
            unsafe {
                let at = dst.ptr().add(bi * m * n + r0 * n);
                gemm_into(r1 - r0, n, k, at, n, 1, lhs, k, 1, rhs, n, 1);
            }
        });
    }
    if m * n == 0 {
        return Ok(());
    }
    if k == 0 {
        // An empty sum: gemm is not asked to define it.
        match out {
            Storage::F32(c) => c.fill(0.0),
            Storage::F64(c) => c.fill(0.0),
            _ => {}
        }
    }
    let shape = (m, k, n, rows, chunks);
    match (a.storage, b.storage, out) {
        _ if k == 0 => {}
        (Storage::F32(x), Storage::F32(y), Storage::F32(c)) => run(x, y, c, shape, &oa, &ob),
        (Storage::F64(x), Storage::F64(y), Storage::F64(c)) => run(x, y, c, shape, &oa, &ob),
        _ => {
            return Err(format!(
                "gemm matmul supports f32 and f64, not {}",
                a.storage.dtype()
            ))
        }
    }
    Ok(())
}
