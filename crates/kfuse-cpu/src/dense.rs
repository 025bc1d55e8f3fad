//! What the dense routines (matmul, convolution, pooling) share: operands borrowed where they
//! live, the epilogue description, the float types they are written for, a raw output pointer
//! for tasks writing disjoint parts, and the single-threaded GEMM call each task makes.

use kfuse_ir::Storage;
pub use kfuse_kernel::Activation;

/// A tensor operand: its data and dims, borrowed where it lives (no copy).
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    pub storage: &'a Storage,
    pub dims: &'a [usize],
}

/// Work applied to each output tile after its GEMM.
#[derive(Clone, Copy, Debug, Default)]
pub struct Epilogue<'a> {
    /// One value per output channel, added.
    pub bias: Option<&'a Storage>,
    /// Then this activation, computed as the IR's op computes it (`kfuse-math`'s definitions,
    /// bit for bit).
    pub activation: Option<Activation>,
}

pub(crate) trait Real: Copy + Send + Sync + 'static + PartialOrd {
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;
    fn is_nan(self) -> bool;
    fn is_negative_zero(self) -> bool;
    fn to_f64(self) -> f64;
    fn from_f64(value: f64) -> Self;
    fn add(self, other: Self) -> Self;
    fn mul(self, other: Self) -> Self;
    /// `self * a + b`, fused (one rounding) where the code is compiled with FMA.
    fn mul_add(self, a: Self, b: Self) -> Self;
    fn gelu_tanh(self) -> Self;
    /// The slice as f32, if `Self` is f32.
    fn f32s(values: &[Self]) -> Option<&[f32]>;
    fn f32s_mut(values: &mut [Self]) -> Option<&mut [f32]>;
    fn slice(storage: &Storage) -> Option<&[Self]>;
    fn slice_mut(storage: &mut Storage) -> Option<&mut [Self]>;
}

macro_rules! real {
    ($t:ty, $variant:ident, $gelu:path, $f32s:expr, $f32s_mut:expr) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
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
            #[inline(always)]
            fn mul_add(self, a: Self, b: Self) -> Self {
                <$t>::mul_add(self, a, b)
            }
            #[inline(always)]
            fn gelu_tanh(self) -> Self {
                $gelu(self)
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
real!(f32, F32, kfuse_math::gelu_tanh_f32, Some, Some);
real!(f64, F64, kfuse_math::gelu_tanh_f64, |_| None, |_| None);

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

/// `dst[m×n] = init + lhs[m×k] @ rhs[k×n]` with arbitrary strides, single-threaded.
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

/// `max(v, 0)`, passing NaN through as the IR's `relu` does (`v < 0` is false for NaN).
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
}

/// Runs `f` on `len` elements of this thread's scratch, contents unspecified. Not reentrant:
/// `f` must not call it again.
pub(crate) fn with_scratch<T: Real, R>(len: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
    SCRATCH.with(|cell| {
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

/// Applies an epilogue to `values`: the bias, then the activation. Results are those of the
/// IR's `add` and activation ops, bit for bit; the loops are compiled for AVX-512 as well, where
/// GELU's exponential vectorizes.
pub(crate) fn epilogue<T: Real>(
    values: &mut [T],
    bias: RowBias<T>,
    activation: Option<Activation>,
) {
    if matches!(bias, RowBias::None) && activation.is_none() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: the CPU has the features the function is compiled for.
        return unsafe { epilogue_avx512(values, bias, activation) };
    }
    epilogue_body(values, bias, activation)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,fma")]
fn epilogue_avx512<T: Real>(values: &mut [T], bias: RowBias<T>, activation: Option<Activation>) {
    epilogue_body(values, bias, activation)
}

/// `dst = epilogue(src)`: [`epilogue`] applied while copying, in one pass.
pub(crate) fn epilogue_into<T: Real>(
    dst: &mut [T],
    src: &[T],
    bias: RowBias<T>,
    activation: Option<Activation>,
) {
    if matches!(bias, RowBias::None) && activation.is_none() {
        return dst.copy_from_slice(src);
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: the CPU has the features the function is compiled for.
        return unsafe { epilogue_into_avx512(dst, src, bias, activation) };
    }
    epilogue_into_body(dst, src, bias, activation)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,fma")]
fn epilogue_into_avx512<T: Real>(
    dst: &mut [T],
    src: &[T],
    bias: RowBias<T>,
    activation: Option<Activation>,
) {
    epilogue_into_body(dst, src, bias, activation)
}

#[inline(always)]
fn epilogue_into_body<T: Real>(
    dst: &mut [T],
    src: &[T],
    bias: RowBias<T>,
    activation: Option<Activation>,
) {
    let dst = &mut dst[..src.len()];
    match activation {
        None => biased_into(dst, src, bias, |v| v),
        Some(Activation::Relu) => biased_into(dst, src, bias, relu),
        Some(Activation::GeluTanh) => biased_into(dst, src, bias, T::gelu_tanh),
    }
}

/// `dst = f(src + bias)`.
#[inline(always)]
fn biased_into<T: Real>(dst: &mut [T], src: &[T], bias: RowBias<T>, f: impl Fn(T) -> T) {
    match bias {
        RowBias::None => dst.iter_mut().zip(src).for_each(|(d, v)| *d = f(*v)),
        RowBias::Same(b) => dst.iter_mut().zip(src).for_each(|(d, v)| *d = f(v.add(b))),
        RowBias::Each(b) => dst
            .iter_mut()
            .zip(src)
            .zip(b)
            .for_each(|((d, v), b)| *d = f(v.add(*b))),
    }
}

#[inline(always)]
fn epilogue_body<T: Real>(values: &mut [T], bias: RowBias<T>, activation: Option<Activation>) {
    // One pass: bias and activation on each element while it is in a register.
    match activation {
        None => biased(values, bias, |v| v),
        Some(Activation::Relu) => biased(values, bias, relu),
        Some(Activation::GeluTanh) => biased(values, bias, T::gelu_tanh),
    }
}

/// `v = f(v + bias)` over `values`.
#[inline(always)]
fn biased<T: Real>(values: &mut [T], bias: RowBias<T>, f: impl Fn(T) -> T) {
    match bias {
        RowBias::None => values.iter_mut().for_each(|v| *v = f(*v)),
        RowBias::Same(b) => values.iter_mut().for_each(|v| *v = f(v.add(b))),
        RowBias::Each(b) => values
            .iter_mut()
            .zip(b)
            .for_each(|(v, b)| *v = f(v.add(*b))),
    }
}
