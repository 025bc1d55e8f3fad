//! The compute element types (`f32`, `f64`, `i32`, `i64`, `u8`, `bool`) behind one trait, so each
//! op is written once. `f16` and `bf16` are widened to `f32` before an op and rounded after.

use std::cmp::Ordering;

use kfuse_ir::{Array, DType, Element, Storage};

/// Arithmetic every compute type supports, with kfuse's semantics: integer arithmetic wraps,
/// float `max`/`min` are IEEE 754-2019 `maximum`/`minimum`.
pub trait Elem: Element + Copy + PartialEq + PartialOrd + std::fmt::Debug {
    const IS_FLOAT: bool;
    fn from_f64(x: f64) -> Self;
    fn from_i64(x: i64) -> Self;
    fn to_f64(self) -> f64;
    fn to_i64(self) -> i64;
    fn to_bool(self) -> bool;
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn ieee_max(self, o: Self) -> Self;
    fn ieee_min(self, o: Self) -> Self;
    /// Identity of `max` (lowest value) and of `min` (highest value).
    fn lowest() -> Self;
    fn highest() -> Self;
    fn is_nan(self) -> bool;
    /// Total order for sorting: NaN above every number, `-0 == +0`.
    fn sort_cmp(self, o: Self) -> Ordering {
        match (self.is_nan(), o.is_nan()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            _ => self.partial_cmp(&o).unwrap_or(Ordering::Equal),
        }
    }
}

macro_rules! float_elem {
    ($t:ty, $max:path, $min:path) => {
        impl Elem for $t {
            const IS_FLOAT: bool = true;
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            fn from_i64(x: i64) -> Self {
                x as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn to_i64(self) -> i64 {
                self as i64
            }
            fn to_bool(self) -> bool {
                self != 0.0
            }
            fn add(self, o: Self) -> Self {
                self + o
            }
            fn mul(self, o: Self) -> Self {
                self * o
            }
            fn ieee_max(self, o: Self) -> Self {
                $max(self, o)
            }
            fn ieee_min(self, o: Self) -> Self {
                $min(self, o)
            }
            fn lowest() -> Self {
                <$t>::NEG_INFINITY
            }
            fn highest() -> Self {
                <$t>::INFINITY
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
        }
    };
}
float_elem!(f32, kfuse_math::maximum_f32, kfuse_math::minimum_f32);
float_elem!(f64, kfuse_math::maximum_f64, kfuse_math::minimum_f64);

macro_rules! int_elem {
    ($t:ty) => {
        impl Elem for $t {
            const IS_FLOAT: bool = false;
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            fn from_i64(x: i64) -> Self {
                x as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn to_i64(self) -> i64 {
                self as i64
            }
            fn to_bool(self) -> bool {
                self != 0
            }
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            fn ieee_max(self, o: Self) -> Self {
                Ord::max(self, o)
            }
            fn ieee_min(self, o: Self) -> Self {
                Ord::min(self, o)
            }
            fn lowest() -> Self {
                <$t>::MIN
            }
            fn highest() -> Self {
                <$t>::MAX
            }
            fn is_nan(self) -> bool {
                false
            }
        }
    };
}
int_elem!(i32);
int_elem!(i64);
int_elem!(u8);

impl Elem for bool {
    const IS_FLOAT: bool = false;
    fn from_f64(x: f64) -> Self {
        x != 0.0
    }
    fn from_i64(x: i64) -> Self {
        x != 0
    }
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
    fn to_i64(self) -> i64 {
        self as i64
    }
    fn to_bool(self) -> bool {
        self
    }
    fn add(self, o: Self) -> Self {
        self | o
    }
    fn mul(self, o: Self) -> Self {
        self & o
    }
    fn ieee_max(self, o: Self) -> Self {
        self | o
    }
    fn ieee_min(self, o: Self) -> Self {
        self & o
    }
    fn lowest() -> Self {
        false
    }
    fn highest() -> Self {
        true
    }
    fn is_nan(self) -> bool {
        false
    }
}

/// Widens `f16`/`bf16` storage to `f32`; other arrays are returned as they are.
pub fn widen(array: &Array) -> std::borrow::Cow<'_, Array> {
    let data = match array.storage() {
        Storage::F16(v) => Storage::F32(v.iter().map(|x| x.to_f32()).collect()),
        Storage::BF16(v) => Storage::F32(v.iter().map(|x| x.to_f32()).collect()),
        _ => return std::borrow::Cow::Borrowed(array),
    };
    std::borrow::Cow::Owned(Array::new(array.shape().clone(), data).expect("same length"))
}

/// Rounds an `f32` array back to `f16`/`bf16` when `dtype` is one of them.
pub fn narrow(array: Array, dtype: DType) -> Array {
    let shape = array.shape().clone();
    let data = match (array.into_storage(), dtype) {
        (Storage::F32(v), DType::F16) => {
            Storage::F16(v.into_iter().map(kfuse_ir::f16::from_f32).collect())
        }
        (Storage::F32(v), DType::BF16) => {
            Storage::BF16(v.into_iter().map(kfuse_ir::bf16::from_f32).collect())
        }
        (other, _) => other,
    };
    Array::new(shape, data).expect("same length")
}

/// Runs `$body` with `$v` bound to the elements of a compute-typed storage (`f16`/`bf16` must be
/// widened first), and `$T` to their type.
macro_rules! with_compute {
    ($storage:expr, $v:ident: $T:ident => $body:expr) => {
        match $storage {
            kfuse_ir::Storage::F32($v) => {
                type $T = f32;
                $body
            }
            kfuse_ir::Storage::F64($v) => {
                type $T = f64;
                $body
            }
            kfuse_ir::Storage::I32($v) => {
                type $T = i32;
                $body
            }
            kfuse_ir::Storage::I64($v) => {
                type $T = i64;
                $body
            }
            kfuse_ir::Storage::U8($v) => {
                type $T = u8;
                $body
            }
            kfuse_ir::Storage::Bool($v) => {
                type $T = bool;
                $body
            }
            kfuse_ir::Storage::F16(_) | kfuse_ir::Storage::BF16(_) => {
                unreachable!("16-bit floats are widened before computing")
            }
        }
    };
}
pub(crate) use with_compute;
