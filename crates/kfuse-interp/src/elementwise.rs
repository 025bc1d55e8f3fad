//! Elementwise ops: unary, binary, comparisons, select, clamp and cast.

use kfuse_ir::{Array, BinaryOp, CompareOp, DType, Element, Shape, Storage, UnaryOp};
use kfuse_math as m;

use crate::elem::{narrow, widen, with_compute, Elem};
use crate::strided::broadcast_map;

fn array<T: Element>(shape: &Shape, v: Vec<T>) -> Array {
    Array::new(shape.clone(), T::wrap(v)).expect("elementwise result fills its shape")
}

fn float_sign<F: Elem + std::ops::Neg<Output = F>>(x: F, zero: F, one: F) -> F {
    if x.is_nan() || x == zero {
        x
    } else if x > zero {
        one
    } else {
        -one
    }
}

fn unary_f32(op: UnaryOp) -> fn(f32) -> f32 {
    match op {
        UnaryOp::Neg => |x| -x,
        UnaryOp::Abs => f32::abs,
        UnaryOp::Sign => |x| float_sign(x, 0.0, 1.0),
        UnaryOp::Exp => m::exp_f32,
        UnaryOp::Exp2 => m::exp2_f32,
        UnaryOp::Log => m::log_f32,
        UnaryOp::Log2 => m::log2_f32,
        UnaryOp::Log1p => m::log1p_f32,
        UnaryOp::Expm1 => m::expm1_f32,
        UnaryOp::Sqrt => f32::sqrt,
        UnaryOp::Rsqrt => m::rsqrt_f32,
        UnaryOp::Reciprocal => |x| 1.0 / x,
        UnaryOp::Sin => m::sin_f32,
        UnaryOp::Cos => m::cos_f32,
        UnaryOp::Tanh => m::tanh_f32,
        UnaryOp::Sigmoid => m::sigmoid_f32,
        UnaryOp::Relu => |x| m::maximum_f32(x, 0.0),
        UnaryOp::Gelu => m::gelu_f32,
        UnaryOp::GeluTanh => m::gelu_tanh_f32,
        UnaryOp::Erf => m::erf_f32,
        UnaryOp::Softplus => m::softplus_f32,
        UnaryOp::Floor => f32::floor,
        UnaryOp::Ceil => f32::ceil,
        UnaryOp::Round => f32::round_ties_even,
        UnaryOp::Not => unreachable!("not is bool-only; inference rejects floats"),
    }
}

fn unary_f64(op: UnaryOp) -> fn(f64) -> f64 {
    match op {
        UnaryOp::Neg => |x| -x,
        UnaryOp::Abs => f64::abs,
        UnaryOp::Sign => |x| float_sign(x, 0.0, 1.0),
        UnaryOp::Exp => f64::exp,
        UnaryOp::Exp2 => f64::exp2,
        UnaryOp::Log => f64::ln,
        UnaryOp::Log2 => f64::log2,
        UnaryOp::Log1p => f64::ln_1p,
        UnaryOp::Expm1 => f64::exp_m1,
        UnaryOp::Sqrt => f64::sqrt,
        UnaryOp::Rsqrt => |x| 1.0 / x.sqrt(),
        UnaryOp::Reciprocal => |x| 1.0 / x,
        UnaryOp::Sin => f64::sin,
        UnaryOp::Cos => f64::cos,
        UnaryOp::Tanh => f64::tanh,
        UnaryOp::Sigmoid => m::sigmoid_f64,
        UnaryOp::Relu => |x| m::maximum_f64(x, 0.0),
        UnaryOp::Gelu => m::gelu_f64,
        UnaryOp::GeluTanh => m::gelu_tanh_f64,
        UnaryOp::Erf => m::erf_f64,
        UnaryOp::Softplus => m::softplus_f64,
        UnaryOp::Floor => f64::floor,
        UnaryOp::Ceil => f64::ceil,
        UnaryOp::Round => f64::round_ties_even,
        UnaryOp::Not => unreachable!("not is bool-only; inference rejects floats"),
    }
}

macro_rules! int_unary {
    ($op:expr, $v:expr, $t:ty) => {{
        let f: fn($t) -> $t = match $op {
            UnaryOp::Neg => |x| x.wrapping_neg(),
            UnaryOp::Abs => |x| x.wrapping_abs(),
            UnaryOp::Sign => |x| (x > 0) as $t - (x < 0) as $t,
            UnaryOp::Relu => |x| x.max(0),
            other => unreachable!("{} on integers; inference rejects it", other.name()),
        };
        $v.iter().map(|&x| f(x)).collect::<Vec<$t>>()
    }};
}

/// An elementwise unary op.
pub fn unary(op: UnaryOp, x: &Array) -> Array {
    let wide = widen(x);
    let shape = x.shape();
    let out = match wide.storage() {
        Storage::F32(v) => {
            let f = unary_f32(op);
            array(shape, v.iter().map(|&a| f(a)).collect())
        }
        Storage::F64(v) => {
            let f = unary_f64(op);
            array(shape, v.iter().map(|&a| f(a)).collect())
        }
        Storage::I32(v) => array(shape, int_unary!(op, v, i32)),
        Storage::I64(v) => array(shape, int_unary!(op, v, i64)),
        Storage::U8(v) => {
            let f: fn(u8) -> u8 = match op {
                UnaryOp::Neg => |x| x.wrapping_neg(),
                UnaryOp::Abs | UnaryOp::Relu => |x| x,
                UnaryOp::Sign => |x| (x > 0) as u8,
                other => unreachable!("{} on u8; inference rejects it", other.name()),
            };
            array(shape, v.iter().map(|&a| f(a)).collect())
        }
        Storage::Bool(v) => array(shape, v.iter().map(|&a| !a).collect()),
        Storage::F16(_) | Storage::BF16(_) => unreachable!("widened above"),
    };
    narrow(out, x.dtype())
}

fn int_pow(base: i64, exp: i64) -> i64 {
    if exp < 0 {
        // numpy refuses negative integer powers; kfuse defines them as the truncated quotient
        // 1 / base^-exp: 1 for base 1, +-1 for base -1, 0 otherwise (and 0 for base 0).
        return match base {
            1 => 1,
            -1 => {
                if exp % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    let (mut result, mut b, mut e) = (1i64, base, exp as u64);
    while e > 0 {
        if e & 1 == 1 {
            result = result.wrapping_mul(b);
        }
        b = b.wrapping_mul(b);
        e >>= 1;
    }
    result
}

fn float_binary<F: Elem + std::ops::Sub<Output = F> + std::ops::Div<Output = F>>(
    op: BinaryOp,
    rem: fn(F, F) -> F,
    pow: fn(F, F) -> F,
) -> impl Fn([F; 2]) -> F {
    move |[a, b]: [F; 2]| match op {
        BinaryOp::Add => a.add(b),
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a.mul(b),
        BinaryOp::Div => a / b,
        BinaryOp::Rem => rem(a, b),
        BinaryOp::Pow => pow(a, b),
        BinaryOp::Max => a.ieee_max(b),
        BinaryOp::Min => a.ieee_min(b),
        BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => unreachable!("bitwise ops on floats"),
    }
}

fn int_binary<I: Elem>(op: BinaryOp) -> impl Fn([I; 2]) -> I {
    move |[a, b]: [I; 2]| {
        let (x, y) = (a.to_i64(), b.to_i64());
        let r = match op {
            BinaryOp::Add => return a.add(b),
            BinaryOp::Mul => return a.mul(b),
            BinaryOp::Max => return a.ieee_max(b),
            BinaryOp::Min => return a.ieee_min(b),
            BinaryOp::Sub => x.wrapping_sub(y),
            BinaryOp::Div => m::floor_div_i64(x, y),
            BinaryOp::Rem => m::rem_i64(x, y),
            BinaryOp::Pow => int_pow(x, y),
            BinaryOp::And => x & y,
            BinaryOp::Or => x | y,
            BinaryOp::Xor => x ^ y,
        };
        // Integer results are computed in i64 and wrap to the operand type; i32 floor division
        // of MIN by -1 wraps like i32 arithmetic does.
        I::from_i64(r)
    }
}

/// An elementwise binary op with numpy broadcasting to `out`.
pub fn binary(op: BinaryOp, a: &Array, b: &Array, out: &Shape) -> Array {
    let (wa, wb) = (widen(a), widen(b));
    let result = match (wa.storage(), wb.storage()) {
        (Storage::F32(x), Storage::F32(y)) => array(
            out,
            broadcast_map(
                out,
                [(x, a.shape()), (y, b.shape())],
                float_binary(op, m::rem_f32, m::pow_f32),
            ),
        ),
        (Storage::F64(x), Storage::F64(y)) => array(
            out,
            broadcast_map(
                out,
                [(x, a.shape()), (y, b.shape())],
                float_binary(op, m::rem_f64, f64::powf),
            ),
        ),
        (Storage::I32(x), Storage::I32(y)) => array(
            out,
            broadcast_map(out, [(x, a.shape()), (y, b.shape())], int_binary::<i32>(op)),
        ),
        (Storage::I64(x), Storage::I64(y)) => array(
            out,
            broadcast_map(out, [(x, a.shape()), (y, b.shape())], int_binary::<i64>(op)),
        ),
        (Storage::U8(x), Storage::U8(y)) => array(
            out,
            broadcast_map(out, [(x, a.shape()), (y, b.shape())], int_binary::<u8>(op)),
        ),
        (Storage::Bool(x), Storage::Bool(y)) => {
            let f = move |[p, q]: [bool; 2]| match op {
                BinaryOp::And => p & q,
                BinaryOp::Or => p | q,
                BinaryOp::Xor => p ^ q,
                other => unreachable!("{} on bool; inference rejects it", other.name()),
            };
            array(out, broadcast_map(out, [(x, a.shape()), (y, b.shape())], f))
        }
        _ => unreachable!("binary operands share a dtype after inference"),
    };
    narrow(result, a.dtype())
}

/// A comparison with numpy broadcasting; the result is bool.
pub fn compare(op: CompareOp, a: &Array, b: &Array, out: &Shape) -> Array {
    let (wa, wb) = (widen(a), widen(b));
    let cmp = move |x: Option<std::cmp::Ordering>| -> bool {
        use std::cmp::Ordering::*;
        match op {
            CompareOp::Eq => x == Some(Equal),
            CompareOp::Ne => x != Some(Equal),
            CompareOp::Lt => x == Some(Less),
            CompareOp::Le => matches!(x, Some(Less | Equal)),
            CompareOp::Gt => x == Some(Greater),
            CompareOp::Ge => matches!(x, Some(Greater | Equal)),
        }
    };
    let bstore = wb.storage();
    with_compute!(wa.storage(), x: T => {
        let y = <T as Element>::slice(bstore).expect("compare operands share a dtype");
        array(out, broadcast_map(out, [(x.as_slice(), a.shape()), (y, b.shape())], |[p, q]: [T; 2]| cmp(p.partial_cmp(&q))))
    })
}

/// `select(cond, a, b)` with broadcasting.
pub fn select(cond: &Array, a: &Array, b: &Array, out: &Shape) -> Array {
    let c = cond.as_slice::<bool>().expect("select condition is bool");
    let c_shape = cond.shape();
    // Selection moves bits, so 16-bit floats need no widening.
    let bstore = b.storage();
    macro_rules! sel {
        ($x:expr, $T:ty) => {{
            let y = <$T as Element>::slice(bstore).expect("select operands share a dtype");
            let idx: Vec<u8> = broadcast_map(out, [(c, c_shape)], |[p]| p as u8);
            let xs: Vec<$T> = broadcast_map(out, [($x.as_slice(), a.shape())], |[v]| v);
            let ys: Vec<$T> = broadcast_map(out, [(y, b.shape())], |[v]| v);
            array(
                out,
                idx.iter()
                    .zip(xs.into_iter().zip(ys))
                    .map(|(&k, (p, q))| if k == 1 { p } else { q })
                    .collect(),
            )
        }};
    }
    match a.storage() {
        Storage::F32(x) => sel!(x, f32),
        Storage::F64(x) => sel!(x, f64),
        Storage::F16(x) => sel!(x, kfuse_ir::f16),
        Storage::BF16(x) => sel!(x, kfuse_ir::bf16),
        Storage::I32(x) => sel!(x, i32),
        Storage::I64(x) => sel!(x, i64),
        Storage::U8(x) => sel!(x, u8),
        Storage::Bool(x) => sel!(x, bool),
    }
}

/// `clamp(x, lo, hi) = min(max(x, lo), hi)` with broadcasting.
pub fn clamp(x: &Array, lo: &Array, hi: &Array, out: &Shape) -> Array {
    let (wx, wl, wh) = (widen(x), widen(lo), widen(hi));
    let (ls, hs) = (wl.storage(), wh.storage());
    let result = with_compute!(wx.storage(), v: T => {
        let l = <T as Element>::slice(ls).expect("clamp operands share a dtype");
        let h = <T as Element>::slice(hs).expect("clamp operands share a dtype");
        array(out, broadcast_map(out, [(v.as_slice(), x.shape()), (l, lo.shape()), (h, hi.shape())], |[a, b, c]: [T; 3]| a.ieee_max(b).ieee_min(c)))
    });
    narrow(result, x.dtype())
}

fn cast_vec<S: Elem, T: Elem>(v: &[S]) -> Vec<T> {
    if T::DTYPE == DType::Bool {
        return v.iter().map(|&x| T::from_i64(x.to_bool() as i64)).collect();
    }
    if S::IS_FLOAT {
        // Float to float rounds to nearest; float to integer truncates toward zero, saturates,
        // and maps NaN to 0 (Rust `as`).
        v.iter().map(|&x| T::from_f64(x.to_f64())).collect()
    } else {
        // Integers and bool: wrap to integer targets, round to nearest for float targets.
        v.iter().map(|&x| T::from_i64(x.to_i64())).collect()
    }
}

/// Converts `x` to `to`.
pub fn cast(x: &Array, to: DType) -> Array {
    let wide = widen(x);
    let shape = x.shape();
    let target = to.compute_type();
    let result = with_compute!(wide.storage(), v: S => {
        let v = v.as_slice();
        match target {
            DType::F32 => {
                // An f64 source narrowed to f16/bf16 must round once, straight from f64
                // (kfuse-math's own conversion: `half`'s `from_f64` rounds through f32).
                if to != DType::F32 && S::DTYPE == DType::F64 {
                    let data = v.iter().map(|&x| x.to_f64());
                    let storage = if to == DType::F16 {
                        Storage::F16(
                            data.map(|x| kfuse_ir::f16::from_bits(kfuse_math::f16_bits_from_f64(x)))
                                .collect(),
                        )
                    } else {
                        Storage::BF16(
                            data.map(|x| {
                                kfuse_ir::bf16::from_bits(kfuse_math::bf16_bits_from_f64(x))
                            })
                            .collect(),
                        )
                    };
                    return Array::new(shape.clone(), storage).expect("same length");
                }
                array(shape, cast_vec::<S, f32>(v))
            }
            DType::F64 => array(shape, cast_vec::<S, f64>(v)),
            DType::I32 => array(shape, cast_vec::<S, i32>(v)),
            DType::I64 => array(shape, cast_vec::<S, i64>(v)),
            DType::U8 => array(shape, cast_vec::<S, u8>(v)),
            DType::Bool => array(shape, cast_vec::<S, bool>(v)),
            DType::F16 | DType::BF16 => unreachable!("compute_type is never a 16-bit float"),
        }
    });
    narrow(result, to)
}
