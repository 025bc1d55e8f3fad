//! What the dense routines (matmul, convolution, pooling) share: operands borrowed where they
//! live, the float types they are written for, a raw output pointer for tasks writing disjoint
//! parts, per-thread scratch, and the CPU feature check.

use kfuse_ir::Storage;

/// A tensor operand: its data and dims, borrowed where it lives (no copy).
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    pub storage: &'a Storage,
    pub dims: &'a [usize],
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
