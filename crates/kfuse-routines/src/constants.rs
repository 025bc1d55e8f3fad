//! Weights that stay the same from call to call: a compiled program's constants, registered by
//! the runner that holds them for as long as it does. The direct convolution kernels pack their
//! weights into microkernel blocks at every call; for registered weights the packed copy is
//! kept and reused instead: on small images the packing is a large share of a call
//! (MobileNetV2's 7×7 block at batch 1, `kfuse bench inverted7`: `docs/structured-ops.md`,
//! "Measurements behind design choices").
//!
//! A registration names memory that must neither change nor be freed while it lives (the
//! runner borrows the program whose constants it registers). Dropping it forgets the ranges
//! and the packed copies made from them. The copies cost the memory of the weights they pack
//! (rounded up to blocks of 8 output channels), for as long as the runner lives.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kfuse_ir::Storage;

/// What a packed copy is of: the weights' address and length, and the packing (its kind and
/// parameters).
type Key = (usize, usize, [usize; 5]);

#[derive(Default)]
struct Registry {
    /// Registered byte ranges, `[start, end)`, with how many registrations hold each.
    ranges: HashMap<(usize, usize), usize>,
    packed: HashMap<Key, Arc<Vec<f32>>>,
}

fn registry() -> &'static Mutex<Registry> {
    static REGISTRY: std::sync::OnceLock<Mutex<Registry>> = std::sync::OnceLock::new();
    REGISTRY.get_or_init(Mutex::default)
}

/// Storages registered as constant until this is dropped.
pub struct Registration {
    ranges: Vec<(usize, usize)>,
}

/// Registers the f32 `storages` as constant: they must stay unchanged and alive for as long
/// as the returned registration lives.
pub fn register<'s>(storages: impl IntoIterator<Item = &'s Storage>) -> Registration {
    let ranges: Vec<(usize, usize)> = storages
        .into_iter()
        .filter_map(|s| match s {
            Storage::F32(v) if !v.is_empty() => {
                let start = v.as_ptr() as usize;
                Some((start, start + std::mem::size_of_val(v.as_slice())))
            }
            _ => None,
        })
        .collect();
    let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    for r in &ranges {
        *reg.ranges.entry(*r).or_insert(0) += 1;
    }
    Registration { ranges }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        for r in &self.ranges {
            if let Some(count) = reg.ranges.get_mut(r) {
                *count -= 1;
                if *count == 0 {
                    reg.ranges.remove(r);
                    let (start, end) = *r;
                    reg.packed
                        .retain(|&(at, _, _), _| !(start..end).contains(&at));
                }
            }
        }
    }
}

/// `check()`, a property of `weights`, kept for the next call where `weights` lie in a
/// registered constant, else checked afresh. `property` names it; properties are kept beside
/// the packings, under kinds of their own.
pub fn holds(weights: &[f32], property: usize, check: impl FnOnce() -> bool) -> bool {
    let kept = packed(weights, [PROPERTY + property, 0, 0, 0, 0], || {
        vec![if check() { 1.0 } else { 0.0 }]
    });
    kept[0] == 1.0
}

/// [`holds`]'s property: every weight is finite (the runner's check of padded convolutions).
pub const FINITE: usize = 0;
/// [`holds`]'s property: every Winograd-transformed weight is finite.
pub const FINITE_TRANSFORMED: usize = 1;

/// Where the kinds of [`holds`]'s properties start (packings' kinds are small).
const PROPERTY: usize = 1 << 20;

/// `make()`, a packing of `weights` of the given kind and parameters, kept for the next call
/// where `weights` lie in a registered constant, else made afresh.
pub(crate) fn packed(
    weights: &[f32],
    packing: [usize; 5],
    make: impl FnOnce() -> Vec<f32>,
) -> Arc<Vec<f32>> {
    let start = weights.as_ptr() as usize;
    let end = start + std::mem::size_of_val(weights);
    let key = (start, weights.len(), packing);
    {
        let reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        if reg.ranges.is_empty() {
            drop(reg);
            return Arc::new(make());
        }
        if let Some(p) = reg.packed.get(&key) {
            return Arc::clone(p);
        }
        let constant = reg.ranges.keys().any(|&(s, e)| s <= start && end <= e);
        if !constant {
            drop(reg);
            return Arc::new(make());
        }
    }
    // Packed outside the lock; a second thread packing the same weights meanwhile keeps its
    // own copy, the same.
    let made = Arc::new(make());
    let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    // Still registered (a registration may have ended meanwhile)?
    if reg.ranges.keys().any(|&(s, e)| s <= start && end <= e) {
        reg.packed.insert(key, Arc::clone(&made));
    }
    made
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registered constant's packing is made once and reused; other weights, or the same
    /// once the registration is dropped, are packed at every call.
    #[test]
    fn registered_weights_are_packed_once() {
        let constant = Storage::F32(vec![1.0, 2.0, 3.0]);
        let other = vec![4.0f32, 5.0];
        let made = std::cell::Cell::new(0);
        let pack = |w: &[f32]| {
            packed(w, [7, 0, 0, 0, 0], || {
                made.set(made.get() + 1);
                w.to_vec()
            })
        };
        let Storage::F32(c) = &constant else {
            unreachable!()
        };
        // Another program's constants, registered throughout.
        let elsewhere = Storage::F32(vec![0.0; 4]);
        let _kept = register([&elsewhere]);
        {
            let _registration = register([&constant]);
            assert_eq!(*pack(c), vec![1.0, 2.0, 3.0]);
            assert_eq!(*pack(c), vec![1.0, 2.0, 3.0]);
            assert_eq!(made.get(), 1, "packed once while registered");
            // A part of a registered constant is cached under its own address and length.
            assert_eq!(*pack(&c[1..]), vec![2.0, 3.0]);
            assert_eq!(made.get(), 2);
            pack(&other);
            pack(&other);
            assert_eq!(made.get(), 4, "unregistered weights are packed every time");
        }
        pack(c);
        assert_eq!(made.get(), 5, "the copy went with the registration");
    }
}
