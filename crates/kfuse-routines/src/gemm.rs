//! The single-threaded GEMM call each task of a matmul or convolution makes: f32 on AVX-512 on
//! kfuse's own GEMM ([`avx512`]), everything else on the `gemm` crate.

pub(crate) mod avx512;

use self::avx512::{Finish, Strided};
use crate::dense::Real;
use crate::epilogue::Activation;

/// What a GEMM's destination starts from. Matmul folds its bias in this way; convolutions add
/// theirs with the ReLU in one pass over each band right after its GEMM, which measured faster
/// than pre-filling, since the GEMM reads a pre-filled band back (`docs/structured-ops.md`,
/// "Routines": `conv::conv2d`).
#[derive(Clone, Copy)]
pub(crate) enum Init<'a, T> {
    /// Nothing: the destination is overwritten.
    Zero,
    /// `bias[j]` in every element of column `j`.
    ColumnBias(&'a [T]),
    /// The destination's current values: the product is added to them.
    Accumulate,
}

/// `dst[m×n] = init + lhs[m×k] @ rhs[k×n]` with arbitrary strides, single-threaded: f32 on
/// AVX-512 on kfuse's own GEMM ([`avx512`], which leads the `gemm` crate on one thread:
/// `docs/benchmarks.md`, "W5a and W5b: dense layers"), everything else on the `gemm` crate.
///
/// # Safety
/// The pointers must address matrices of these shapes and strides, `dst` not overlapping the
/// others, and no other thread may touch `dst`'s elements during the call.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_into<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut T,
    dst_rs: usize,
    dst_cs: usize,
    lhs: *const T,
    lhs_rs: usize,
    lhs_cs: usize,
    rhs: *const T,
    rhs_rs: usize,
    rhs_cs: usize,
    init: Init<T>,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        // The bias is folded into the GEMM: the destination is filled with it and the product is
        // accumulated onto it.
        let read_dst = match init {
            Init::Zero => false,
            Init::Accumulate => true,
            Init::ColumnBias(bias) => {
                for i in 0..m {
                    for (j, &b) in bias.iter().enumerate().take(n) {
                        *dst.add(i * dst_rs + j * dst_cs) = b;
                    }
                }
                true
            }
        };
        if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
            let strided = |ptr: *const T, rs: usize, cs: usize| Strided {
                ptr: ptr.cast::<f32>(),
                rs,
                cs,
            };
            let (a, b) = (strided(lhs, lhs_rs, lhs_cs), strided(rhs, rhs_rs, rhs_cs));
            let c = dst.cast::<f32>();
            if dst_cs == 1 && avx512::applies(m, n, k) {
                return avx512::sgemm([m, n, k], a, b, (c, dst_rs), read_dst, &Finish::default());
            }
            // `sgemm` stores along rows: a column-major destination takes the product of the
            // transposes.
            if dst_rs == 1 && avx512::applies(n, m, k) {
                let (at, bt) = (strided(rhs, rhs_cs, rhs_rs), strided(lhs, lhs_cs, lhs_rs));
                return avx512::sgemm([n, m, k], at, bt, (c, dst_cs), read_dst, &Finish::default());
            }
        }
        gemm::gemm(
            m,
            n,
            k,
            dst,
            dst_cs as isize,
            dst_rs as isize,
            read_dst,
            lhs,
            lhs_cs as isize,
            lhs_rs as isize,
            rhs,
            rhs_cs as isize,
            rhs_rs as isize,
            T::ONE,
            T::ONE,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// `dst[m×n] = lhs[m×k] @ rhs[k×n]` then its epilogue (a bias per column, a residual laid out
/// as `dst`, then ReLU or no activation), each tile finished in registers as its last block of
/// steps is stored ([`avx512::Finish`]), with no pass over `dst` after it: f32 on kfuse's own
/// GEMM only. Returns whether it ran; where it did not (another dtype, a CPU without AVX-512,
/// a product too narrow, an activation without a form in registers), nothing was written.
///
/// # Safety
/// As for [`gemm_into`], with `dst`'s rows `ldc` apart and its columns contiguous; `bias`
/// holds `n` values and `residual` an `m × n` matrix with `dst`'s row stride.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_finished<T: Real>(
    [m, n, k]: [usize; 3],
    (dst, ldc): (*mut T, usize),
    (lhs, lhs_rs, lhs_cs): (*const T, usize, usize),
    (rhs, rhs_rs, rhs_cs): (*const T, usize, usize),
    bias: Option<&[T]>,
    residual: Option<*const T>,
    activation: Option<Activation>,
) -> bool {
    let f32 = std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>();
    if !f32 || !avx512::applies(m, n, k) || !matches!(activation, None | Some(Activation::Relu)) {
        return false;
    }
    let strided = |ptr: *const T, rs: usize, cs: usize| Strided {
        ptr: ptr.cast::<f32>(),
        rs,
        cs,
    };
    let finish = Finish {
        row_bias: None,
        col_bias: bias.map(|b| b.as_ptr().cast::<f32>()),
        residual: residual.map(|r| r.cast::<f32>()),
        activation,
        stream: false,
    };
    // SAFETY: forwarded from the caller; `T` is f32.
    unsafe {
        avx512::sgemm(
            [m, n, k],
            strided(lhs, lhs_rs, lhs_cs),
            strided(rhs, rhs_rs, rhs_cs),
            (dst.cast::<f32>(), ldc),
            false,
            &finish,
        )
    };
    true
}
