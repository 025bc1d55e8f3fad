//! Flushing subnormal results to zero, where fast numerics allow it.
//!
//! On Intel cores an arithmetic instruction whose result is subnormal, or that reads a
//! subnormal operand, takes a microcode assist of around a hundred cycles unless the thread's
//! MXCSR says to flush them (FTZ for results, DAZ for operands). The transcendental
//! activations give subnormal results for strongly negative inputs: the sigmoid below about
//! -87, SiLU likewise, GELU's erf form below about -13 and its tanh form between about -11 and
//! -10 (`x * e^(-2u)` underflows). A GEMM whose left operand then holds a few subnormals in
//! every row runs several times slower, and so does the activation itself. W5b's GELU MLP is
//! such a case: 0.8% of its hidden values are subnormal on W5b's random inputs, and on Intel
//! cores its two layers run at more than twice their GEMMs' time without the flush
//! (`docs/benchmarks.md`, "W5a and W5b: dense layers"). AMD's Zen 5 takes no such assist.
//!
//! `FlushSubnormalResults` sets FTZ on the calling thread for as long as it lives. Fast
//! numerics hold one while a structured kernel's epilogue applies one of those activations
//! (`dense::slice_form`), so that their subnormal results come out as zeros of the same sign:
//! an error below `f32::MIN_POSITIVE` (about 1.2e-38), where the next GEMM would otherwise read
//! subnormals. Nothing else flushes: the GEMMs and convolutions, the other epilogue steps and
//! strict numerics keep subnormal operands and results exactly, and DAZ stays off, which would
//! read a subnormal operand as zero (turning `inf * subnormal` into NaN). TensorFlow, by
//! contrast, sets FTZ and DAZ around every op; `torch.set_flush_denormal(True)` and
//! onnxruntime's `session.set_denormal_as_zero` do on request. Only x86-64 has the switch here:
//! elsewhere the guard does nothing.
//!
//! Rust's compiler assumes the default mode, so an expression it folds at compile time keeps
//! its subnormals where the same expression at run time under the guard flushes them. The
//! activations do not depend on either: both are within the bound above.

/// MXCSR's flush-to-zero bit: subnormal results are written as zero of the same sign.
const FTZ: u32 = 1 << 15;

/// The calling thread's floating-point control word (MXCSR on x86-64, 0 elsewhere).
fn control() -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        let mut word = 0u32;
        // SAFETY: `stmxcsr` stores the 4-byte control word to the address given, a local.
        unsafe {
            std::arch::asm!(
                "stmxcsr [{}]",
                in(reg) &mut word,
                options(nostack, preserves_flags)
            )
        };
        word
    }
    #[cfg(not(target_arch = "x86_64"))]
    0
}

/// Sets the calling thread's floating-point control word to one [`control`] returned, with
/// at most FTZ added.
fn set_control(word: u32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `ldmxcsr` loads the 4-byte control word from the address given, a local. Every
    // word set here was read from this thread's MXCSR, with at most FTZ added, so no reserved
    // bit is set (which would fault) and no exception is unmasked.
    unsafe {
        std::arch::asm!(
            "ldmxcsr [{}]",
            in(reg) &word,
            options(nostack, readonly, preserves_flags)
        )
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = word;
}

/// Whether the calling thread flushes subnormal results to zero.
pub fn flushing() -> bool {
    control() & FTZ != 0
}

/// Subnormal results are flushed to zero on the calling thread until this is dropped; the
/// previous mode comes back then. Guards nest. A guard stays on its thread (it is not `Send`),
/// since it restores the mode of the thread that made it.
#[must_use = "the mode lasts only as long as the guard"]
pub(crate) struct FlushSubnormalResults {
    saved: u32,
    _thread: std::marker::PhantomData<*const ()>,
}

impl FlushSubnormalResults {
    pub(crate) fn new() -> FlushSubnormalResults {
        // Elsewhere `control` is 0 and `set_control` does nothing.
        let saved = control();
        if saved & FTZ == 0 {
            set_control(saved | FTZ);
        }
        FlushSubnormalResults {
            saved,
            _thread: std::marker::PhantomData,
        }
    }
}

impl Drop for FlushSubnormalResults {
    fn drop(&mut self) {
        if self.saved & FTZ == 0 {
            set_control(self.saved);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `x * y` computed at run time, out of the compiler's sight.
    fn product(x: f32, y: f32) -> f32 {
        std::hint::black_box(x) * std::hint::black_box(y)
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_guard_flushes_subnormal_results_and_restores_the_mode() {
        let tiny = f32::MIN_POSITIVE / 8.0;
        assert!(tiny > 0.0 && !tiny.is_normal());
        assert!(!flushing());
        assert_eq!(product(f32::MIN_POSITIVE, 0.125), tiny);
        {
            let _outer = FlushSubnormalResults::new();
            assert!(flushing());
            {
                let _inner = FlushSubnormalResults::new();
                // A subnormal result is written as zero, keeping its sign.
                assert_eq!(product(f32::MIN_POSITIVE, 0.125).to_bits(), 0);
                assert_eq!(
                    product(-f32::MIN_POSITIVE, 0.125).to_bits(),
                    (-0.0f32).to_bits()
                );
                // A subnormal operand is read as it is (no DAZ): infinity times it stays
                // infinite, and a normal result from it is exact.
                assert_eq!(product(tiny, f32::INFINITY), f32::INFINITY);
                assert_eq!(product(tiny, 8.0), f32::MIN_POSITIVE);
            }
            assert!(flushing(), "an inner guard leaves the outer guard's mode");
        }
        assert!(!flushing());
        assert_eq!(product(f32::MIN_POSITIVE, 0.125), tiny);
    }
}
