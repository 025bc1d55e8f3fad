//! The governor: a closed-loop controller for ksmd, in the role of ksmtuned.
//!
//! Each tick it samples the KSM counters, ksmd's CPU time, the mergeable memory of every process
//! taking part, vmstat's copy-on-write count and the system's memory pressure, and then:
//!
//! - **admission**: if a process outside the admitted security domain has mergeable memory,
//!   ksmd is stopped (or told to unmerge everything) and the process is named, because kernel
//!   KSM merges any identical pages, whoever owns them;
//! - **on and off**: merging runs while there is mergeable memory and it pays; after two full
//!   scans ([`SCANS_BEFORE_JUDGING`]) with a profit below the floor it stops, unless memory is under pressure
//!   (`MemAvailable` low or PSI stalls), which turns it on regardless; it resumes when the
//!   mergeable memory grows;
//! - **scan rate**: `pages_to_scan` is set so that all mergeable pages are visited as often as
//!   merging needs ([`VISITS_TO_MERGE`]) within the operator's convergence target, but never faster than
//!   the CPU cap allows at the measured CPU cost per scanned page;
//! - **churn**: copy-on-write faults on merged pages above a rate, and the processes whose merged
//!   pages fell the most, are reported, as is a process whose pages are merged, written and merged
//!   again cycle after cycle: merging pages that are then written wastes ksmd's time.
//!
//! The governor changes knobs through a [`KnobGuard`], so they are restored when it stops, and
//! holds the machine-wide KSM lock ([`Ksm::try_lock`]) for its whole life: a second governor,
//! or any program changing KSM settings under the lock, is refused and told the holder's pid.

use std::collections::HashMap;
use std::time::Instant;

use crate::ksm::{Counters, Knob, KnobGuard, Ksm, KsmVmstat, Pressure, Run};
use crate::process::{Domain, DomainKind, ProcessKsm, Procfs};
use crate::sys::{self, FileLock};
use crate::MemError;

/// Visits of ksmd a page needs before it merges: its checksum is recorded, then found unchanged
/// and entered in the unstable tree, then matched.
pub const VISITS_TO_MERGE: u64 = 3;

/// Full scans after which merging is judged on its profit: the visits a page needs, plus the
/// scan under way when merging started.
pub const SCANS_BEFORE_JUDGING: u64 = VISITS_TO_MERGE + 1;

/// What to do when a process of another domain has mergeable memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutsiderAction {
    /// Stop ksmd: no new merges; pages already merged stay merged.
    Stop,
    /// Stop ksmd and unmerge every merged page (`run = 2`).
    Unmerge,
}

/// The operator's targets.
#[derive(Clone, Debug, PartialEq)]
pub struct GovernorConfig {
    /// Seconds in which all mergeable memory should be merged.
    pub target_merge_seconds: f64,
    /// The most CPU ksmd may use, as a fraction of one core.
    pub cpu_cap: f64,
    /// ksmd's sleep between batches, in milliseconds (the governor varies the batch size).
    pub sleep_millisecs: u64,
    /// Bounds on `pages_to_scan`.
    pub min_pages_to_scan: u64,
    /// Upper bound on `pages_to_scan`.
    pub max_pages_to_scan: u64,
    /// Net profit below which merging is stopped after [`SCANS_BEFORE_JUDGING`] full scans.
    pub min_profit_bytes: i64,
    /// `MemAvailable / MemTotal` below which memory counts as under pressure.
    pub pressure_available_fraction: f64,
    /// PSI `some avg10` (percent) above which memory counts as under pressure.
    pub pressure_psi_some: f64,
    /// Copy-on-write faults on merged pages per second that count as churn.
    pub churn_cow_per_second: f64,
    /// The only domain whose processes may merge; `None` admits all (not recommended with
    /// tenants).
    pub admit: Option<Domain>,
    /// What to do about outsiders.
    pub on_outsider: OutsiderAction,
}

impl Default for GovernorConfig {
    fn default() -> Self {
        GovernorConfig {
            target_merge_seconds: 10.0,
            cpu_cap: 0.25,
            sleep_millisecs: 20,
            min_pages_to_scan: 100,
            max_pages_to_scan: 200_000,
            min_profit_bytes: 1 << 20,
            pressure_available_fraction: 0.10,
            pressure_psi_some: 10.0,
            churn_cow_per_second: 1000.0,
            admit: None,
            on_outsider: OutsiderAction::Stop,
        }
    }
}

/// Something the governor decided or noticed, with its reason.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Merging turned on.
    Started(String),
    /// Merging turned off.
    Stopped(String),
    /// `pages_to_scan` changed.
    Rate {
        /// The new value.
        pages_to_scan: u64,
        /// Why.
        reason: String,
    },
    /// A process outside the admitted domain has mergeable memory.
    Outsider {
        /// Its pid.
        pid: u32,
        /// Its name.
        name: String,
        /// Its domain.
        domain: Domain,
    },
    /// A process's pages keep being merged, written (unmerged) and merged again: ksmd's work
    /// on them is wasted. Marking the region unmergeable (or not marking it) is the fix.
    Remerging {
        /// Its pid.
        pid: u32,
        /// Its name.
        name: String,
        /// Completed merge-unmerge-merge cycles seen.
        cycles: u32,
    },
    /// Merged pages are being written.
    Churn {
        /// Copy-on-write faults on KSM pages per second.
        cow_per_second: f64,
        /// The processes whose merged pages fell most: pid, name, pages lost this tick.
        processes: Vec<(u32, String, u64)>,
    },
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Event::Started(why) => write!(f, "merging on: {why}"),
            Event::Stopped(why) => write!(f, "merging off: {why}"),
            Event::Rate {
                pages_to_scan,
                reason,
            } => write!(f, "pages_to_scan = {pages_to_scan}: {reason}"),
            Event::Outsider { pid, name, domain } => write!(
                f,
                "process {pid} ({name}) of {domain} has mergeable memory outside the admitted domain"
            ),
            Event::Remerging { pid, name, cycles } => write!(
                f,
                "process {pid} ({name}) had its merged pages written and merged again {cycles} times"
            ),
            Event::Churn {
                cow_per_second,
                processes,
            } => {
                write!(f, "write churn: {cow_per_second:.0} COW faults/s on merged pages")?;
                for (pid, name, pages) in processes {
                    write!(f, "; {name} ({pid}) lost {pages} merged pages")?;
                }
                Ok(())
            }
        }
    }
}

/// One observation of the system.
#[derive(Clone, Debug)]
pub struct Sample {
    /// When it was taken.
    pub at: Instant,
    /// KSM counters.
    pub counters: Counters,
    /// KSM lines of vmstat.
    pub vmstat: KsmVmstat,
    /// ksmd CPU seconds so far.
    pub ksmd_cpu_seconds: Option<f64>,
    /// Processes taking part in merging.
    pub processes: Vec<ProcessKsm>,
    /// Resident pages in mergeable mappings, over all processes.
    pub mergeable_pages: u64,
    /// Memory pressure.
    pub pressure: Pressure,
}

/// What one tick measured and decided.
#[derive(Clone, Debug)]
pub struct Tick {
    /// The sample taken.
    pub sample: Sample,
    /// ksmd's CPU use since the previous tick, as a fraction of one core.
    pub ksmd_cpu_fraction: Option<f64>,
    /// Pages scanned per second since the previous tick.
    pub scan_rate: Option<f64>,
    /// Whether ksmd runs after this tick.
    pub running: bool,
    /// `pages_to_scan` after this tick.
    pub pages_to_scan: u64,
    /// What changed or was noticed.
    pub events: Vec<Event>,
}

/// The controller. Knobs it sets are restored when it is dropped.
pub struct Governor {
    config: GovernorConfig,
    ksm: Ksm,
    procfs: Procfs,
    guard: KnobGuard,
    /// The KSM lock, held for the governor's whole life; declared after the guard, so that
    /// knobs are restored before it is released.
    lock: FileLock,
    previous: Option<Sample>,
    running: bool,
    pages_to_scan: u64,
    full_scans_at_start: u64,
    stopped_at_mergeable: Option<u64>,
    cpu_per_page: Option<f64>,
    cycles: HashMap<u32, MergeCycles>,
}

/// Cycles at which re-merging is reported.
pub const REMERGE_CYCLES: u32 = 3;

/// A process's merged-page count over time: did it fall (pages written), and then rise again?
#[derive(Clone, Copy, Debug, Default)]
struct MergeCycles {
    fell: bool,
    cycles: u32,
}

impl Governor {
    /// A governor of the system's KSM. Needs root to change knobs. It holds the machine-wide
    /// KSM lock for its whole life, and is refused while another program holds it.
    pub fn new(config: GovernorConfig) -> Result<Governor, MemError> {
        Governor::with(config, Ksm::system(), Procfs::system())
    }

    /// A governor over the given KSM and `/proc`, holding that KSM's lock (see
    /// [`Ksm::try_lock`]).
    pub fn with(config: GovernorConfig, ksm: Ksm, procfs: Procfs) -> Result<Governor, MemError> {
        Governor::available(&ksm)?;
        let lock = ksm.try_lock()?;
        Governor::holding(lock, config, ksm, procfs)
    }

    /// A governor for a caller that already holds the KSM lock (from [`Ksm::lock`]) and
    /// changes or checks knobs around the governor's run, as the demo does; the governor keeps
    /// the lock until it is dropped or [`Governor::into_lock`] hands it back.
    pub fn holding(
        lock: FileLock,
        config: GovernorConfig,
        ksm: Ksm,
        procfs: Procfs,
    ) -> Result<Governor, MemError> {
        Governor::available(&ksm)?;
        if config
            .admit
            .as_ref()
            .is_some_and(|d| d.kind() == DomainKind::Label)
        {
            procfs.check_labels()?;
        }
        if !(config.cpu_cap > 0.0 && config.target_merge_seconds > 0.0) {
            return Err(MemError::Usage(
                "the CPU cap and the convergence target must be positive".into(),
            ));
        }
        let mut guard = KnobGuard::new(&ksm);
        guard.set(Knob::SleepMillisecs, config.sleep_millisecs)?;
        let pages_to_scan = ksm.get(Knob::PagesToScan)?.unwrap_or(100);
        let running = ksm.get(Knob::Run)? == Some(1);
        // Profit is judged on scans the governor has seen, even if ksmd was already running.
        let full_scans_at_start = ksm.counters()?.full_scans.unwrap_or(0);
        Ok(Governor {
            config,
            ksm,
            procfs,
            guard,
            lock,
            previous: None,
            running,
            pages_to_scan,
            full_scans_at_start,
            stopped_at_mergeable: None,
            cpu_per_page: None,
            cycles: HashMap::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &GovernorConfig {
        &self.config
    }

    /// Takes a sample of the system.
    pub fn sample(&self) -> Result<Sample, MemError> {
        self.sample_at(Instant::now())
    }

    fn sample_at(&self, at: Instant) -> Result<Sample, MemError> {
        let processes = self.procfs.merging_processes()?;
        let mut mergeable_bytes = 0;
        for p in &processes {
            if p.mergeable || p.merge_any {
                if let Some(smaps) = self.procfs.smaps_ksm(p.pid)? {
                    mergeable_bytes += smaps.mergeable_rss_bytes;
                }
            }
        }
        Ok(Sample {
            at,
            counters: self.ksm.counters()?,
            vmstat: self.ksm.vmstat()?,
            ksmd_cpu_seconds: self.ksm.ksmd_cpu_seconds(),
            processes,
            mergeable_pages: mergeable_bytes / sys::page_size() as u64,
            pressure: self.ksm.pressure()?,
        })
    }

    fn set_run(&mut self, run: Run) -> Result<(), MemError> {
        self.guard.set(Knob::Run, run as u64)?;
        self.running = run == Run::Merge;
        Ok(())
    }

    /// Samples, decides and applies once.
    pub fn tick(&mut self) -> Result<Tick, MemError> {
        self.tick_at(Instant::now())
    }

    /// [`Governor::tick`] with the sample stamped `at` (rates are computed between stamps; tests
    /// replay recorded states with their own clock).
    pub fn tick_at(&mut self, at: Instant) -> Result<Tick, MemError> {
        let sample = self.sample_at(at)?;
        let mut events = Vec::new();
        let previous = self.previous.take();
        let dt = previous
            .as_ref()
            .map(|p| sample.at.duration_since(p.at).as_secs_f64())
            .filter(|dt| *dt > 0.0);
        let scanned = |s: &Sample| s.counters.pages_scanned;
        let scan_delta = match (&previous, scanned(&sample)) {
            (Some(p), Some(now)) => scanned(p).map(|before| now.saturating_sub(before)),
            _ => None,
        };
        let cpu_delta = match (&previous, sample.ksmd_cpu_seconds) {
            (Some(p), Some(now)) => p.ksmd_cpu_seconds.map(|before| (now - before).max(0.0)),
            _ => None,
        };
        let ksmd_cpu_fraction = dt.zip(cpu_delta).map(|(dt, cpu)| cpu / dt);
        let scan_rate = dt.zip(scan_delta).map(|(dt, n)| n as f64 / dt);
        // The CPU cost of one scanned page, smoothed; only measured over enough pages for the
        // tick-granular CPU clock to mean something.
        if let (Some(cpu), Some(pages)) = (cpu_delta, scan_delta) {
            if pages >= 10_000 && cpu > 0.0 {
                let cost = cpu / pages as f64;
                self.cpu_per_page = Some(match self.cpu_per_page {
                    Some(old) => 0.5 * old + 0.5 * cost,
                    None => cost,
                });
            }
        }

        // Admission.
        if let Some(admitted) = self.config.admit.clone() {
            let mut outsiders = Vec::new();
            for p in &sample.processes {
                if !(p.mergeable || p.merge_any) {
                    continue;
                }
                if let Some(domain) = self.procfs.domain(p.pid, admitted.kind())? {
                    if domain != admitted {
                        outsiders.push(Event::Outsider {
                            pid: p.pid,
                            name: p.name.clone(),
                            domain,
                        });
                    }
                }
            }
            if !outsiders.is_empty() {
                events.extend(outsiders);
                let action = match self.config.on_outsider {
                    OutsiderAction::Stop => Run::Stop,
                    OutsiderAction::Unmerge => Run::Unmerge,
                };
                if self.running || action == Run::Unmerge {
                    self.set_run(action)?;
                    events.push(Event::Stopped(format!(
                        "processes outside {admitted} have mergeable memory"
                    )));
                }
                return Ok(self.finish(sample, ksmd_cpu_fraction, scan_rate, events));
            }
        }

        // Churn.
        if let (Some(p), Some(now), Some(dt)) = (&previous, sample.vmstat.cow_ksm, dt) {
            if let Some(before) = p.vmstat.cow_ksm {
                let cow_per_second = now.saturating_sub(before) as f64 / dt;
                if cow_per_second >= self.config.churn_cow_per_second {
                    let earlier: HashMap<u32, u64> = p
                        .processes
                        .iter()
                        .map(|q| (q.pid, q.merging_pages))
                        .collect();
                    let mut losers: Vec<(u32, String, u64)> = sample
                        .processes
                        .iter()
                        .filter_map(|q| {
                            let before = *earlier.get(&q.pid)?;
                            (before > q.merging_pages)
                                .then(|| (q.pid, q.name.clone(), before - q.merging_pages))
                        })
                        .collect();
                    losers.sort_by_key(|l| std::cmp::Reverse(l.2));
                    losers.truncate(3);
                    events.push(Event::Churn {
                        cow_per_second,
                        processes: losers,
                    });
                }
            }
        }

        // Re-merging: merged pages that fall and then rise again, tick after tick.
        if let Some(p) = &previous {
            let earlier: HashMap<u32, u64> = p
                .processes
                .iter()
                .map(|q| (q.pid, q.merging_pages))
                .collect();
            self.cycles
                .retain(|pid, _| sample.processes.iter().any(|q| q.pid == *pid));
            for q in &sample.processes {
                let Some(&before) = earlier.get(&q.pid) else {
                    continue;
                };
                let state = self.cycles.entry(q.pid).or_default();
                if q.merging_pages < before {
                    state.fell = true;
                } else if q.merging_pages > before && state.fell {
                    state.fell = false;
                    state.cycles += 1;
                    if state.cycles >= REMERGE_CYCLES {
                        events.push(Event::Remerging {
                            pid: q.pid,
                            name: q.name.clone(),
                            cycles: state.cycles,
                        });
                    }
                }
            }
        }

        // On and off.
        let pressure = &sample.pressure;
        let under_pressure = (pressure.total_bytes > 0
            && (pressure.available_bytes as f64)
                < self.config.pressure_available_fraction * pressure.total_bytes as f64)
            || pressure
                .some_avg10
                .is_some_and(|psi| psi > self.config.pressure_psi_some);
        let full_scans = sample.counters.full_scans.unwrap_or(0);
        if sample.mergeable_pages == 0 {
            if self.running {
                self.set_run(Run::Stop)?;
                events.push(Event::Stopped("no process has mergeable memory".into()));
            }
        } else if !self.running {
            let grew = self
                .stopped_at_mergeable
                .is_none_or(|at| sample.mergeable_pages > at + at / 4);
            if under_pressure || grew {
                self.set_run(Run::Merge)?;
                self.full_scans_at_start = full_scans;
                self.stopped_at_mergeable = None;
                events.push(Event::Started(if under_pressure {
                    "memory is under pressure".into()
                } else {
                    format!("{} mergeable pages", sample.mergeable_pages)
                }));
            }
        } else if !under_pressure && full_scans >= self.full_scans_at_start + SCANS_BEFORE_JUDGING {
            let profit = sample.counters.general_profit.unwrap_or(0);
            if profit < self.config.min_profit_bytes {
                self.set_run(Run::Stop)?;
                self.stopped_at_mergeable = Some(sample.mergeable_pages);
                events.push(Event::Stopped(format!(
                    "does not pay: net profit {profit} bytes after {SCANS_BEFORE_JUDGING} full scans (floor {})",
                    self.config.min_profit_bytes
                )));
            }
        }

        // Scan rate.
        if self.running {
            let wanted = VISITS_TO_MERGE as f64 * sample.mergeable_pages as f64
                / self.config.target_merge_seconds;
            let mut rate = wanted;
            let mut reason = format!(
                "{} mergeable pages visited {VISITS_TO_MERGE} times in {} s",
                sample.mergeable_pages, self.config.target_merge_seconds
            );
            if let Some(cost) = self.cpu_per_page {
                let allowed = self.config.cpu_cap / cost;
                if allowed < rate {
                    rate = allowed;
                    reason = format!(
                        "CPU cap {:.0}% at {:.2} µs per page",
                        100.0 * self.config.cpu_cap,
                        cost * 1e6
                    );
                }
            }
            if let Some(fraction) = ksmd_cpu_fraction {
                // Measured use over the cap: scale back at once, whatever the estimate says.
                if fraction > self.config.cpu_cap * 1.2 {
                    if let Some(actual) = scan_rate.filter(|r| *r > 0.0) {
                        let allowed = actual * self.config.cpu_cap / fraction;
                        if allowed < rate {
                            rate = allowed;
                            reason = format!(
                                "ksmd used {:.0}% CPU, cap {:.0}%",
                                100.0 * fraction,
                                100.0 * self.config.cpu_cap
                            );
                        }
                    }
                }
            }
            let pages = ((rate * self.config.sleep_millisecs as f64 / 1000.0).ceil() as u64)
                .clamp(self.config.min_pages_to_scan, self.config.max_pages_to_scan);
            // Change only on a real difference, so the knob does not flap.
            let differs = pages.abs_diff(self.pages_to_scan) * 10 > self.pages_to_scan;
            if differs {
                self.guard.set(Knob::PagesToScan, pages)?;
                self.pages_to_scan = pages;
                events.push(Event::Rate {
                    pages_to_scan: pages,
                    reason,
                });
            }
        }
        Ok(self.finish(sample, ksmd_cpu_fraction, scan_rate, events))
    }

    fn finish(
        &mut self,
        sample: Sample,
        ksmd_cpu_fraction: Option<f64>,
        scan_rate: Option<f64>,
        events: Vec<Event>,
    ) -> Tick {
        self.previous = Some(sample.clone());
        Tick {
            sample,
            ksmd_cpu_fraction,
            scan_rate,
            running: self.running,
            pages_to_scan: self.pages_to_scan,
            events,
        }
    }

    /// Puts back every knob the governor changed.
    pub fn restore(&mut self) -> Result<(), MemError> {
        self.guard.restore()
    }

    /// Puts back every knob the governor changed and hands back the KSM lock, for a caller
    /// that goes on checking or changing knobs.
    pub fn into_lock(mut self) -> Result<FileLock, MemError> {
        self.guard.restore()?;
        Ok(self.lock)
    }

    fn available(ksm: &Ksm) -> Result<(), MemError> {
        if ksm.available() {
            return Ok(());
        }
        Err(MemError::Unsupported(format!(
            "no KSM at {} (kernel built without CONFIG_KSM?)",
            ksm.root().display()
        )))
    }
}
