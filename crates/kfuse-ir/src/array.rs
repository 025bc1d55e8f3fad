//! Dense host arrays: constant payloads in the IR and the values the interpreter computes.

use half::{bf16, f16};

use crate::{AllocError, DType, MemoryLimit, Shape, TensorType};

/// Typed, row-major element storage.
#[derive(Clone, Debug)]
pub enum Storage {
    F32(Vec<f32>),
    F64(Vec<f64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
    Bool(Vec<bool>),
}

/// Applies `$body` to the vector inside a [`Storage`], whatever its element type.
#[macro_export]
macro_rules! with_storage {
    ($storage:expr, $v:ident => $body:expr) => {
        match $storage {
            $crate::Storage::F32($v) => $body,
            $crate::Storage::F64($v) => $body,
            $crate::Storage::F16($v) => $body,
            $crate::Storage::BF16($v) => $body,
            $crate::Storage::I32($v) => $body,
            $crate::Storage::I64($v) => $body,
            $crate::Storage::U8($v) => $body,
            $crate::Storage::Bool($v) => $body,
        }
    };
}

impl Storage {
    pub fn dtype(&self) -> DType {
        match self {
            Storage::F32(_) => DType::F32,
            Storage::F64(_) => DType::F64,
            Storage::F16(_) => DType::F16,
            Storage::BF16(_) => DType::BF16,
            Storage::I32(_) => DType::I32,
            Storage::I64(_) => DType::I64,
            Storage::U8(_) => DType::U8,
            Storage::Bool(_) => DType::Bool,
        }
    }

    pub fn len(&self) -> usize {
        with_storage!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `n` copies of `x`.
    pub fn from_splat<T: Element>(x: T, n: usize) -> Storage {
        T::wrap(vec![x; n])
    }

    /// Every element of `ty` a copy of `value`'s first element, allocated fallibly under
    /// `limit`.
    fn try_filled(
        value: &Storage,
        ty: &TensorType,
        limit: MemoryLimit,
    ) -> Result<Storage, AllocError> {
        fn filled<T: Element>(
            x: T,
            ty: &TensorType,
            limit: MemoryLimit,
        ) -> Result<Storage, AllocError> {
            let mut v = limit.reserve::<T>(ty)?;
            v.resize(ty.shape.n_elems(), x);
            Ok(T::wrap(v))
        }
        with_storage!(value, v => filled(v[0], ty, limit))
    }

    /// The zero elements of `ty` (`false` for bool), allocated fallibly under `limit`.
    pub fn try_zeros(ty: &TensorType, limit: MemoryLimit) -> Result<Storage, AllocError> {
        Storage::try_filled(&Storage::zeros(ty.dtype, 1), ty, limit)
    }

    /// `n` zero elements (`false` for bool).
    pub fn zeros(dtype: DType, n: usize) -> Storage {
        match dtype {
            DType::F32 => Storage::F32(vec![0.0; n]),
            DType::F64 => Storage::F64(vec![0.0; n]),
            DType::F16 => Storage::F16(vec![f16::ZERO; n]),
            DType::BF16 => Storage::BF16(vec![bf16::ZERO; n]),
            DType::I32 => Storage::I32(vec![0; n]),
            DType::I64 => Storage::I64(vec![0; n]),
            DType::U8 => Storage::U8(vec![0; n]),
            DType::Bool => Storage::Bool(vec![false; n]),
        }
    }
}

/// A Rust element type that maps to a kfuse [`DType`].
pub trait Element: Copy + Send + Sync + 'static {
    const DTYPE: DType;
    fn wrap(values: Vec<Self>) -> Storage;
    fn slice(storage: &Storage) -> Option<&[Self]>;
}

macro_rules! element {
    ($t:ty, $variant:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn wrap(values: Vec<Self>) -> Storage {
                Storage::$variant(values)
            }
            fn slice(storage: &Storage) -> Option<&[Self]> {
                match storage {
                    Storage::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
element!(f32, F32);
element!(f64, F64);
element!(f16, F16);
element!(bf16, BF16);
element!(i32, I32);
element!(i64, I64);
element!(u8, U8);
element!(bool, Bool);

/// A dense row-major array with a static shape.
///
/// Equality compares element bits, so two arrays holding the same NaNs are equal.
#[derive(Clone, Debug)]
pub struct Array {
    shape: Shape,
    data: Storage,
}

/// The element count of an array does not match its shape.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{n_values} values do not fill shape {shape} ({n_elems} elements)")]
pub struct ArrayShapeError {
    pub n_values: usize,
    pub shape: Shape,
    pub n_elems: usize,
}

impl Array {
    /// An array from storage and a shape; the lengths must agree.
    pub fn new(shape: Shape, data: Storage) -> Result<Array, ArrayShapeError> {
        if shape.n_elems() != data.len() {
            return Err(ArrayShapeError {
                n_values: data.len(),
                n_elems: shape.n_elems(),
                shape,
            });
        }
        Ok(Array { shape, data })
    }

    /// An array from a vector of elements and a shape.
    pub fn from_vec<T: Element>(
        shape: impl Into<Vec<usize>>,
        values: Vec<T>,
    ) -> Result<Array, ArrayShapeError> {
        Array::new(Shape::new(shape), T::wrap(values))
    }

    /// A rank-0 array.
    pub fn scalar<T: Element>(value: T) -> Array {
        Array {
            shape: Shape::scalar(),
            data: T::wrap(vec![value]),
        }
    }

    /// An array of zeros.
    pub fn zeros(ty: &TensorType) -> Array {
        Array {
            shape: ty.shape.clone(),
            data: Storage::zeros(ty.dtype, ty.shape.n_elems()),
        }
    }

    /// An array of zeros, allocated fallibly under `limit`.
    pub fn try_zeros(ty: &TensorType, limit: MemoryLimit) -> Result<Array, AllocError> {
        Ok(Array {
            shape: ty.shape.clone(),
            data: Storage::try_zeros(ty, limit)?,
        })
    }

    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    pub fn ty(&self) -> TensorType {
        TensorType {
            dtype: self.dtype(),
            shape: self.shape.clone(),
        }
    }

    pub fn n_elems(&self) -> usize {
        self.data.len()
    }

    pub fn storage(&self) -> &Storage {
        &self.data
    }

    pub fn into_storage(self) -> Storage {
        self.data
    }

    /// The elements as a slice, if `T` is this array's element type.
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        T::slice(&self.data)
    }

    /// The same elements under another shape with the same element count.
    pub fn reshaped(self, shape: Shape) -> Result<Array, ArrayShapeError> {
        Array::new(shape, self.data)
    }

    /// Element `i` widened to `f64` (integers exactly up to 2^53, bool as 0 or 1).
    pub fn get_f64(&self, i: usize) -> f64 {
        match &self.data {
            Storage::F32(v) => v[i] as f64,
            Storage::F64(v) => v[i],
            Storage::F16(v) => v[i].to_f64(),
            Storage::BF16(v) => v[i].to_f64(),
            Storage::I32(v) => v[i] as f64,
            Storage::I64(v) => v[i] as f64,
            Storage::U8(v) => v[i] as f64,
            Storage::Bool(v) => v[i] as u8 as f64,
        }
    }

    /// Element `i` as raw bits, zero-extended; the basis of bitwise equality.
    pub fn get_bits(&self, i: usize) -> u64 {
        match &self.data {
            Storage::F32(v) => v[i].to_bits() as u64,
            Storage::F64(v) => v[i].to_bits(),
            Storage::F16(v) => v[i].to_bits() as u64,
            Storage::BF16(v) => v[i].to_bits() as u64,
            Storage::I32(v) => v[i] as u32 as u64,
            Storage::I64(v) => v[i] as u64,
            Storage::U8(v) => v[i] as u64,
            Storage::Bool(v) => v[i] as u64,
        }
    }

    /// Whether every element is bitwise equal to the first (true for empty arrays).
    pub fn is_splat(&self) -> bool {
        (1..self.n_elems()).all(|i| self.get_bits(i) == self.get_bits(0))
    }
}

impl PartialEq for Array {
    fn eq(&self, other: &Array) -> bool {
        self.shape == other.shape
            && self.dtype() == other.dtype()
            && (0..self.n_elems()).all(|i| self.get_bits(i) == other.get_bits(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_are_allocated_fallibly() {
        let ty = TensorType::new(DType::I64, [3]);
        let zeros = Array::try_zeros(&ty, MemoryLimit::available(24)).unwrap();
        assert_eq!(zeros.as_slice::<i64>(), Some(&[0i64, 0, 0][..]));
        assert!(Array::try_zeros(&ty, MemoryLimit::available(23)).is_err());
        let huge = TensorType::new(DType::F32, [1usize << 40]);
        assert!(matches!(
            Storage::try_zeros(&huge, MemoryLimit::available(1 << 30)),
            Err(AllocError::OverLimit { .. })
        ));
    }
}
