//! Fallible allocation of tensor buffers: a byte count checked for overflow, compared with the
//! memory the machine has available, then reserved without aborting.
//!
//! Sizes come from programs, so a buffer can be larger than any machine holds. Rust's infallible
//! allocation aborts the process then; kfuse instead reports which tensor needed how many bytes.
//! This crate does no I/O, so the figure of available memory comes from the caller
//! (`kfuse_runtime::available_memory` reads it from the operating system).

use crate::TensorType;

/// How many more bytes buffers may take: a figure, or none, where only the allocator refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryLimit {
    available: Option<usize>,
}

impl MemoryLimit {
    /// No figure: a buffer is refused only when its size overflows or the allocator fails.
    pub const NONE: MemoryLimit = MemoryLimit { available: None };

    /// At most `bytes` more bytes.
    pub fn available(bytes: usize) -> MemoryLimit {
        MemoryLimit {
            available: Some(bytes),
        }
    }

    /// The figure, if there is one.
    pub fn available_bytes(self) -> Option<usize> {
        self.available
    }

    /// What is left once `used` more bytes are taken.
    pub fn after(self, used: usize) -> MemoryLimit {
        MemoryLimit {
            available: self.available.map(|a| a.saturating_sub(used)),
        }
    }

    /// The bytes of a dense buffer of type `ty`, if they fit in `usize` and under this limit.
    pub fn check(self, ty: &TensorType) -> Result<usize, AllocError> {
        let bytes = ty
            .checked_size_bytes()
            .ok_or_else(|| AllocError::Overflow { ty: ty.clone() })?;
        match self.available {
            Some(available) if bytes > available => Err(AllocError::OverLimit {
                ty: ty.clone(),
                bytes,
                available,
            }),
            _ => Ok(bytes),
        }
    }

    /// An empty vector with room for exactly the elements of `ty`: checked against this limit,
    /// then reserved with `try_reserve_exact`, so that an allocator's refusal is an error too.
    pub fn reserve<T>(self, ty: &TensorType) -> Result<Vec<T>, AllocError> {
        let bytes = self.check(ty)?;
        let mut v = Vec::new();
        v.try_reserve_exact(ty.shape.n_elems())
            .map_err(|_| AllocError::Refused {
                ty: ty.clone(),
                bytes,
            })?;
        Ok(v)
    }
}

/// A buffer that could not be allocated, with its type and size.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// The byte count does not fit in `usize`.
    #[error("{ty} needs more bytes than this machine can address")]
    Overflow { ty: TensorType },
    /// More bytes than the limit leaves.
    #[error("{ty} needs {bytes} bytes, more than the {} this machine has available", readable_bytes(*.available))]
    OverLimit {
        ty: TensorType,
        bytes: usize,
        available: usize,
    },
    /// The allocator refused the request.
    #[error("{ty} needs {bytes} bytes, more than this machine could allocate")]
    Refused { ty: TensorType, bytes: usize },
}

/// `23.4 GiB`, `512.0 MiB`, `100 bytes`: a size as people read it.
pub fn readable_bytes(bytes: usize) -> String {
    const UNITS: [(&str, u32); 3] = [("GiB", 30), ("MiB", 20), ("KiB", 10)];
    for (unit, shift) in UNITS {
        if bytes >= 1 << shift {
            return format!("{:.1} {unit}", bytes as f64 / (1u64 << shift) as f64);
        }
    }
    format!("{bytes} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    #[test]
    fn a_buffer_over_the_limit_is_refused_with_its_type_and_size() {
        let ty = TensorType::new(DType::F32, [1000]);
        let limit = MemoryLimit::available(4000);
        assert_eq!(limit.check(&ty), Ok(4000));
        let err = limit.after(1).check(&ty).unwrap_err();
        assert_eq!(
            err.to_string(),
            "f32[1000] needs 4000 bytes, more than the 3.9 KiB this machine has available"
        );
        assert!(limit.after(1).reserve::<f32>(&ty).is_err());
        assert_eq!(limit.reserve::<f32>(&ty).unwrap().capacity(), 1000);
    }

    #[test]
    fn a_byte_count_that_overflows_is_refused() {
        let ty = TensorType::new(DType::F64, [usize::MAX / 4]);
        assert_eq!(
            MemoryLimit::NONE.check(&ty),
            Err(AllocError::Overflow { ty: ty.clone() })
        );
    }

    #[test]
    fn the_allocator_refusing_is_an_error_not_an_abort() {
        // Half the address space: representable, and more than any allocator grants.
        let ty = TensorType::new(DType::U8, [usize::MAX / 2]);
        let err = MemoryLimit::NONE.reserve::<u8>(&ty).unwrap_err();
        assert!(matches!(err, AllocError::Refused { .. }), "{err}");
    }

    #[test]
    fn sizes_read_in_the_largest_whole_unit() {
        assert_eq!(readable_bytes(100), "100 bytes");
        assert_eq!(readable_bytes(3 << 20), "3.0 MiB");
        assert_eq!(readable_bytes(23 << 30 | 1 << 29), "23.5 GiB");
    }
}
