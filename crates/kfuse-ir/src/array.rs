//! Host arrays: constant payloads in the IR and the values the interpreter computes.

use std::sync::OnceLock;

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

    /// `n` copies of `value`'s first element.
    fn repeated(value: &Storage, n: usize) -> Storage {
        with_storage!(value, v => Storage::from_splat(v[0], n))
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

/// A row-major array with a static shape: every element stored, or one value standing for all
/// of them (a splat, as `constant() value=0.5 : f32[4, 8]` writes it).
///
/// A splat keeps its one value until [`Array::materialize`] stores every element, or a caller
/// asks for them as a slice ([`Array::storage`]), which stores them once, beside it. Shape,
/// dtype, single elements and equality never need them, so parsing, printing and verifying a
/// program cost the same for a splat of any size.
///
/// Equality compares element bits, so two arrays holding the same NaNs are equal, and a splat
/// equals the dense array with the same elements.
#[derive(Clone, Debug)]
pub struct Array {
    shape: Shape,
    data: Data,
}

#[derive(Debug)]
enum Data {
    Dense(Storage),
    /// Every element equals the one element of `value`; `dense` holds them all once a caller
    /// has needed them.
    Splat {
        value: Storage,
        dense: OnceLock<Storage>,
    },
}

impl Clone for Data {
    /// A copy of a splat is a splat: the elements stored for the original stay with it.
    fn clone(&self) -> Data {
        match self {
            Data::Dense(storage) => Data::Dense(storage.clone()),
            Data::Splat { value, .. } => Data::Splat {
                value: value.clone(),
                dense: OnceLock::new(),
            },
        }
    }
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
        Ok(Array {
            shape,
            data: Data::Dense(data),
        })
    }

    /// An array of shape `shape` whose every element is `value`, held as that one value. Fails
    /// only when the shape's size in bytes overflows `usize`.
    pub fn splat<T: Element>(shape: Shape, value: T) -> Result<Array, AllocError> {
        let ty = TensorType {
            dtype: T::DTYPE,
            shape,
        };
        if ty.checked_size_bytes().is_none() {
            return Err(AllocError::Overflow { ty });
        }
        Ok(Array {
            shape: ty.shape,
            data: Data::Splat {
                value: T::wrap(vec![value]),
                dense: OnceLock::new(),
            },
        })
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
            data: Data::Dense(T::wrap(vec![value])),
        }
    }

    /// An array of zeros.
    pub fn zeros(ty: &TensorType) -> Array {
        Array {
            shape: ty.shape.clone(),
            data: Data::Dense(Storage::zeros(ty.dtype, ty.shape.n_elems())),
        }
    }

    /// An array of zeros, allocated fallibly under `limit`.
    pub fn try_zeros(ty: &TensorType, limit: MemoryLimit) -> Result<Array, AllocError> {
        Ok(Array {
            shape: ty.shape.clone(),
            data: Data::Dense(Storage::try_zeros(ty, limit)?),
        })
    }

    pub fn dtype(&self) -> DType {
        match &self.data {
            Data::Dense(storage) => storage.dtype(),
            Data::Splat { value, .. } => value.dtype(),
        }
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
        match &self.data {
            Data::Dense(storage) => storage.len(),
            Data::Splat { .. } => self.shape.n_elems(),
        }
    }

    /// The elements, stored. A splat stores them on the first call, with an allocation that
    /// aborts the process if memory runs out: where the size comes from a program, call
    /// [`Array::materialize`] first.
    pub fn storage(&self) -> &Storage {
        match &self.data {
            Data::Dense(storage) => storage,
            Data::Splat { value, dense } => {
                dense.get_or_init(|| Storage::repeated(value, self.shape.n_elems()))
            }
        }
    }

    /// Stores every element of a splat, allocated fallibly under `limit`, and returns the
    /// bytes that took; a dense array stays as it is and takes none. Engines call it before
    /// they read a constant, so that a splat too large for the machine is an error.
    pub fn materialize(&mut self, limit: MemoryLimit) -> Result<usize, AllocError> {
        let ty = self.ty();
        let Data::Splat { value, dense } = &mut self.data else {
            return Ok(0);
        };
        let storage = match dense.take() {
            Some(storage) => storage,
            None => Storage::try_filled(value, &ty, limit)?,
        };
        self.data = Data::Dense(storage);
        Ok(ty.size_bytes())
    }

    /// The elements, stored (a splat expands, as in [`Array::storage`]).
    pub fn into_storage(self) -> Storage {
        match self.data {
            Data::Dense(storage) => storage,
            Data::Splat { value, dense } => dense
                .into_inner()
                .unwrap_or_else(|| Storage::repeated(&value, self.shape.n_elems())),
        }
    }

    /// The elements as a slice, if `T` is this array's element type (a splat expands, as in
    /// [`Array::storage`]).
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        if T::DTYPE != self.dtype() {
            return None;
        }
        T::slice(self.storage())
    }

    /// The same elements under another shape with the same element count. A splat stays one.
    pub fn reshaped(self, shape: Shape) -> Result<Array, ArrayShapeError> {
        match self.data {
            Data::Dense(storage) => Array::new(shape, storage),
            Data::Splat { .. } if shape.checked_n_elems() != Some(self.n_elems()) => {
                Err(ArrayShapeError {
                    n_values: self.n_elems(),
                    n_elems: shape.n_elems(),
                    shape,
                })
            }
            Data::Splat { value, dense } => Ok(Array {
                shape,
                data: Data::Splat { value, dense },
            }),
        }
    }

    /// The storage holding element `i`, and its index there.
    fn element(&self, i: usize) -> (&Storage, usize) {
        match &self.data {
            Data::Dense(storage) => (storage, i),
            Data::Splat { value, .. } => {
                assert!(
                    i < self.n_elems(),
                    "element {i} of an array of {} elements",
                    self.n_elems()
                );
                (value, 0)
            }
        }
    }

    /// Element `i` widened to `f64` (integers exactly up to 2^53, bool as 0 or 1).
    pub fn get_f64(&self, i: usize) -> f64 {
        let (storage, i) = self.element(i);
        match storage {
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
        let (storage, i) = self.element(i);
        match storage {
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
        match &self.data {
            Data::Splat { .. } => true,
            Data::Dense(_) => (1..self.n_elems()).all(|i| self.get_bits(i) == self.get_bits(0)),
        }
    }
}

impl PartialEq for Array {
    fn eq(&self, other: &Array) -> bool {
        if self.shape != other.shape || self.dtype() != other.dtype() {
            return false;
        }
        match (&self.data, &other.data) {
            // Two splats: one comparison, whatever their size.
            (Data::Splat { .. }, Data::Splat { .. }) => {
                self.n_elems() == 0 || self.get_bits(0) == other.get_bits(0)
            }
            _ => (0..self.n_elems()).all(|i| self.get_bits(i) == other.get_bits(i)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_splat_keeps_one_value_until_its_elements_are_needed() {
        let shape = Shape::new(vec![1 << 20, 1 << 20]);
        let a = Array::splat(shape.clone(), 2.5f32).unwrap();
        assert_eq!(a.n_elems(), 1 << 40);
        assert_eq!(a.get_f64(12345), 2.5);
        assert!(a.is_splat());
        // A terabyte of elements: refused under a limit, not allocated, and still a splat.
        let limit = MemoryLimit::available(1 << 30);
        let mut stored = a.clone();
        let err = stored.materialize(limit).unwrap_err();
        assert_eq!(
            err.to_string(),
            "f32[1048576, 1048576] needs 4398046511104 bytes, more than the 1.0 GiB this \
             machine has available"
        );
        assert!(stored.is_splat() && stored == a);
        let copy = a.clone().reshaped(Shape::new(vec![1 << 40])).unwrap();
        assert!(copy.is_splat());
        assert!(a == Array::splat(shape, 2.5f32).unwrap());
    }

    #[test]
    fn a_splat_equals_the_dense_array_of_its_elements() {
        let splat = Array::splat(Shape::new(vec![2, 3]), f32::NAN).unwrap();
        let dense = Array::from_vec(vec![2, 3], vec![f32::NAN; 6]).unwrap();
        assert!(splat == dense && dense == splat);
        assert_eq!(splat.as_slice::<f32>().unwrap().len(), 6);
        assert_eq!(splat.as_slice::<f64>(), None);
        let mut stored = splat.clone();
        assert_eq!(stored.materialize(MemoryLimit::NONE), Ok(24));
        assert!(stored == dense);
        assert_eq!(stored.materialize(MemoryLimit::NONE), Ok(0));
        assert_eq!(splat.clone().into_storage().len(), 6);
        // Elements stored by `as_slice` are kept, not made again.
        let mut read = splat.clone();
        assert_eq!(read.as_slice::<f32>().unwrap().len(), 6);
        assert_eq!(read.materialize(MemoryLimit::available(0)), Ok(24));
        let other = Array::from_vec(vec![2, 3], vec![f32::NAN, 1.0, 0.0, 0.0, 0.0, 0.0]).unwrap();
        assert!(splat != other && other != splat);
        let bits = Array::splat(Shape::new(vec![2, 3]), -0.0f32).unwrap();
        assert!(bits != Array::splat(Shape::new(vec![2, 3]), 0.0f32).unwrap());
    }

    #[test]
    fn a_splat_whose_size_overflows_is_refused() {
        let shape = Shape::new(vec![1 << 62, 4]);
        assert!(matches!(
            Array::splat(shape, 1u8),
            Err(AllocError::Overflow { .. })
        ));
    }

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
