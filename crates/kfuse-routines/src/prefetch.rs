//! Software prefetches: hints that ask for a cache line before a kernel loads it.
//!
//! Inside a network every layer's weights come from memory (ResNet-50's 102 MB of them pass
//! through a 32 MiB L3 once per run), and a kernel that streams its weights a block of output
//! channels at a time reads them faster than the hardware prefetchers ask for them: its loads
//! wait on DRAM. The kernels that stream weights ask for the line [`WEIGHTS_AHEAD`] floats
//! past the one they read.

/// How far ahead of its reads (in f32 elements, 4 KiB) a kernel asks for the weights it
/// streams: the direct microkernel's terms (`conv::direct`, one line asked for per term of 8
/// weights), which also run the Winograd products. Hints 256 floats ahead gained less, and the
/// GEMM's left operand (the 1×1 convolutions' weights, read in place) gained nothing from them
/// (`docs/structured-ops.md`, "Routines": weights asked for ahead, and "Measurements behind
/// design choices").
const WEIGHTS_AHEAD: usize = 1024;

/// A layer's weights (or a Winograd convolution's transformed weights, all 16 planes) of fewer
/// bytes than this stay in L2 between the blocks of positions that read them, and are not
/// asked for ahead ([`weights_ahead`]).
const STREAMED_WEIGHTS: usize = 512 << 10;

/// How far ahead a kernel asks for the weights of a layer whose weights hold `len` f32
/// elements: [`WEIGHTS_AHEAD`], or 0 (the line it is about to read, which costs the hint alone)
/// below [`STREAMED_WEIGHTS`]: hints for weights in cache gain nothing, and the gate keeps
/// ResNet-50's gain (`docs/structured-ops.md`, "Measurements behind design choices").
pub(crate) fn weights_ahead(len: usize) -> usize {
    if len * std::mem::size_of::<f32>() >= STREAMED_WEIGHTS {
        WEIGHTS_AHEAD
    } else {
        0
    }
}

/// Asks for the cache line holding `p` into L1: a hint, which reads nothing architecturally,
/// whatever the address (one past an operand's end included).
#[inline(always)]
pub(crate) fn ask_line(p: *const f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
