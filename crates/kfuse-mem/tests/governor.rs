//! The governor: its control law replayed on synthetic `/proc` and sysfs states, then real pages
//! merged under it within its CPU cap (root only). How much faster than the kernel's default
//! rate it merges is a measurement, not a property to assert: `kfuse mem demo --race-defaults`
//! reports it.

mod common;

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{ksm_or_skip, merged_pages_in, page_of, wait_for};
use kfuse_mem::governor::{Event, Governor, GovernorConfig, OutsiderAction};
use kfuse_mem::ksm::Ksm;
use kfuse_mem::process::{Domain, Procfs};
use kfuse_mem::sys::{self, Region};
use kfuse_mem::MemError;

/// A synthetic machine: a KSM directory and a `/proc` the test rewrites between ticks.
struct Machine {
    dir: PathBuf,
}

impl Machine {
    fn new(name: &str) -> Machine {
        let dir = std::env::temp_dir().join(format!("kfuse-gov-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for sub in ["ksm", "proc/pressure", "proc/37"] {
            fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let m = Machine { dir };
        for (knob, value) in [
            ("run", "0"),
            ("pages_to_scan", "100"),
            ("sleep_millisecs", "20"),
        ] {
            m.write(&format!("ksm/{knob}"), value);
        }
        m.write("proc/37/comm", "ksmd");
        m.counters(0, 0, 0, 0);
        m.ksmd_cpu_ticks(0);
        m.meminfo(16 << 20, 8 << 20);
        m.write(
            "proc/pressure/memory",
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        );
        m.write("proc/vmstat", "cow_ksm 0\n");
        m
    }

    fn write(&self, path: &str, text: &str) {
        fs::write(self.dir.join(path), text).unwrap();
    }

    fn ksm(&self) -> Ksm {
        Ksm::at(self.dir.join("ksm"), self.dir.join("proc"))
    }

    fn procfs(&self) -> Procfs {
        Procfs::at(self.dir.join("proc"))
    }

    fn knob(&self, name: &str) -> String {
        fs::read_to_string(self.dir.join("ksm").join(name))
            .unwrap()
            .trim()
            .to_string()
    }

    fn counters(&self, scanned: u64, full_scans: u64, sharing: u64, profit: i64) {
        self.write("ksm/pages_scanned", &scanned.to_string());
        self.write("ksm/full_scans", &full_scans.to_string());
        self.write("ksm/pages_sharing", &sharing.to_string());
        self.write("ksm/pages_shared", &(sharing / 2).to_string());
        self.write("ksm/general_profit", &profit.to_string());
    }

    fn ksmd_cpu_ticks(&self, ticks: u64) {
        self.write(
            "proc/37/stat",
            &format!("37 (ksmd) S 2 0 0 0 -1 0 0 0 0 0 {ticks} 0 0 0 25 5 1 0 36 0 0\n"),
        );
    }

    fn meminfo(&self, total_kib: u64, available_kib: u64) {
        self.write(
            "proc/meminfo",
            &format!("MemTotal: {total_kib} kB\nMemAvailable: {available_kib} kB\n"),
        );
    }

    /// A process with `mergeable_kib` of resident mergeable memory and `merging` merged pages.
    fn process(&self, pid: u32, name: &str, uid: u32, mergeable_kib: u64, merging: u64) {
        let d = self.dir.join(format!("proc/{pid}"));
        fs::create_dir_all(&d).unwrap();
        fs::write(
            d.join("status"),
            format!("Name:\t{name}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"),
        )
        .unwrap();
        fs::write(
            d.join("ksm_stat"),
            format!(
                "ksm_rmap_items {}\nksm_zero_pages 0\nksm_merging_pages {merging}\n\
                 ksm_process_profit 0\nksm_merge_any: no\nksm_mergeable: yes\n",
                mergeable_kib / 4
            ),
        )
        .unwrap();
        fs::write(
            d.join("smaps"),
            format!(
                "7f00-7f10 rw-p 0 0 0\nRss: {mergeable_kib} kB\nKSM: 0 kB\nVmFlags: rd wr mg\n"
            ),
        )
        .unwrap();
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn governor(m: &Machine, config: GovernorConfig) -> Governor {
    Governor::with(config, m.ksm(), m.procfs()).unwrap()
}

fn has(events: &[Event], pred: impl Fn(&Event) -> bool) -> bool {
    events.iter().any(pred)
}

#[test]
fn the_scan_rate_follows_the_convergence_target_until_the_cpu_cap_binds() {
    let m = Machine::new("rate");
    m.process(100, "model-a", 1000, 400 * 1024, 0); // 102400 pages
    let config = GovernorConfig {
        target_merge_seconds: 4.0,
        cpu_cap: 0.10,
        ..GovernorConfig::default()
    };
    let mut g = governor(&m, config);
    let t0 = Instant::now();
    let tick = g.tick_at(t0).unwrap();
    assert!(tick.running && m.knob("run") == "1");
    assert!(has(&tick.events, |e| matches!(e, Event::Started(_))));
    // Three visits to 102400 pages in 4 s = 76800 pages/s = 1536 per 20 ms batch.
    assert_eq!(m.knob("pages_to_scan"), "1536");
    // One second later ksmd scanned 51200 pages and used 0.2 s of CPU (ticks of 1/100 s):
    // 3.9 µs per page, so the 10% cap allows 25600 pages/s = 512 per batch.
    m.counters(51_200, 0, 0, 0);
    m.ksmd_cpu_ticks(20 * sys::clock_ticks_per_second() / 100);
    let tick = g.tick_at(t0 + Duration::from_secs(1)).unwrap();
    assert!((tick.ksmd_cpu_fraction.unwrap() - 0.2).abs() < 1e-9);
    assert_eq!(m.knob("pages_to_scan"), "512", "{:?}", tick.events);
    assert!(has(
        &tick.events,
        |e| matches!(e, Event::Rate { reason, .. } if reason.contains("CPU"))
    ));
    drop(g);
    assert_eq!(
        (m.knob("run").as_str(), m.knob("pages_to_scan").as_str()),
        ("0", "100")
    );
}

#[test]
fn merging_stops_when_it_does_not_pay_and_starts_under_pressure() {
    let m = Machine::new("pay");
    m.process(100, "service", 1000, 64 * 1024, 0);
    let mut g = governor(&m, GovernorConfig::default());
    let t0 = Instant::now();
    assert!(g.tick_at(t0).unwrap().running);
    // Three full scans are not enough to judge (a page needs up to three visits to merge).
    m.counters(60_000, 3, 0, -4096);
    assert!(g.tick_at(t0 + Duration::from_secs(3)).unwrap().running);
    // Four full scans, and the profit is below the 1 MiB floor.
    m.counters(100_000, 4, 10, 4096);
    let tick = g.tick_at(t0 + Duration::from_secs(5)).unwrap();
    assert!(!tick.running && m.knob("run") == "0");
    assert!(has(
        &tick.events,
        |e| matches!(e, Event::Stopped(w) if w.contains("does not pay"))
    ));
    // No change: it stays off.
    assert!(!g.tick_at(t0 + Duration::from_secs(6)).unwrap().running);
    // Memory pressure turns it on although it did not pay.
    m.meminfo(16 << 20, 1 << 20);
    let tick = g.tick_at(t0 + Duration::from_secs(7)).unwrap();
    assert!(tick.running && m.knob("run") == "1");
    assert!(has(
        &tick.events,
        |e| matches!(e, Event::Started(w) if w.contains("pressure"))
    ));
}

#[test]
fn an_outsider_stops_merging_and_is_named() {
    let m = Machine::new("admit");
    m.process(100, "tenant-a", 1000, 64 * 1024, 0);
    let config = GovernorConfig {
        admit: Some(Domain::Uid(1000)),
        on_outsider: OutsiderAction::Unmerge,
        ..GovernorConfig::default()
    };
    let mut g = governor(&m, config);
    let t0 = Instant::now();
    assert!(g.tick_at(t0).unwrap().running);
    m.process(200, "tenant-b", 2000, 64 * 1024, 0);
    let tick = g.tick_at(t0 + Duration::from_secs(1)).unwrap();
    assert!(!tick.running);
    assert_eq!(m.knob("run"), "2", "told to unmerge");
    assert!(has(&tick.events, |e| matches!(
        e,
        Event::Outsider { pid: 200, name, domain: Domain::Uid(2000) } if name == "tenant-b"
    )));
    assert!(!has(&tick.events, |e| matches!(
        e,
        Event::Outsider { pid: 100, .. }
    )));
}

#[test]
fn write_churn_names_the_process_that_breaks_merges() {
    let m = Machine::new("churn");
    m.process(100, "steady", 1000, 64 * 1024, 5000);
    m.process(200, "writer", 1000, 64 * 1024, 5000);
    let mut g = governor(&m, GovernorConfig::default());
    let t0 = Instant::now();
    g.tick_at(t0).unwrap();
    m.process(200, "writer", 1000, 64 * 1024, 1000);
    m.write("proc/vmstat", "cow_ksm 4000\n");
    let tick = g.tick_at(t0 + Duration::from_secs(2)).unwrap();
    let churn = tick
        .events
        .iter()
        .find_map(|e| match e {
            Event::Churn {
                cow_per_second,
                processes,
            } => Some((*cow_per_second, processes.clone())),
            _ => None,
        })
        .expect("churn reported");
    assert_eq!(churn.0, 2000.0);
    assert_eq!(churn.1, vec![(200, "writer".to_string(), 4000)]);
}

#[test]
fn a_process_whose_pages_are_merged_again_and_again_is_named() {
    let m = Machine::new("remerge");
    m.process(100, "steady", 1000, 64 * 1024, 5000);
    m.process(200, "flapper", 1000, 64 * 1024, 5000);
    let mut g = governor(&m, GovernorConfig::default());
    let t0 = Instant::now();
    let mut named = Vec::new();
    g.tick_at(t0).unwrap();
    for step in 1..=8u64 {
        // The flapper's merged pages alternate between 1000 and 5000.
        let merging = if step % 2 == 1 { 1000 } else { 5000 };
        m.process(200, "flapper", 1000, 64 * 1024, merging);
        let tick = g.tick_at(t0 + Duration::from_secs(step)).unwrap();
        for e in tick.events {
            if let Event::Remerging { pid, cycles, .. } = e {
                named.push((step, pid, cycles));
            }
        }
    }
    // Cycles complete at steps 2, 4, 6, 8; the third and fourth are reported.
    assert_eq!(named, vec![(6, 200, 3), (8, 200, 4)]);
}

/// Time for this process's region of duplicated pages to merge, while `drive` runs each 100 ms.
fn time_to_merge(seed: u64, pages: usize, mut drive: impl FnMut()) -> f64 {
    let page = sys::page_size();
    let mut region = Region::anonymous(pages * page).unwrap();
    for i in 0..pages {
        // Pairs of equal pages.
        region.as_mut_slice()[i * page..(i + 1) * page]
            .copy_from_slice(&page_of(seed + i as u64 / 2));
    }
    region.set_mergeable(true).unwrap();
    let start = Instant::now();
    let mut last_drive = Instant::now() - Duration::from_secs(1);
    let done = wait_for(60.0, || {
        if last_drive.elapsed() >= Duration::from_millis(100) {
            drive();
            last_drive = Instant::now();
        }
        merged_pages_in(&region) >= (pages as u64 * 95) / 100
    });
    assert!(done.is_some(), "{pages} pages did not merge within 60 s");
    let took = start.elapsed().as_secs_f64();
    region.set_mergeable(false).unwrap();
    took
}

#[test]
fn the_governor_merges_real_pages_within_its_cpu_cap() {
    let Some((ksm, lock)) = ksm_or_skip("the_governor_merges_real_pages_within_its_cpu_cap") else {
        return;
    };
    let before = ksm.settings().unwrap();
    let pages = 8192; // 32 MiB
    let cap = 0.5;
    let cpu_before = ksm.ksmd_cpu_seconds().expect("ksmd found");
    let config = GovernorConfig {
        target_merge_seconds: 0.5,
        cpu_cap: cap,
        min_profit_bytes: 0,
        ..GovernorConfig::default()
    };
    let mut governor = Governor::holding(lock, config, ksm.clone(), Procfs::system()).unwrap();
    let mut ticks = Vec::new();
    let governed = time_to_merge(2 << 40, pages, || ticks.push(governor.tick().unwrap()));
    let cpu = ksm.ksmd_cpu_seconds().unwrap() - cpu_before;
    let _lock = governor.into_lock().unwrap();
    eprintln!(
        "32 MiB of duplicated pages merged in {governed:.2} s governed; ksmd used {:.0}% of a \
         core (cap {:.0}%)",
        100.0 * cpu / governed,
        100.0 * cap
    );
    for tick in &ticks {
        for event in &tick.events {
            eprintln!("  governor: {event}");
        }
    }
    assert!(
        ticks.iter().any(|t| t.running),
        "the governor never turned merging on"
    );
    // CPU time comes in clock ticks: allow two of them of slack over the cap.
    let slack = 2.0 / sys::clock_ticks_per_second() as f64;
    assert!(
        cpu <= cap * governed + slack,
        "ksmd used {cpu} s in {governed} s"
    );
    assert_eq!(ksm.settings().unwrap(), before, "every knob is back");
}

#[test]
fn scans_before_the_governor_started_do_not_count_against_merging() {
    let m = Machine::new("running");
    m.write("ksm/run", "1");
    // ksmd has run for a while: ten full scans, and no profit yet from the new process.
    m.counters(500_000, 10, 0, -4096);
    m.process(100, "fresh", 1000, 64 * 1024, 0);
    let mut g = governor(&m, GovernorConfig::default());
    let t0 = Instant::now();
    assert!(
        g.tick_at(t0).unwrap().running,
        "judged on scans it has not watched"
    );
    m.counters(600_000, 14, 0, -4096);
    let tick = g.tick_at(t0 + Duration::from_secs(5)).unwrap();
    assert!(!tick.running, "four scans later it does not pay");
}

#[test]
fn label_domains_need_a_security_module_and_then_name_outsiders_by_label() {
    let m = Machine::new("labels");
    let config = GovernorConfig {
        admit: Some("label:tenant_t".parse().unwrap()),
        ..GovernorConfig::default()
    };
    // This /proc has no readable `self/attr/current`, as on a kernel without SELinux, AppArmor
    // or Smack, where every process would count as `unconfined`.
    let err = Governor::with(config.clone(), m.ksm(), m.procfs())
        .err()
        .expect("a label domain without a security module is refused");
    assert!(matches!(err, MemError::Unsupported(_)), "{err}");
    assert!(err.to_string().contains("read as `unconfined`"), "{err}");
    m.process(100, "tenant", 1000, 64 * 1024, 0);
    m.process(200, "stranger", 1000, 64 * 1024, 0);
    for (pid, label) in [("self", "kfuse_t"), ("100", "tenant_t"), ("200", "other_t")] {
        fs::create_dir_all(m.dir.join(format!("proc/{pid}/attr"))).unwrap();
        m.write(&format!("proc/{pid}/attr/current"), &format!("{label}\0"));
    }
    let mut g = governor(&m, config);
    let tick = g.tick_at(Instant::now()).unwrap();
    let outsiders: Vec<(u32, String)> = tick
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Outsider { pid, domain, .. } => Some((*pid, domain.to_string())),
            _ => None,
        })
        .collect();
    assert_eq!(outsiders, vec![(200, "label:other_t".to_string())]);
}

#[test]
fn a_second_governor_is_refused_and_told_the_first_ones_pid() {
    let m = Machine::new("second");
    let first = governor(&m, GovernorConfig::default());
    let err = Governor::with(GovernorConfig::default(), m.ksm(), m.procfs())
        .err()
        .expect("a second governor of the same KSM is refused");
    assert!(matches!(err, MemError::Refused(_)), "{err}");
    assert!(
        err.to_string()
            .contains(&format!("pid {} ", std::process::id())),
        "{err}"
    );
    // The lock goes with the first governor, and a new one may start.
    drop(first);
    governor(&m, GovernorConfig::default());
}
