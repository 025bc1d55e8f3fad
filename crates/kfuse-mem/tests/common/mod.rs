//! Shared test support: the root-and-KSM check that skips visibly (and fails in CI), and page
//! contents.

#![allow(dead_code)]

use kfuse_mem::ksm::Ksm;
use kfuse_mem::sys::{self, FileLock};
use kfuse_testkit::{skip, Prerequisite};

/// The system's KSM and the machine-wide KSM lock, or `None` after saying why the test cannot
/// run here (it needs root and a kernel with KSM).
pub fn ksm_or_skip(test: &str) -> Option<(Ksm, FileLock)> {
    let ksm = Ksm::system();
    if !ksm.available() {
        skip(
            test,
            Prerequisite::Ksm,
            "this kernel has no KSM (/sys/kernel/mm/ksm is missing)",
        );
        return None;
    }
    if !sys::is_root() {
        skip(test, Prerequisite::Root, "changing KSM settings needs root");
        return None;
    }
    let lock = ksm.lock().expect("the KSM lock");
    Some((ksm, lock))
}

/// A page of pseudo-random bytes determined by `seed` (splitmix64).
pub fn page_of(seed: u64) -> Vec<u8> {
    let page = sys::page_size();
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let mut out = Vec::with_capacity(page);
    while out.len() < page {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        out.extend_from_slice(&z.to_le_bytes());
    }
    out
}

/// A deterministic shuffle of `n` labels, half of them true.
pub fn balanced_labels(n: usize, seed: u64) -> Vec<bool> {
    let mut labels: Vec<bool> = (0..n).map(|i| i < n / 2).collect();
    let mut state = seed | 1;
    for i in (1..n).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        labels.swap(i, (state % (i as u64 + 1)) as usize);
    }
    labels
}

/// Pages of `region` that map KSM pages now, from the `KSM:` lines of this process's smaps
/// (exact at once, unlike `ksm_stat`).
pub fn merged_pages_in(region: &kfuse_mem::sys::Region) -> u64 {
    let start = region.as_ptr() as u64;
    let end = start + region.len() as u64;
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut overlapping = false;
    let mut kib = 0;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                overlapping = a < end && b > start;
                continue;
            }
        }
        if let Some(rest) = line.strip_prefix("KSM:") {
            if overlapping {
                kib += rest
                    .split_whitespace()
                    .next()
                    .unwrap()
                    .parse::<u64>()
                    .unwrap();
            }
        }
    }
    kib * 1024 / kfuse_mem::sys::page_size() as u64
}

/// Polls `done` every 20 ms for up to `seconds`; returns the time it took, or `None`.
pub fn wait_for(seconds: f64, mut done: impl FnMut() -> bool) -> Option<f64> {
    let start = std::time::Instant::now();
    while start.elapsed().as_secs_f64() < seconds {
        if done() {
            return Some(start.elapsed().as_secs_f64());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    None
}
