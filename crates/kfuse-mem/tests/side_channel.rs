//! The write-timing side channel, demonstrated and closed.
//!
//! A probe holds pages whose content it guesses; half of the guesses are right (a victim holds
//! the same bytes). After merging, the probe times its first write to each page. Under kernel
//! KSM a right guess was merged with the victim's page and the write takes a copy-on-write fault:
//! the probe tells right from wrong guesses almost perfectly. Through the dedup pool across
//! domains, and in same-behaviour mode, the times do not depend on the guess.
//!
//! Separation is the rank statistic AUC (0.5 is chance, 1.0 a perfect probe), so no absolute
//! time is compared with anything.

mod common;

use common::{balanced_labels, ksm_or_skip, merged_pages_in, page_of, wait_for};
use kfuse_mem::ksm::{Knob, KnobGuard};
use kfuse_mem::pool::{Pool, PoolOptions};
use kfuse_mem::probe::{separation, time_first_writes, Separation};
use kfuse_mem::process::Domain;
use kfuse_mem::sys::{self, Region};

const GUESSES: usize = 256;

/// The victim's secret pages, and the probe's guesses (`labels[i]`: guess i is right).
fn secrets_and_guesses(seed: u64) -> (Vec<Vec<u8>>, Vec<Vec<u8>>, Vec<bool>) {
    let labels = balanced_labels(GUESSES, seed);
    let secrets: Vec<Vec<u8>> = (0..GUESSES as u64)
        .map(|i| page_of(seed * 1000 + i))
        .collect();
    let guesses = labels
        .iter()
        .enumerate()
        .map(|(i, &right)| {
            if right {
                secrets[i].clone()
            } else {
                page_of(seed * 1000 + 500_000 + i as u64)
            }
        })
        .collect();
    (secrets, guesses, labels)
}

fn report(what: &str, s: &Separation) {
    eprintln!(
        "{what}: AUC {:.3} (chance sigma {:.3}), median write time ratio right/wrong guess {:.2}",
        s.auc,
        s.chance_sigma(),
        s.median_ratio
    );
}

#[test]
fn the_write_probe_identifies_pages_merged_by_kernel_ksm() {
    let Some((ksm, _lock)) = ksm_or_skip("the_write_probe_identifies_pages_merged_by_kernel_ksm")
    else {
        return;
    };
    let page = sys::page_size();
    let (secrets, guesses, labels) = secrets_and_guesses(7);
    let mut victim = Region::anonymous(GUESSES * page).unwrap();
    let mut probe = Region::anonymous(GUESSES * page).unwrap();
    for i in 0..GUESSES {
        victim.as_mut_slice()[i * page..(i + 1) * page].copy_from_slice(&secrets[i]);
        probe.as_mut_slice()[i * page..(i + 1) * page].copy_from_slice(&guesses[i]);
    }
    victim.set_mergeable(true).unwrap();
    probe.set_mergeable(true).unwrap();
    let mut guard = KnobGuard::new(&ksm);
    guard.set(Knob::PagesToScan, 10_000).unwrap();
    guard.set(Knob::SleepMillisecs, 10).unwrap();
    guard.set(Knob::Run, 1).unwrap();
    let right = labels.iter().filter(|l| **l).count() as u64;
    let merged = wait_for(30.0, || merged_pages_in(&probe) >= right);
    assert!(
        merged.is_some(),
        "ksmd did not merge the {right} duplicated pages within 30 s ({} merged)",
        merged_pages_in(&probe)
    );
    // Stop ksmd so it does not re-merge or touch pages while they are timed.
    guard.set(Knob::Run, 0).unwrap();
    let times = time_first_writes(probe.as_mut_slice(), page);
    let result = separation(&times, &labels);
    report("kernel KSM", &result);
    assert!(
        result.auc > 0.9,
        "the probe should identify merged pages under kernel KSM: {result:?}"
    );
    probe.set_mergeable(false).unwrap();
    victim.set_mergeable(false).unwrap();
    guard.restore().unwrap();
}

/// Inserts the victim's secrets into `victim_pool`, the guesses into `probe_pool`, and times
/// the probe's first writes.
fn pool_probe(victim_pool: &mut Pool, probe_pool: Option<&mut Pool>, seed: u64) -> Separation {
    let (secrets, guesses, labels) = secrets_and_guesses(seed);
    let secrets: Vec<u8> = secrets.concat();
    let guesses: Vec<u8> = guesses.concat();
    let _victim = victim_pool.insert("victim", &secrets).unwrap();
    let probe_pool = match probe_pool {
        Some(p) => p,
        None => victim_pool,
    };
    let mut probe = probe_pool.insert("probe", &guesses).unwrap();
    let times = time_first_writes(probe.as_mut_slice(), sys::page_size());
    separation(&times, &labels)
}

#[test]
fn the_pool_leaks_nothing_across_domains() {
    let mut tenant_a = Pool::new(Domain::Uid(1001), PoolOptions::default()).unwrap();
    let mut tenant_b = Pool::new(Domain::Uid(1002), PoolOptions::default()).unwrap();
    let result = pool_probe(&mut tenant_a, Some(&mut tenant_b), 11);
    report("pool, across domains", &result);
    assert!(
        result.advantage() < 6.0 * result.chance_sigma(),
        "across domains the probe must be at chance: {result:?}"
    );
    assert_eq!(
        tenant_b.stats().saved_bytes,
        0,
        "nothing is shared across domains"
    );
}

#[test]
fn same_behaviour_mode_closes_the_probe_within_a_domain() {
    // First the channel the mode exists for: by default, unique data stays in its holder's
    // memory and a shared page is copy-on-write, so within one domain the probe works.
    let mut default_pool = Pool::new(Domain::Uid(1001), PoolOptions::default()).unwrap();
    let open = pool_probe(&mut default_pool, None, 13);
    report("pool, one domain, default mode", &open);
    assert!(
        open.auc > 0.9,
        "by default a write to a shared pool page faults and a unique one does not: {open:?}"
    );
    let options = PoolOptions {
        same_behaviour: true,
    };
    let mut same = Pool::new(Domain::Uid(1001), options).unwrap();
    let closed = pool_probe(&mut same, None, 17);
    report("pool, one domain, same-behaviour mode", &closed);
    assert!(
        closed.advantage() < 6.0 * closed.chance_sigma(),
        "in same-behaviour mode the probe must be at chance: {closed:?}"
    );
}
