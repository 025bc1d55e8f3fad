//! Software prefetches: hints that ask for a cache line before a kernel loads it.
//!
//! Inside a network every layer's weights come from memory (ResNet-50's 102 MB of them pass
//! through a 32 MiB L3 once per run), and a kernel that streams its weights a block of output
//! channels at a time reads them faster than the hardware prefetchers ask for them: its loads
//! wait on DRAM. The kernels that stream weights ask for the line [`WEIGHTS_AHEAD`] floats
//! past the one they read.

/// How far ahead of its reads (in f32 elements, 4 KiB) a kernel asks for the weights it
/// streams: the direct microkernel's terms (`conv::direct`, one line asked for per term of 8
/// weights), which also run the Winograd products.
///
/// `conv_shapes` with `COLD=2` (only the weights out of cache, as in a network), bias,
/// residual and ReLU, two alternating runs each: 8×512×7×7 → 2048 (1×1) 2.10–2.17 → 1.87–1.90
/// ms, 8×2048×7×7 → 512 2.17–2.21 → 1.95–1.97, 8×512×7×7 → 512 (3×3, Winograd, 16 MB of
/// transformed weights) 3.48–3.53 → 3.02–3.05, 8×256×14×14 → 256 2.59–2.60 → 2.33–2.35,
/// 8×512×14×14 → 512 at stride 2 (tap planes) 5.13–5.32 → 4.75–4.79; 256 floats ahead gained
/// less, 512 as much. With every operand in cache the 7×7 3×3 layer still gains (2.93–2.95 →
/// 2.55–2.61: its weights pass L2 from L3), the rest within noise (W6a's block 3.90–4.02 ms
/// either way). `kfuse run` on ResNet-50 (batch 8, 12 runs, three alternations of the two
/// builds): 143.8–146.4 → 136.9–139.1 ms, the logits bit-identical. The GEMM's left operand
/// (the 1×1 convolutions' weights, read in place) asked for the same way gained nothing.
const WEIGHTS_AHEAD: usize = 1024;

/// A layer's weights (or a Winograd convolution's transformed weights, all 16 planes) of fewer
/// bytes than this stay in L2 between the blocks of positions that read them, and are not
/// asked for ahead ([`weights_ahead`]).
const STREAMED_WEIGHTS: usize = 512 << 10;

/// How far ahead a kernel asks for the weights of a layer whose weights hold `len` f32
/// elements: [`WEIGHTS_AHEAD`], or 0 (the line it is about to read, which costs the hint alone)
/// below [`STREAMED_WEIGHTS`]. Hints for weights in cache gain nothing: W7's (256 KB
/// transformed) gave `kfuse bench W7` ratios against the bare convolution of 1.006–1.018 with
/// the hints and 0.985–1.012 without over four alternations, within its noise; gated, 0.990–1.010.
/// ResNet-50 with the gate, against no hints, in a slower spell: 147.7–152.0 → 139.5–141.5 ms.
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
