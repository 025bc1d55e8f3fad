//! Element types.

use std::fmt;

/// The element type of a tensor.
///
/// `F16` and `BF16` are storage types: every op computes them in `f32` and rounds the result back
/// to the storage type (round to nearest even).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    I32,
    I64,
    U8,
    Bool,
}

impl DType {
    /// Every dtype, in a fixed order (used by generators and docs).
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::Bool,
    ];

    /// The name used in the text form (`f32`, `bf16`, `bool`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }

    /// Parses a dtype name as printed by [`DType::name`].
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Bytes per element in memory.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// Floating-point types, storage-only ones included.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// Signed or unsigned integer types (not `bool`).
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64 | DType::U8)
    }

    /// Types with arithmetic: floats and integers, not `bool`.
    pub fn is_numeric(self) -> bool {
        self.is_float() || self.is_int()
    }

    /// The type arithmetic on this dtype is carried out in: `f32` for the 16-bit floats, the type
    /// itself otherwise.
    pub fn compute_type(self) -> DType {
        match self {
            DType::F16 | DType::BF16 => DType::F32,
            other => other,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
