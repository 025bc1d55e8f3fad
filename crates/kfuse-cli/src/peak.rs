//! W0's compute limit: peak f32 fused multiply-add throughput, one thread and all threads.
//!
//! Each thread runs twelve independent accumulator chains of vector FMAs (enough to cover the
//! FMA latency on two pipes), so the loop is bound by FMA throughput alone. AVX-512 where the
//! CPU has it, else AVX2 with FMA; neither present, no figure (the report says why).

use std::time::Instant;

/// Accumulators per thread: latency (4 cycles) times FMA pipes (2), with margin.
const CHAINS: usize = 12;

/// The instruction set measured, or why none can be.
pub fn isa() -> Result<&'static str, &'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return Ok("avx512");
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return Ok("avx2+fma");
        }
        Err("the CPU has neither AVX-512 nor AVX2 with FMA")
    }
    #[cfg(not(target_arch = "x86_64"))]
    Err("peak FMA is measured on x86-64 only")
}

/// GFLOP/s (one FMA = two flops) of `threads` threads, each running `iters` iterations; the
/// median of `runs`.
pub fn gflops(threads: usize, iters: u64, runs: usize) -> Result<f64, &'static str> {
    let isa = isa()?;
    let mut rates = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        let lanes = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| s.spawn(move || chains(isa, iters, t as f32)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("the FMA loop does not panic"))
                .sum::<u64>()
        });
        let secs = start.elapsed().as_secs_f64();
        rates.push((2 * lanes * CHAINS as u64 * iters) as f64 / secs / 1e9);
    }
    rates.sort_by(f64::total_cmp);
    Ok(rates[rates.len() / 2])
}

/// Runs the chains; returns the vector width in f32 lanes. The result's sum goes through
/// `black_box` so that the loop is not removed.
fn chains(isa: &str, iters: u64, seed: f32) -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `isa` names features the CPU has (`isa()` checked them).
    unsafe {
        if isa == "avx512" {
            std::hint::black_box(x86::avx512(iters, seed));
            return 16;
        }
        std::hint::black_box(x86::avx2(iters, seed));
        8
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, iters, seed);
        unreachable!("isa() fails off x86-64")
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::CHAINS;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    pub(super) fn avx512(iters: u64, seed: f32) -> f32 {
        // a * 1 + tiny keeps every value finite and normal for any iteration count.
        let (m, c) = (_mm512_set1_ps(1.0), _mm512_set1_ps(1e-7));
        let mut acc = [_mm512_set1_ps(seed); CHAINS];
        for _ in 0..iters {
            for a in &mut acc {
                *a = _mm512_fmadd_ps(*a, m, c);
            }
        }
        acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum()
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn avx2(iters: u64, seed: f32) -> f32 {
        let (m, c) = (_mm256_set1_ps(1.0), _mm256_set1_ps(1e-7));
        let mut acc = [_mm256_set1_ps(seed); CHAINS];
        for _ in 0..iters {
            for a in &mut acc {
                *a = _mm256_fmadd_ps(*a, m, c);
            }
        }
        let mut lanes = [0.0f32; 8];
        let sum = acc
            .iter()
            .fold(_mm256_setzero_ps(), |s, &a| _mm256_add_ps(s, a));
        // SAFETY: `lanes` holds eight f32.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sum) };
        lanes.iter().sum()
    }
}
