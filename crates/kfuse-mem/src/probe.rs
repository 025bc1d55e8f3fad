//! The write-timing probe: a write to a merged page takes a copy-on-write fault, a write to a
//! private resident page does not, and the difference is large enough to tell which pages the
//! kernel (or a pool) shares. This is how a tenant learns what another tenant holds when their
//! pages may merge; kfuse uses it to show the channel exists under kernel KSM and is closed by
//! the dedup pool across domains and in same-behaviour mode.
//!
//! Times are only ever compared with each other (ranks and ratios), never with absolute
//! thresholds, so the result does not depend on the machine's speed.

use std::time::Instant;

/// Times the first write to each `stride`-byte page of `bytes` (one byte written, its value plus
/// one), in nanoseconds, in page order.
pub fn time_first_writes(bytes: &mut [u8], stride: usize) -> Vec<u64> {
    assert!(stride > 0, "a page stride of zero");
    (0..bytes.len().div_ceil(stride))
        .map(|page| {
            let start = Instant::now();
            let byte = &mut bytes[page * stride];
            *byte = byte.wrapping_add(1);
            // The reference escapes, so the write happens before the clock is read again.
            std::hint::black_box(byte);
            start.elapsed().as_nanos() as u64
        })
        .collect()
}

/// How well write times separate pages labelled shared from pages labelled unshared.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Separation {
    /// The probability that a random shared page took longer than a random unshared one (the
    /// area under the ROC curve): 1.0 is a perfect probe, 0.5 is chance.
    pub auc: f64,
    /// Median write time of shared pages over that of unshared ones.
    pub median_ratio: f64,
    /// Pages in each class.
    pub shared: usize,
    /// Pages in the other.
    pub unshared: usize,
}

impl Separation {
    /// How far from chance the probe is, whichever way: `|auc - 0.5|`.
    pub fn advantage(&self) -> f64 {
        (self.auc - 0.5).abs()
    }

    /// The standard deviation of the AUC when there is no signal, for these class sizes.
    pub fn chance_sigma(&self) -> f64 {
        let (a, b) = (self.shared as f64, self.unshared as f64);
        ((a + b + 1.0) / (12.0 * a * b)).sqrt()
    }
}

/// Separation of `times` by `shared` labels (rank-based, ties count half).
pub fn separation(times: &[u64], shared: &[bool]) -> Separation {
    assert_eq!(times.len(), shared.len(), "one label per time");
    let yes: Vec<u64> = times
        .iter()
        .zip(shared)
        .filter(|(_, s)| **s)
        .map(|(t, _)| *t)
        .collect();
    let no: Vec<u64> = times
        .iter()
        .zip(shared)
        .filter(|(_, s)| !**s)
        .map(|(t, _)| *t)
        .collect();
    let mut wins = 0.0;
    for &a in &yes {
        for &b in &no {
            wins += match a.cmp(&b) {
                std::cmp::Ordering::Greater => 1.0,
                std::cmp::Ordering::Equal => 0.5,
                std::cmp::Ordering::Less => 0.0,
            };
        }
    }
    let pairs = (yes.len() * no.len()).max(1) as f64;
    Separation {
        auc: wins / pairs,
        median_ratio: median(&yes) / median(&no).max(1.0),
        shared: yes.len(),
        unshared: no.len(),
    }
}

fn median(values: &[u64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted[sorted.len() / 2] as f64
}
