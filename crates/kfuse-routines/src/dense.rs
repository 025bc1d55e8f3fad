//! What the dense routines (matmul, convolution, pooling) share: operands borrowed where they
//! live, the epilogue description, the float types they are written for, a raw output pointer
//! for tasks writing disjoint parts, and the single-threaded GEMM call each task makes.

use kfuse_ir::Storage;

use crate::sgemm::{self, Finish, Strided};
pub use kfuse_ir::Activation;

/// A tensor operand: its data and dims, borrowed where it lives (no copy).
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    pub storage: &'a Storage,
    pub dims: &'a [usize],
}

/// Work applied to each output tile after its GEMM: per-channel bias, residual, activation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Epilogue<'a> {
    /// One value per output channel, added.
    pub bias: Option<&'a Storage>,
    /// Then one value per output column, or one value, multiplied (matmuls only).
    pub scale: Option<&'a Storage>,
    /// Then a residual of the output's shape and dtype, added.
    pub residual: Option<&'a Storage>,
    /// Then this activation, computed as the IR's op computes it (`kfuse-math`'s definitions),
    /// bit for bit but for the forms that fast numerics bounds instead: GELU's tanh form within
    /// 2 ULPs, its erf form (one input one ULP off) and SiLU (within 3 ULPs); see `simd.rs`.
    pub activation: Option<Activation>,
}

/// An f16 or bf16 operand widened to f32 (exactly), as the IR widens half-precision operands.
pub(crate) fn widen_half(s: &Storage) -> Result<Storage, String> {
    widen_half_into(s, Vec::new())
}

/// [`widen_half`] into `buf`, resized to the operand's length (a buffer kept between calls
/// does not page-fault again).
pub(crate) fn widen_half_into(s: &Storage, mut buf: Vec<f32>) -> Result<Storage, String> {
    buf.resize(s.len(), 0.0);
    match s {
        Storage::F16(v) => in_chunks(v, &mut buf, crate::simd::f32_from_f16_slice),
        Storage::BF16(v) => in_chunks(v, &mut buf, crate::simd::f32_from_bf16_slice),
        other => {
            return Err(format!(
                "a half-precision product's operands are f16 or bf16, not {}",
                other.dtype()
            ))
        }
    }
    Ok(Storage::F32(buf))
}

/// Elements per task of [`in_chunks`] (256 KiB of f32).
const CHUNK: usize = 1 << 16;

/// `widen` of `src` into `wide` (as long), in chunks over the pool's threads.
fn in_chunks<S: Sync>(src: &[S], wide: &mut [f32], widen: fn(&[S], &mut [f32])) {
    assert_eq!(src.len(), wide.len(), "one value for each");
    let out = Out(wide.as_mut_ptr());
    crate::Pool::global().run(src.len().div_ceil(CHUNK), &|task| {
        let range = task * CHUNK..((task + 1) * CHUNK).min(src.len());
        // SAFETY: the chunk's range of `wide`, this task's alone; `run` returns after all.
        let dst =
            unsafe { std::slice::from_raw_parts_mut(out.ptr().add(range.start), range.len()) };
        widen(&src[range], dst);
    });
}

/// The epilogue's operands (bias, scale, residual) widened by [`widen_half`].
pub(crate) struct Widened {
    bias: Option<Storage>,
    scale: Option<Storage>,
    residual: Option<Storage>,
    activation: Option<Activation>,
}

impl Widened {
    pub(crate) fn of(epilogue: &Epilogue) -> Result<Widened, String> {
        let widen = |s: Option<&Storage>| s.map(widen_half).transpose();
        Ok(Widened {
            bias: widen(epilogue.bias)?,
            scale: widen(epilogue.scale)?,
            residual: widen(epilogue.residual)?,
            activation: epilogue.activation,
        })
    }

    pub(crate) fn epilogue(&self) -> Epilogue<'_> {
        Epilogue {
            bias: self.bias.as_ref(),
            scale: self.scale.as_ref(),
            residual: self.residual.as_ref(),
            activation: self.activation,
        }
    }
}

pub(crate) trait Real: Copy + Send + Sync + 'static + PartialOrd {
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;
    const NAN: Self;
    fn is_nan(self) -> bool;
    fn is_negative_zero(self) -> bool;
    fn to_f64(self) -> f64;
    fn from_f64(value: f64) -> Self;
    fn add(self, other: Self) -> Self;
    fn mul(self, other: Self) -> Self;
    fn div(self, other: Self) -> Self;
    /// `self * a + b`, fused (one rounding) where the code is compiled with FMA.
    fn mul_add(self, a: Self, b: Self) -> Self;
    /// The IR's `gelu_tanh` of every element (sixteen lanes at a time for f32 with AVX-512,
    /// within 2 ULPs).
    fn gelu_tanh_slice(values: &mut [Self]);
    /// The IR's `gelu` (the erf form) of every element (sixteen lanes at a time for f32 with
    /// AVX-512).
    fn gelu_slice(values: &mut [Self]);
    /// The IR's `sigmoid` of every element (sixteen lanes at a time for f32 with AVX-512).
    fn sigmoid_slice(values: &mut [Self]);
    /// SiLU, the IR's `mul(x, sigmoid(x))`, of every element (sixteen lanes at a time for f32
    /// with AVX-512).
    fn silu_slice(values: &mut [Self]);
    /// The IR's `tanh` of every element (sixteen lanes at a time for f32 with AVX-512).
    fn tanh_slice(values: &mut [Self]);
    /// The slice as f32, if `Self` is f32.
    fn f32s(values: &[Self]) -> Option<&[f32]>;
    fn f32s_mut(values: &mut [Self]) -> Option<&mut [f32]>;
    fn slice(storage: &Storage) -> Option<&[Self]>;
    fn slice_mut(storage: &mut Storage) -> Option<&mut [Self]>;
}

macro_rules! real {
    ($t:ty, $variant:ident, [$gelu_tanh_slice:expr, $gelu_slice:expr, $sigmoid_slice:expr, $silu_slice:expr, $tanh_slice:expr], $f32s:expr, $f32s_mut:expr) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            const NAN: Self = <$t>::NAN;
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn is_negative_zero(self) -> bool {
                self == 0.0 && self.is_sign_negative()
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(value: f64) -> Self {
                value as $t
            }
            fn add(self, other: Self) -> Self {
                self + other
            }
            fn mul(self, other: Self) -> Self {
                self * other
            }
            fn div(self, other: Self) -> Self {
                self / other
            }
            #[inline(always)]
            fn mul_add(self, a: Self, b: Self) -> Self {
                <$t>::mul_add(self, a, b)
            }
            fn gelu_tanh_slice(values: &mut [Self]) {
                $gelu_tanh_slice(values)
            }
            fn gelu_slice(values: &mut [Self]) {
                $gelu_slice(values)
            }
            fn sigmoid_slice(values: &mut [Self]) {
                $sigmoid_slice(values)
            }
            fn silu_slice(values: &mut [Self]) {
                $silu_slice(values)
            }
            fn tanh_slice(values: &mut [Self]) {
                $tanh_slice(values)
            }
            fn f32s(values: &[Self]) -> Option<&[f32]> {
                $f32s(values)
            }
            fn f32s_mut(values: &mut [Self]) -> Option<&mut [f32]> {
                $f32s_mut(values)
            }
            fn slice(storage: &Storage) -> Option<&[Self]> {
                match storage {
                    Storage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn slice_mut(storage: &mut Storage) -> Option<&mut [Self]> {
                match storage {
                    Storage::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
// The activations are the reference interpreter's definitions of the ops, so that fused
// epilogues give the ops' bits.
real!(
    f32,
    F32,
    [
        crate::simd::gelu_tanh_f32_slice,
        crate::simd::gelu_f32_slice,
        crate::simd::sigmoid_f32_slice,
        crate::simd::silu_f32_slice,
        crate::simd::tanh_f32_slice
    ],
    Some,
    Some
);
real!(
    f64,
    F64,
    [
        |values: &mut [f64]| values
            .iter_mut()
            .for_each(|v| *v = kfuse_math::gelu_tanh_f64(*v)),
        |values: &mut [f64]| values
            .iter_mut()
            .for_each(|v| *v = kfuse_math::gelu_f64(*v)),
        |values: &mut [f64]| values
            .iter_mut()
            .for_each(|v| *v = kfuse_math::sigmoid_f64(*v)),
        |values: &mut [f64]| values
            .iter_mut()
            .for_each(|v| *v *= kfuse_math::sigmoid_f64(*v)),
        |values: &mut [f64]| values.iter_mut().for_each(|v| *v = v.tanh())
    ],
    |_| None,
    |_| None
);

/// An epilogue operand (`what`: bias, residual) as `T` values, checked to hold `len` of them.
pub(crate) fn epilogue_operand<'a, T: Real>(
    storage: Option<&'a Storage>,
    len: usize,
    what: &str,
) -> Result<Option<&'a [T]>, String> {
    let Some(storage) = storage else {
        return Ok(None);
    };
    let values =
        T::slice(storage).ok_or_else(|| format!("the {what} dtype differs from the output's"))?;
    if values.len() != len {
        return Err(format!(
            "the {what} has {} values where {len} are needed",
            values.len()
        ));
    }
    Ok(Some(values))
}

/// A raw output pointer shared by tasks that write disjoint parts.
#[derive(Clone, Copy)]
pub(crate) struct Out<T>(pub(crate) *mut T);
// SAFETY: tasks write disjoint index ranges; `run` waits for all of them.
unsafe impl<T> Send for Out<T> {}
unsafe impl<T> Sync for Out<T> {}

impl<T> Out<T> {
    /// The pointer. A method, so that closures capture the whole (`Sync`) wrapper rather than
    /// its raw-pointer field.
    pub(crate) fn ptr(self) -> *mut T {
        self.0
    }
}

/// What a GEMM's destination starts from. Matmul folds its bias in this way; convolutions add
/// theirs with the ReLU in one pass over each band right after its GEMM, which measured 2–3%
/// faster on W7 than pre-filling (the pre-filled band is read back by the GEMM).
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
/// AVX-512 on kfuse's own GEMM ([`sgemm`]; on one thread 4–5% faster than the `gemm` crate on
/// W5a's product), everything else on the `gemm` crate.
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
            if dst_cs == 1 && sgemm::applies(m, n, k) {
                return sgemm::sgemm([m, n, k], a, b, (c, dst_rs), read_dst, &Finish::default());
            }
            // `sgemm` stores along rows: a column-major destination takes the product of the
            // transposes.
            if dst_rs == 1 && sgemm::applies(n, m, k) {
                let (at, bt) = (strided(rhs, rhs_cs, rhs_rs), strided(lhs, lhs_cs, lhs_rs));
                return sgemm::sgemm([n, m, k], at, bt, (c, dst_cs), read_dst, &Finish::default());
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
/// steps is stored ([`sgemm::Finish`]), with no pass over `dst` after it: f32 on kfuse's own
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
    if !f32 || !sgemm::applies(m, n, k) || !matches!(activation, None | Some(Activation::Relu)) {
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
        sgemm::sgemm(
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

/// `max(v, 0)`, passing NaN through as the IR's `relu` does (`v < 0` is false for NaN).
/// The IR's `clamp(v, lo, hi) = minimum(maximum(v, lo), hi)` (IEEE 754-2019: NaN if any
/// operand is NaN, `+0` above `-0`), as `kfuse-math` defines them.
#[inline(always)]
pub(crate) fn clamp<T: Real>(v: T, lo: T, hi: T) -> T {
    if v.is_nan() || lo.is_nan() || hi.is_nan() {
        return T::NAN;
    }
    let m = if v > lo || (v == lo && lo.is_negative_zero()) {
        v
    } else {
        lo
    };
    if m < hi || (m == hi && m.is_negative_zero()) {
        m
    } else {
        hi
    }
}

pub(crate) fn relu<T: Real>(v: T) -> T {
    if v < T::ZERO {
        T::ZERO
    } else {
        v
    }
}

thread_local! {
    /// Each thread's scratch for per-task tiles, kept between tasks and calls so that tiles do
    /// not come from fresh (page-faulting) allocations. It grows to the largest tile the thread
    /// has needed: a few MiB.
    static SCRATCH: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
    /// A second scratch, for a tile the calling thread shares with the pool's tasks while
    /// they run (and take their own from [`SCRATCH`], the caller's included).
    static SHARED: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on `len` elements of this thread's scratch, contents unspecified. Not reentrant:
/// `f` must not call it again.
pub(crate) fn with_scratch<T: Real, R>(len: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
    scratch_of(&SCRATCH, len, f)
}

/// [`with_scratch`] on the second scratch, which `f` may share with tasks that take the
/// first. Not reentrant either.
pub(crate) fn with_shared_scratch<T: Real, R>(len: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
    scratch_of(&SHARED, len, f)
}

fn scratch_of<T: Real, R>(
    key: &'static std::thread::LocalKey<std::cell::RefCell<Vec<u64>>>,
    len: usize,
    f: impl FnOnce(&mut [T]) -> R,
) -> R {
    key.with(|cell| {
        let mut words = cell.borrow_mut();
        let needed = (len * std::mem::size_of::<T>()).div_ceil(8);
        if words.len() < needed {
            words.resize(needed, 0);
        }
        // SAFETY: T is f32 or f64 (`Real`), for which every bit pattern is a value and whose
        // alignment the u64 buffer meets; the buffer holds at least `len` of them and stays
        // borrowed for the call.
        let values = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<T>(), len) };
        f(values)
    })
}

/// Whether the CPU runs the AVX-512 (F, DQ) + FMA builds of the vectorized loops.
pub(crate) fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The bias an epilogue adds along a run of output elements.
#[derive(Clone, Copy)]
pub(crate) enum RowBias<'a, T> {
    None,
    /// One value for the whole run (a channel's row in NCHW).
    Same(T),
    /// One value per element (a matmul row, an NHWC pixel).
    Each(&'a [T]),
}

/// What is applied to a run of output values after the product, in the IR's order: the bias,
/// then the scale, then the residual, then the activation.
#[derive(Clone, Copy)]
pub(crate) struct Tail<'a, T> {
    pub bias: RowBias<'a, T>,
    /// A factor, multiplied after the bias (the same kinds of run as the bias).
    pub scale: RowBias<'a, T>,
    /// One value per element of the run (a skip connection), added after the bias.
    pub residual: Option<&'a [T]>,
    pub activation: Option<Activation>,
}

impl<T> Tail<'_, T> {
    fn is_empty(&self) -> bool {
        matches!(self.bias, RowBias::None)
            && matches!(self.scale, RowBias::None)
            && self.residual.is_none()
            && self.activation.is_none()
    }
}

/// Applies `tail` to `values`. Results are those of the IR's `add` and activation ops, bit for
/// bit (but for GELU's tanh form, within 2 ULPs; its erf form, one input one ULP off; and
/// SiLU, within 3 ULPs: see `simd.rs`). Bias, residual and ReLU take one pass, compiled for
/// AVX-512 as well; the other activations run as a second pass of their explicit 16-lane
/// forms ([`slice_form`]).
pub(crate) fn epilogue<T: Real>(values: &mut [T], tail: Tail<T>) {
    if tail.is_empty() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: the CPU has the features the function is compiled for.
        return unsafe { epilogue_avx512(values, tail) };
    }
    epilogue_body(values, tail)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,fma")]
fn epilogue_avx512<T: Real>(values: &mut [T], tail: Tail<T>) {
    epilogue_body(values, tail)
}

/// [`epilogue`] for an f16 or bf16 op chain computed in f32 (`bf16` says which): the product
/// in `values` is rounded to the half dtype, and so is the result of each step after it, as
/// the IR rounds every op's result in those dtypes. One pass per step; a compound activation's
/// inner results are rounded too (SiLU's sigmoid; hard-swish's sum, product or quotient).
/// Generic for the matmul's sake; only f32 values are rounded (f64 chains never call it).
pub(crate) fn epilogue_rounded<T: Real>(values: &mut [T], tail: Tail<T>, bf16: bool) {
    let round = |v: &mut [T]| {
        if let Some(v) = T::f32s_mut(v) {
            crate::simd::round_to_half_f32_slice(v, bf16);
        }
    };
    let only = |bias, scale, residual, activation| Tail {
        bias,
        scale,
        residual,
        activation,
    };
    round(values);
    if !matches!(tail.bias, RowBias::None) {
        epilogue(values, only(tail.bias, RowBias::None, None, None));
        round(values);
    }
    if !matches!(tail.scale, RowBias::None) {
        epilogue(values, only(RowBias::None, tail.scale, None, None));
        round(values);
    }
    if tail.residual.is_some() {
        epilogue(
            values,
            only(RowBias::None, RowBias::None, tail.residual, None),
        );
        round(values);
    }
    let Some(activation) = tail.activation else {
        return;
    };
    // Runs of values with a scratch run beside them, for the two-step activations.
    const RUN: usize = 256;
    let mut scratch = [T::ZERO; RUN];
    match activation {
        Activation::Silu => {
            for run in values.chunks_mut(RUN) {
                let s = &mut scratch[..run.len()];
                s.copy_from_slice(run);
                T::sigmoid_slice(s);
                round(s);
                for (v, &g) in run.iter_mut().zip(s.iter()) {
                    *v = v.mul(g);
                }
                round(run);
            }
        }
        Activation::HardSwish { divide_last } => {
            let (three, six) = (T::from_f64(3.0), T::from_f64(6.0));
            for run in values.chunks_mut(RUN) {
                let c = &mut scratch[..run.len()];
                for (c, &v) in c.iter_mut().zip(run.iter()) {
                    *c = v.add(three);
                }
                round(c);
                // The clamp of a rounded value to bounds of the dtype is exact.
                for c in c.iter_mut() {
                    *c = clamp(*c, T::ZERO, six);
                }
                if divide_last {
                    for (v, &c) in run.iter_mut().zip(c.iter()) {
                        *v = v.mul(c);
                    }
                    round(run);
                    run.iter_mut().for_each(|v| *v = v.div(six));
                } else {
                    c.iter_mut().for_each(|c| *c = c.div(six));
                    round(c);
                    for (v, &c) in run.iter_mut().zip(c.iter()) {
                        *v = v.mul(c);
                    }
                }
                round(run);
            }
        }
        other => {
            epilogue(
                values,
                only(RowBias::None, RowBias::None, None, Some(other)),
            );
            round(values);
        }
    }
}

/// `dst = epilogue(src)`: [`epilogue`] applied while copying, in one pass.
pub(crate) fn epilogue_into<T: Real>(dst: &mut [T], src: &[T], tail: Tail<T>) {
    if tail.is_empty() {
        return dst.copy_from_slice(src);
    }
    if !matches!(tail.scale, RowBias::None) {
        // With a scale (matmuls, which apply their epilogue in place): copy, then in place.
        let n = src.len().min(dst.len());
        dst[..n].copy_from_slice(&src[..n]);
        return epilogue(&mut dst[..n], tail);
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: the CPU has the features the function is compiled for.
        return unsafe { epilogue_into_avx512(dst, src, tail) };
    }
    epilogue_into_body(dst, src, tail)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,fma")]
fn epilogue_into_avx512<T: Real>(dst: &mut [T], src: &[T], tail: Tail<T>) {
    epilogue_into_body(dst, src, tail)
}

#[inline(always)]
fn epilogue_into_body<T: Real>(dst: &mut [T], src: &[T], tail: Tail<T>) {
    let dst = &mut dst[..src.len()];
    match tail.activation {
        None => biased_into(dst, src, tail, |v| v),
        Some(Activation::Relu) => biased_into(dst, src, tail, relu),
        Some(Activation::Clamp(b)) => {
            let (lo, hi) = (T::from_f64(b.lo()), T::from_f64(b.hi()));
            biased_into(dst, src, tail, |v| clamp(v, lo, hi))
        }
        Some(a) => {
            biased_into(dst, src, tail, |v| v);
            slice_form::<T>(a, dst);
        }
    }
}

/// The activation's form over a whole slice, for the activations other than ReLU: explicit
/// 16-lane code for f32 with AVX-512 (`simd.rs`). Passed to the biased loops as a closure,
/// the scalar forms were left to the compiler's inlining: the sigmoid ended up called out of
/// line, compiled for the baseline ISA (49 against 21 ms for W5a's layer), and GELU's mix of
/// f32 and f64 steps vectorized poorly (1.15 against 0.55 ns per element).
///
/// The transcendental ones flush their subnormal results to zero (see [`crate::fpmode`]): a
/// subnormal costs an Intel core a microcode assist in every instruction that writes or reads
/// it, here and in the GEMM that reads the activations next.
fn slice_form<T: Real>(activation: Activation, values: &mut [T]) {
    let transcendental = matches!(
        activation,
        Activation::GeluTanh
            | Activation::Gelu
            | Activation::Silu
            | Activation::Sigmoid
            | Activation::Tanh
    );
    let _flush = transcendental.then(crate::fpmode::FlushSubnormalResults::new);
    match activation {
        Activation::GeluTanh => T::gelu_tanh_slice(values),
        Activation::Gelu => T::gelu_slice(values),
        Activation::Silu => T::silu_slice(values),
        Activation::Sigmoid => T::sigmoid_slice(values),
        Activation::Tanh => T::tanh_slice(values),
        Activation::Relu => values.iter_mut().for_each(|v| *v = relu(*v)),
        Activation::HardSwish { divide_last } => {
            if let Some(values) = T::f32s_mut(values) {
                return crate::simd::hardswish_f32_slice(values, divide_last);
            }
            let (three, six) = (T::from_f64(3.0), T::from_f64(6.0));
            if divide_last {
                for v in values.iter_mut() {
                    *v = v.mul(clamp(v.add(three), T::ZERO, six)).div(six);
                }
            } else {
                for v in values.iter_mut() {
                    *v = v.mul(clamp(v.add(three), T::ZERO, six).div(six));
                }
            }
        }
        Activation::Clamp(bounds) => {
            let (lo, hi) = (T::from_f64(bounds.lo()), T::from_f64(bounds.hi()));
            for v in values.iter_mut() {
                *v = clamp(*v, lo, hi);
            }
        }
    }
}

/// `dst = f(src + bias + residual)`. Plain loops rather than `for_each`: a `for_each` is a
/// call to an iterator adapter's `fold`, which need not be inlined, and then runs without the
/// caller's AVX-512 features (and its `exp` calls libm for rounding).
#[inline(always)]
fn biased_into<T: Real>(dst: &mut [T], src: &[T], tail: Tail<T>, f: impl Fn(T) -> T) {
    let n = dst.len().min(src.len());
    let (dst, src) = (&mut dst[..n], &src[..n]);
    match (tail.bias, tail.residual) {
        (RowBias::None, None) => {
            for i in 0..n {
                dst[i] = f(src[i]);
            }
        }
        (RowBias::Same(b), None) => {
            for i in 0..n {
                dst[i] = f(src[i].add(b));
            }
        }
        (RowBias::Each(b), None) => {
            let b = &b[..n];
            for i in 0..n {
                dst[i] = f(src[i].add(b[i]));
            }
        }
        (RowBias::None, Some(r)) => {
            let r = &r[..n];
            for i in 0..n {
                dst[i] = f(src[i].add(r[i]));
            }
        }
        (RowBias::Same(b), Some(r)) => {
            let r = &r[..n];
            for i in 0..n {
                dst[i] = f(src[i].add(b).add(r[i]));
            }
        }
        (RowBias::Each(b), Some(r)) => {
            let (b, r) = (&b[..n], &r[..n]);
            for i in 0..n {
                dst[i] = f(src[i].add(b[i]).add(r[i]));
            }
        }
    }
}

#[inline(always)]
fn epilogue_body<T: Real>(values: &mut [T], tail: Tail<T>) {
    if !matches!(tail.scale, RowBias::None) {
        // A scale: bias, factor and residual in one loop (one per combination of kinds).
        match tail.activation {
            None => scaled(values, tail, |v| v),
            Some(Activation::Relu) => scaled(values, tail, relu),
            Some(Activation::Clamp(b)) => {
                let (lo, hi) = (T::from_f64(b.lo()), T::from_f64(b.hi()));
                scaled(values, tail, |v| clamp(v, lo, hi))
            }
            Some(a) => {
                scaled(values, tail, |v| v);
                slice_form::<T>(a, values);
            }
        }
        return;
    }
    let biases = !matches!((tail.bias, tail.residual), (RowBias::None, None));
    match tail.activation {
        None => biased(values, tail, |v| v),
        Some(Activation::Relu) => biased(values, tail, relu),
        Some(Activation::Clamp(b)) => {
            let (lo, hi) = (T::from_f64(b.lo()), T::from_f64(b.hi()));
            biased(values, tail, |v| clamp(v, lo, hi))
        }
        Some(a) => {
            if biases {
                biased(values, tail, |v| v);
            }
            slice_form::<T>(a, values);
        }
    }
}

/// One step of a tail over a run of values: none, or an `add` or `mul` of one operand for the
/// whole run or one per element.
trait Step<T>: Copy {
    fn apply(self, v: T, i: usize) -> T;
}

#[derive(Clone, Copy)]
struct Keep;
#[derive(Clone, Copy)]
struct AddOne<T>(T);
#[derive(Clone, Copy)]
struct AddEach<'a, T>(&'a [T]);
#[derive(Clone, Copy)]
struct MulOne<T>(T);
#[derive(Clone, Copy)]
struct MulEach<'a, T>(&'a [T]);

impl<T> Step<T> for Keep {
    #[inline(always)]
    fn apply(self, v: T, _: usize) -> T {
        v
    }
}
impl<T: Real> Step<T> for AddOne<T> {
    #[inline(always)]
    fn apply(self, v: T, _: usize) -> T {
        v.add(self.0)
    }
}
impl<T: Real> Step<T> for AddEach<'_, T> {
    #[inline(always)]
    fn apply(self, v: T, i: usize) -> T {
        v.add(self.0[i])
    }
}
impl<T: Real> Step<T> for MulOne<T> {
    #[inline(always)]
    fn apply(self, v: T, _: usize) -> T {
        v.mul(self.0)
    }
}
impl<T: Real> Step<T> for MulEach<'_, T> {
    #[inline(always)]
    fn apply(self, v: T, i: usize) -> T {
        v.mul(self.0[i])
    }
}

/// `v = f((v + bias) * scale + residual)` over `values` (a tail with a scale), as the IR's ops
/// in that order, in one plain loop per combination of the operands' kinds.
#[inline(always)]
fn scaled<T: Real>(values: &mut [T], tail: Tail<T>, f: impl Fn(T) -> T + Copy) {
    let n = values.len();
    #[inline(always)]
    fn with_scale<T: Real, B: Step<T>>(
        values: &mut [T],
        bias: B,
        tail: Tail<T>,
        f: impl Fn(T) -> T + Copy,
    ) {
        let n = values.len();
        match tail.scale {
            RowBias::Same(s) => with_residual(values, bias, MulOne(s), tail, f),
            RowBias::Each(s) => with_residual(values, bias, MulEach(&s[..n]), tail, f),
            RowBias::None => with_residual(values, bias, Keep, tail, f),
        }
    }
    #[inline(always)]
    fn with_residual<T: Real, B: Step<T>, S: Step<T>>(
        values: &mut [T],
        bias: B,
        scale: S,
        tail: Tail<T>,
        f: impl Fn(T) -> T + Copy,
    ) {
        let n = values.len();
        match tail.residual {
            Some(r) => each(values, bias, scale, AddEach(&r[..n]), f),
            None => each(values, bias, scale, Keep, f),
        }
    }
    #[inline(always)]
    fn each<T: Real, B: Step<T>, S: Step<T>, R: Step<T>>(
        values: &mut [T],
        bias: B,
        scale: S,
        residual: R,
        f: impl Fn(T) -> T,
    ) {
        for (i, v) in values.iter_mut().enumerate() {
            *v = f(residual.apply(scale.apply(bias.apply(*v, i), i), i));
        }
    }
    match tail.bias {
        RowBias::None => with_scale(values, Keep, tail, f),
        RowBias::Same(b) => with_scale(values, AddOne(b), tail, f),
        RowBias::Each(b) => with_scale(values, AddEach(&b[..n]), tail, f),
    }
}

/// `v = f(v + bias + residual)` over `values`, in plain loops (see [`biased_into`]).
#[inline(always)]
fn biased<T: Real>(values: &mut [T], tail: Tail<T>, f: impl Fn(T) -> T) {
    let n = values.len();
    match (tail.bias, tail.residual) {
        (RowBias::None, None) => {
            for v in values.iter_mut() {
                *v = f(*v);
            }
        }
        (RowBias::Same(b), None) => {
            for v in values.iter_mut() {
                *v = f(v.add(b));
            }
        }
        (RowBias::Each(b), None) => {
            let b = &b[..n];
            for i in 0..n {
                values[i] = f(values[i].add(b[i]));
            }
        }
        (RowBias::None, Some(r)) => {
            let r = &r[..n];
            for i in 0..n {
                values[i] = f(values[i].add(r[i]));
            }
        }
        (RowBias::Same(b), Some(r)) => {
            let r = &r[..n];
            for i in 0..n {
                values[i] = f(values[i].add(b).add(r[i]));
            }
        }
        (RowBias::Each(b), Some(r)) => {
            let (b, r) = (&b[..n], &r[..n]);
            for i in 0..n {
                values[i] = f(values[i].add(b[i]).add(r[i]));
            }
        }
    }
}

/// Values and bounds the clamps are tested on: NaNs (with a payload too), both zeros,
/// subnormals, ReLU6's bounds and their neighbours, the extremes and the infinities.
#[cfg(test)]
pub(crate) const CLAMP_SPECIALS: [f32; 16] = [
    f32::NAN,
    -f32::NAN,
    f32::from_bits(0x7fa0_0001),
    -0.0,
    0.0,
    1e-40,
    -1e-40,
    1.0,
    -1.0,
    6.0,
    5.999_999_5,
    f32::MAX,
    f32::MIN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::MIN_POSITIVE,
];

#[cfg(test)]
mod clamp_tests {
    use super::{clamp, CLAMP_SPECIALS};

    /// The epilogue's clamp is the IR's, bit for bit: `minimum(maximum(v, lo), hi)` with NaN
    /// propagated and `+0` above `-0`, for every triple of special values as value and bounds.
    #[test]
    fn clamp_matches_kfuse_math_bit_for_bit() {
        let specials = CLAMP_SPECIALS;
        for &v in &specials {
            for &lo in &specials {
                for &hi in &specials {
                    let want = kfuse_math::minimum_f32(kfuse_math::maximum_f32(v, lo), hi);
                    let got = clamp(v, lo, hi);
                    assert!(
                        want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()),
                        "clamp({v:?}, {lo:?}, {hi:?}) = {got:?}, want {want:?}"
                    );
                    let want = kfuse_math::minimum_f64(
                        kfuse_math::maximum_f64(v as f64, lo as f64),
                        hi as f64,
                    );
                    let got = clamp(v as f64, lo as f64, hi as f64);
                    assert!(want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()));
                }
            }
        }
    }
}
