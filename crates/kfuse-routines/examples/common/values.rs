//! The examples' operands: fixed, varied values, the same in every example and run. Each
//! example uses what it needs of them.
#![allow(dead_code)]

use kfuse_ir::Storage;

/// `len` activations in [-0.5, 0.5).
pub fn activations(len: usize) -> Storage {
    Storage::F32(
        (0..len)
            .map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5)
            .collect(),
    )
}

/// `len` weights in [-0.08, 0.08].
pub fn weights(len: usize) -> Storage {
    Storage::F32(
        (0..len)
            .map(|i| ((i * 31) % 17) as f32 * 0.01 - 0.08)
            .collect(),
    )
}
