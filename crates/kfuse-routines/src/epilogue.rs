//! The epilogue a GEMM or convolution applies to each output tile while it is in cache: a
//! per-channel bias, a scale, a residual, then an activation, as the IR's ops compute them. The
//! 16-lane forms of the activations are in `simd`; the forms applied in a microkernel's
//! registers are `simd::InRegisters`.

use kfuse_ir::Storage;

pub use kfuse_ir::Activation;

use crate::dense::{has_avx512, widen_half, Real};

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
/// line, compiled for the baseline ISA, and GELU's mix of f32 and f64 steps vectorized poorly
/// (`docs/structured-ops.md`, "Measurements behind design choices").
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

    /// The clamp in registers is the epilogue's `clamp` (the IR's), bit for bit, on every
    /// triple of special values as value and bounds.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn clamp_in_registers_matches_the_epilogue() {
        use std::arch::x86_64::*;
        if !crate::dense::has_avx512() {
            kfuse_testkit::skip(
                "clamp_in_registers_matches_the_epilogue",
                kfuse_testkit::Prerequisite::Avx512,
                "the clamp in registers needs AVX-512, which this CPU lacks",
            );
            return;
        }
        let specials = super::CLAMP_SPECIALS;
        let mut checked = 0;
        for &lo in &specials {
            for &hi in &specials {
                let Some(act) = crate::simd::InRegisters::of(Some(super::Activation::Clamp(
                    kfuse_ir::Bounds::new(f64::from(lo), f64::from(hi)),
                ))) else {
                    assert!(lo.is_nan() || hi.is_nan(), "clamp({lo}, {hi}) kept out");
                    continue;
                };
                let values: [f32; 16] = std::array::from_fn(|i| specials[i]);
                let mut got = [0.0f32; 16];
                // SAFETY: the CPU has AVX-512F and DQ (checked above); the arrays hold 16.
                unsafe {
                    let v = apply_avx512(act, _mm512_loadu_ps(values.as_ptr()));
                    _mm512_storeu_ps(got.as_mut_ptr(), v);
                }
                for (&v, &g) in values.iter().zip(&got) {
                    let want = super::clamp(v, lo, hi);
                    assert_eq!(g.to_bits(), want.to_bits(), "clamp({v:e}, {lo:e}, {hi:e})");
                    checked += 1;
                }
            }
        }
        assert!(checked > 2000);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512dq")]
    fn apply_avx512(
        act: crate::simd::InRegisters,
        v: std::arch::x86_64::__m512,
    ) -> std::arch::x86_64::__m512 {
        // SAFETY: compiled for the features `apply` needs.
        unsafe { act.apply(v) }
    }
}
