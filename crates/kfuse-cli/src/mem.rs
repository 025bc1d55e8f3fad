//! `kfuse mem`: memory fusion for operators. Kernel KSM status, live view, starting programs with
//! merging on, the governor, the cross-domain audit, and a demo of kernel KSM and the dedup pool
//! side by side.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use clap::Subcommand;
use kfuse_mem::audit::{AuditReport, Auditor};
use kfuse_mem::governor::{Governor, GovernorConfig, OutsiderAction};
use kfuse_mem::ksm::{Counters, Features, Knob, KnobGuard, Ksm, KsmVmstat, Recovery, Run, Savings};
use kfuse_mem::metrics::Exposition;
use kfuse_mem::pool::{Handle, Pool, PoolOptions};
use kfuse_mem::process::{Domain, DomainKind, ProcessKsm, Procfs};
use kfuse_mem::sys;
use serde_json::json;

#[derive(Subcommand)]
pub enum MemCommand {
    /// Global and per-process KSM figures: savings, profit net of reverse-map cost, scan cost,
    /// time to merge, write churn.
    Status {
        /// Print JSON.
        #[arg(long, conflicts_with = "prometheus")]
        json: bool,
        /// Print the Prometheus text exposition.
        #[arg(long)]
        prometheus: bool,
        /// Seconds over which rates (scan rate, ksmd CPU, COW faults) are measured.
        #[arg(long, default_value_t = 1.0)]
        window: f64,
    },
    /// A live view of KSM and the processes that merge, refreshed every interval.
    Top {
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 2.0)]
        interval: f64,
        /// Stop after this many refreshes (default: until interrupted).
        #[arg(long)]
        iterations: Option<u64>,
    },
    /// Start a program with KSM merging on for all its memory (prctl PR_SET_MEMORY_MERGE,
    /// inherited by its children).
    Run {
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Run the governor: scan rate from profit and ksmd CPU cost, on under pressure and off
    /// when merging does not pay, churn detection, domain admission. Knobs are restored on exit.
    Govern {
        /// Seconds in which all mergeable memory should be merged.
        #[arg(long, default_value_t = 10.0)]
        target_seconds: f64,
        /// The most CPU ksmd may use, as a fraction of one core.
        #[arg(long, default_value_t = 0.25)]
        cpu_cap: f64,
        /// Only processes of this domain may merge (uid:N, cgroup:PATH or label:TEXT).
        #[arg(long)]
        admit: Option<String>,
        /// What to do when an outsider has mergeable memory.
        #[arg(long, value_parser = ["stop", "unmerge"], default_value = "stop")]
        on_outsider: String,
        /// Net profit (bytes) below which merging stops after four full scans.
        #[arg(long, default_value_t = 1 << 20)]
        min_profit: i64,
        /// Seconds between decisions.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Stop after this many seconds (default: until interrupted).
        #[arg(long)]
        duration: Option<f64>,
        /// Print one JSON object per tick.
        #[arg(long)]
        json: bool,
    },
    /// Put back KSM settings that a kfuse process changed and could not restore because it was
    /// killed (needs root). Every other `kfuse mem` command run as root does this first too.
    Restore,
    /// Find KSM pages mapped by processes of different security domains (needs root).
    Audit {
        /// How processes are grouped into domains.
        #[arg(long, value_parser = ["uid", "cgroup", "label"], default_value = "uid")]
        domain: String,
        /// Shared pages from which a pair of domains is reported as an anomaly.
        #[arg(long, default_value_t = 16)]
        threshold: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Exit with status 3 when an anomaly is found.
        #[arg(long)]
        fail_on_anomaly: bool,
    },
    /// Start worker processes holding the same weights and show memory before and after, through
    /// kernel KSM and through the dedup pool.
    Demo {
        /// Worker processes.
        #[arg(long, default_value_t = 4)]
        workers: usize,
        /// MiB of weights per worker.
        #[arg(long, default_value_t = 64)]
        mib: usize,
        /// First merge another team of workers at the kernel's default scan rate (100 pages
        /// every 20 ms), and report how much faster the governor merges.
        #[arg(long)]
        race_defaults: bool,
    },
    /// Hold synthetic weights until standard input closes (the demo's and tests' worker).
    #[command(hide = true)]
    Hold {
        /// MiB of weights.
        #[arg(long)]
        mib: usize,
        /// Seed of the weights: equal seeds give equal bytes.
        #[arg(long)]
        seed: u64,
        /// Mark the weights mergeable for kernel KSM.
        #[arg(long, conflicts_with = "pool")]
        merge: bool,
        /// Map the weights from the pool served on this socket instead of holding a copy.
        #[arg(long, value_name = "SOCKET")]
        pool: Option<PathBuf>,
    },
}

pub fn mem(command: MemCommand) -> Result<()> {
    match command {
        // The worker runs many times over in the demo and the tests; it changes no setting.
        MemCommand::Hold { .. } | MemCommand::Restore => {}
        _ => recover_abandoned_knobs(),
    }
    match command {
        MemCommand::Restore => restore(),
        MemCommand::Status {
            json,
            prometheus,
            window,
        } => status(json, prometheus, window),
        MemCommand::Top {
            interval,
            iterations,
        } => top(interval, iterations),
        MemCommand::Run { command } => run(&command),
        MemCommand::Govern {
            target_seconds,
            cpu_cap,
            admit,
            on_outsider,
            min_profit,
            interval,
            duration,
            json,
        } => {
            let config = GovernorConfig {
                target_merge_seconds: target_seconds,
                cpu_cap,
                admit: admit.map(|a| a.parse()).transpose()?,
                on_outsider: if on_outsider == "unmerge" {
                    OutsiderAction::Unmerge
                } else {
                    OutsiderAction::Stop
                },
                min_profit_bytes: min_profit,
                ..GovernorConfig::default()
            };
            govern(config, interval, duration, json)
        }
        MemCommand::Audit {
            domain,
            threshold,
            json,
            fail_on_anomaly,
        } => audit(domain.parse()?, threshold, json, fail_on_anomaly),
        MemCommand::Demo {
            workers,
            mib,
            race_defaults,
        } => demo(workers, mib, race_defaults),
        MemCommand::Hold {
            mib,
            seed,
            merge,
            pool,
        } => hold(mib, seed, merge, pool.as_deref()),
    }
}

/// The knobs of a record, as `name=value` words.
fn knob_list(knobs: &[(Knob, String)]) -> String {
    knobs
        .iter()
        .map(|(knob, value)| format!("{}={value}", knob.file()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Puts back KSM knobs that a kfuse process recorded before changing them and never restored
/// (a governor killed by SIGKILL cannot clean up after itself), saying so on standard error.
/// Needs root and the KSM lock; a busy lock means a program is at work on KSM, and is told.
fn recover_abandoned_knobs() {
    let ksm = Ksm::system();
    if !sys::is_root() || !ksm.available() || !ksm.record_path().exists() {
        return;
    }
    let _lock = match ksm.try_lock() {
        Ok(lock) => lock,
        Err(e) => {
            eprintln!(
                "note: KSM settings changed by an earlier kfuse may wait to be put back ({e})"
            );
            return;
        }
    };
    match ksm.recover() {
        Ok(Recovery::Restored(record)) => eprintln!(
            "note: put back KSM settings that pid {} changed and could not restore: {}",
            record.pid,
            knob_list(&record.knobs)
        ),
        Ok(Recovery::Nothing | Recovery::WriterRunning(_)) => {}
        Err(e) => {
            eprintln!("warning: could not put back KSM settings left by an earlier kfuse: {e}")
        }
    }
}

fn restore() -> Result<()> {
    let ksm = Ksm::system();
    if !sys::is_root() {
        bail!(
            "putting back KSM settings writes /sys/kernel/mm/ksm and reads {}: it needs root",
            ksm.record_path().display()
        );
    }
    let _lock = ksm.try_lock()?;
    match ksm.recover()? {
        Recovery::Nothing => println!("no KSM settings wait to be put back"),
        Recovery::WriterRunning(pid) => bail!(
            "pid {pid} changed the KSM settings and still runs: it puts them back when it stops"
        ),
        Recovery::Restored(record) => println!(
            "put back the KSM settings pid {} changed: {}",
            record.pid,
            knob_list(&record.knobs)
        ),
    }
    Ok(())
}

/// One reading of everything `status` shows.
struct Snapshot {
    at: Instant,
    features: Features,
    settings: Vec<(Knob, u64)>,
    counters: Counters,
    vmstat: KsmVmstat,
    ksmd_cpu: Option<f64>,
    processes: Vec<ProcessKsm>,
}

fn snapshot(ksm: &Ksm) -> Result<Snapshot> {
    if !ksm.available() {
        bail!(
            "this kernel has no KSM: {} is missing",
            ksm.root().display()
        );
    }
    Ok(Snapshot {
        at: Instant::now(),
        features: ksm.features()?,
        settings: ksm.settings()?,
        counters: ksm.counters()?,
        vmstat: ksm.vmstat()?,
        ksmd_cpu: ksm.ksmd_cpu_seconds(),
        processes: Procfs::system().merging_processes()?,
    })
}

/// Rates between two snapshots.
struct Rates {
    seconds: f64,
    pages_scanned_per_second: Option<f64>,
    ksmd_cpu_fraction: Option<f64>,
    cow_per_second: Option<f64>,
}

fn rates(before: &Snapshot, after: &Snapshot) -> Rates {
    let seconds = after.at.duration_since(before.at).as_secs_f64().max(1e-9);
    let delta = |a: Option<u64>, b: Option<u64>| Some(b?.saturating_sub(a?) as f64 / seconds);
    Rates {
        seconds,
        pages_scanned_per_second: delta(
            before.counters.pages_scanned,
            after.counters.pages_scanned,
        ),
        ksmd_cpu_fraction: before
            .ksmd_cpu
            .zip(after.ksmd_cpu)
            .map(|(a, b)| (b - a).max(0.0) / seconds),
        cow_per_second: delta(before.vmstat.cow_ksm, after.vmstat.cow_ksm),
    }
}

fn knob_value(settings: &[(Knob, u64)], knob: Knob) -> Option<u64> {
    settings.iter().find(|(k, _)| *k == knob).map(|(_, v)| *v)
}

/// Pages ksmd tracks (one rmap item each): what one full scan walks.
fn tracked_pages(s: &Snapshot) -> u64 {
    s.processes.iter().map(|p| p.rmap_items).sum()
}

/// Seconds for one full scan at the configured rate.
fn configured_scan_seconds(s: &Snapshot) -> Option<f64> {
    let pages = knob_value(&s.settings, Knob::PagesToScan)? as f64;
    let sleep = knob_value(&s.settings, Knob::SleepMillisecs)? as f64 / 1000.0;
    let tracked = tracked_pages(s) as f64;
    (pages > 0.0).then(|| tracked / pages * sleep)
}

fn status_json(s: &Snapshot, r: &Rates) -> serde_json::Value {
    let page = sys::page_size() as u64;
    let savings = Savings::from_counters(&s.counters, page);
    let full_scan = configured_scan_seconds(s);
    json!({
        "kernel": s.features.kernel,
        "features": {
            "process_merging": s.features.process_merging,
            "ksm_stat": s.features.ksm_stat,
            "general_profit": s.features.general_profit,
            "smart_scan": s.features.smart_scan,
            "advisor": s.features.advisor,
            "cow_ksm": s.features.cow_ksm,
        },
        "knobs": s.settings.iter().map(|(k, v)| (k.file().to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "counters": {
            "full_scans": s.counters.full_scans,
            "pages_scanned": s.counters.pages_scanned,
            "pages_shared": s.counters.pages_shared,
            "pages_sharing": s.counters.pages_sharing,
            "pages_skipped": s.counters.pages_skipped,
            "pages_unshared": s.counters.pages_unshared,
            "pages_volatile": s.counters.pages_volatile,
            "ksm_zero_pages": s.counters.ksm_zero_pages,
            "general_profit": s.counters.general_profit,
            "stable_node_chains": s.counters.stable_node_chains,
            "stable_node_dups": s.counters.stable_node_dups,
            "cow_ksm": s.vmstat.cow_ksm,
            "ksm_swpin_copy": s.vmstat.ksm_swpin_copy,
        },
        "savings": {
            "saved_bytes": savings.saved_bytes,
            "shared_bytes": savings.shared_bytes,
            "rmap_bytes": savings.rmap_bytes,
            "profit_bytes": savings.profit_bytes,
            "sharing_factor": savings.sharing_factor,
        },
        "rates": {
            "window_seconds": r.seconds,
            "pages_scanned_per_second": r.pages_scanned_per_second,
            "ksmd_cpu_fraction": r.ksmd_cpu_fraction,
            "cow_faults_per_second": r.cow_per_second,
        },
        "tracked_pages": tracked_pages(s),
        "full_scan_seconds": full_scan,
        "time_to_merge_seconds": full_scan.map(|t| kfuse_mem::governor::VISITS_TO_MERGE as f64 * t),
        "processes": s.processes.iter().map(|p| json!({
            "pid": p.pid, "name": p.name, "uid": p.uid,
            "rmap_items": p.rmap_items, "merging_pages": p.merging_pages,
            "zero_pages": p.zero_pages, "profit_bytes": p.profit_bytes,
            "merge_any": p.merge_any, "mergeable": p.mergeable,
        })).collect::<Vec<_>>(),
    })
}

fn status_prometheus(s: &Snapshot, r: &Rates) -> String {
    let page = sys::page_size() as u64;
    let savings = Savings::from_counters(&s.counters, page);
    let mut e = Exposition::new();
    let c = &s.counters;
    let gauges: [(&str, &str, Option<u64>); 7] = [
        (
            "kfuse_ksm_pages_shared",
            "KSM pages in use (the kept copies)",
            c.pages_shared,
        ),
        (
            "kfuse_ksm_pages_sharing",
            "Sites sharing KSM pages (pages saved)",
            c.pages_sharing,
        ),
        (
            "kfuse_ksm_pages_unshared",
            "Pages tracked but unique",
            c.pages_unshared,
        ),
        (
            "kfuse_ksm_pages_volatile",
            "Pages changing too fast to merge",
            c.pages_volatile,
        ),
        (
            "kfuse_ksm_zero_pages",
            "Empty pages merged into the zero page",
            c.ksm_zero_pages,
        ),
        (
            "kfuse_ksm_stable_node_chains",
            "Chains of duplicate stable nodes",
            c.stable_node_chains,
        ),
        (
            "kfuse_ksm_stable_node_dups",
            "Duplicate stable nodes",
            c.stable_node_dups,
        ),
    ];
    for (name, help, value) in gauges {
        if let Some(v) = value {
            e.single(name, "gauge", help, v as f64);
        }
    }
    let counters: [(&str, &str, Option<u64>); 5] = [
        (
            "kfuse_ksm_full_scans_total",
            "Full scans by ksmd",
            c.full_scans,
        ),
        (
            "kfuse_ksm_pages_scanned_total",
            "Pages scanned by ksmd",
            c.pages_scanned,
        ),
        (
            "kfuse_ksm_pages_skipped_total",
            "Pages skipped by smart scan",
            c.pages_skipped,
        ),
        (
            "kfuse_ksm_cow_faults_total",
            "Copy-on-write faults on KSM pages",
            s.vmstat.cow_ksm,
        ),
        (
            "kfuse_ksm_swapin_copies_total",
            "KSM pages copied on swap-in",
            s.vmstat.ksm_swpin_copy,
        ),
    ];
    for (name, help, value) in counters {
        if let Some(v) = value {
            e.single(name, "counter", help, v as f64);
        }
    }
    e.single(
        "kfuse_ksm_saved_bytes",
        "gauge",
        "Bytes saved by merging",
        savings.saved_bytes as f64,
    );
    e.single(
        "kfuse_ksm_profit_bytes",
        "gauge",
        "Bytes saved net of reverse-map cost",
        savings.profit_bytes as f64,
    );
    if let Some(rmap) = savings.rmap_bytes {
        e.single(
            "kfuse_ksm_rmap_bytes",
            "gauge",
            "Bytes of reverse-map items",
            rmap as f64,
        );
    }
    if let Some(cpu) = s.ksmd_cpu {
        e.single(
            "kfuse_ksmd_cpu_seconds_total",
            "counter",
            "CPU time used by ksmd",
            cpu,
        );
    }
    if let Some(f) = r.ksmd_cpu_fraction {
        e.single(
            "kfuse_ksmd_cpu_fraction",
            "gauge",
            "ksmd CPU use over the window, of one core",
            f,
        );
    }
    e.family("kfuse_ksm_knob", "gauge", "KSM settings");
    for (knob, value) in &s.settings {
        e.sample("kfuse_ksm_knob", &[("knob", knob.file())], *value as f64);
    }
    // Each per-process family: its name, its help text and the value of one process.
    type Family = (&'static str, &'static str, fn(&ProcessKsm) -> f64);
    let per_process: [Family; 2] = [
        (
            "kfuse_ksm_process_merging_pages",
            "Pages of a process mapping KSM pages",
            |p| p.merging_pages as f64,
        ),
        (
            "kfuse_ksm_process_profit_bytes",
            "A process's saving net of its rmap cost",
            |p| p.profit_bytes as f64,
        ),
    ];
    for (name, help, value) in per_process {
        e.family(name, "gauge", help);
        for p in &s.processes {
            let (pid, uid) = (p.pid.to_string(), p.uid.to_string());
            let labels = [
                ("pid", pid.as_str()),
                ("name", p.name.as_str()),
                ("uid", uid.as_str()),
            ];
            e.sample(name, &labels, value(p));
        }
    }
    e.finish()
}

fn mib(bytes: impl Into<f64>) -> String {
    format!("{:.1} MiB", bytes.into() / (1 << 20) as f64)
}

fn opt<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or("n/a".to_string(), |v| v.to_string())
}

fn status_text(s: &Snapshot, r: &Rates) -> String {
    let page = sys::page_size() as u64;
    let savings = Savings::from_counters(&s.counters, page);
    let mut out = String::new();
    let run = match knob_value(&s.settings, Knob::Run) {
        Some(0) => "stopped",
        Some(1) => "running",
        Some(2) => "unmerging",
        _ => "unknown",
    };
    out += &format!("KSM on Linux {}: ksmd {run}\n", s.features.kernel);
    out += &format!(
        "  saved       {} ({} sharing pages{}), kept copies {}\n",
        mib(savings.saved_bytes as f64),
        opt(s.counters.pages_sharing),
        s.counters
            .ksm_zero_pages
            .filter(|z| *z > 0)
            .map_or(String::new(), |z| format!(" + {z} zero pages")),
        mib(savings.shared_bytes as f64),
    );
    out += &format!(
        "  profit      {} net of {} reverse-map items; sharing factor {:.2}\n",
        mib(savings.profit_bytes as f64),
        savings
            .rmap_bytes
            .map_or("(unknown)".to_string(), |b| mib(b as f64)),
        savings.sharing_factor
    );
    out += &format!(
        "  scanning    {} pages per {} ms; {} pages/s measured over {:.1} s; ksmd CPU {}\n",
        opt(knob_value(&s.settings, Knob::PagesToScan)),
        opt(knob_value(&s.settings, Knob::SleepMillisecs)),
        r.pages_scanned_per_second
            .map_or("n/a".into(), |v| format!("{v:.0}")),
        r.seconds,
        r.ksmd_cpu_fraction
            .map_or("n/a".into(), |f| format!("{:.1}%", 100.0 * f)),
    );
    let visits = kfuse_mem::governor::VISITS_TO_MERGE as f64;
    if tracked_pages(s) == 0 {
        out += "  merging     no pages tracked by ksmd\n";
    } else {
        out += &format!(
            "  merging     {} tracked pages: a full scan takes {} at this rate, a new duplicate merges within {}\n",
            tracked_pages(s),
            configured_scan_seconds(s).map_or("n/a".into(), |t| format!("{t:.1} s")),
            configured_scan_seconds(s).map_or("n/a".into(), |t| format!("{:.1} s", visits * t)),
        );
    }
    out += &format!(
        "  churn       {} COW faults/s on merged pages; {} volatile pages; {} unshared\n",
        r.cow_per_second.map_or("n/a".into(), |v| format!("{v:.0}")),
        opt(s.counters.pages_volatile),
        opt(s.counters.pages_unshared),
    );
    if s.processes.is_empty() {
        out += "  no process takes part in merging\n";
    } else {
        out += &format!(
            "  {:>7} {:16} {:>6} {:>12} {:>12} {:>12}  {}\n",
            "pid", "name", "uid", "merging", "tracked", "profit", "mode"
        );
        for p in &s.processes {
            out += &format!(
                "  {:>7} {:16} {:>6} {:>12} {:>12} {:>12}  {}\n",
                p.pid,
                p.name,
                p.uid,
                mib((p.merging_pages * page) as f64),
                p.rmap_items,
                mib(p.profit_bytes as f64),
                if p.merge_any {
                    "process"
                } else if p.mergeable {
                    "regions"
                } else {
                    "-"
                }
            );
        }
    }
    out
}

fn status(json: bool, prometheus: bool, window: f64) -> Result<()> {
    if !(window.is_finite() && window >= 0.0) {
        bail!("--window must be a non-negative number of seconds");
    }
    let ksm = Ksm::system();
    let before = snapshot(&ksm)?;
    std::thread::sleep(Duration::from_secs_f64(window));
    let after = snapshot(&ksm)?;
    let r = rates(&before, &after);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&status_json(&after, &r))?
        );
    } else if prometheus {
        print!("{}", status_prometheus(&after, &r));
    } else {
        print!("{}", status_text(&after, &r));
    }
    Ok(())
}

fn top(interval: f64, iterations: Option<u64>) -> Result<()> {
    if !(interval.is_finite() && interval > 0.0) {
        bail!("--interval must be a positive number of seconds");
    }
    sys::install_stop_handlers();
    let ksm = Ksm::system();
    let mut before = snapshot(&ksm)?;
    let clear = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut n = 0;
    while iterations.is_none_or(|limit| n < limit) && !sys::stop_requested() {
        std::thread::sleep(Duration::from_secs_f64(interval));
        let after = snapshot(&ksm)?;
        let r = rates(&before, &after);
        let mut screen = String::new();
        if clear {
            screen += "\x1b[H\x1b[2J";
        }
        screen += &format!("kfuse mem top (every {interval} s, ctrl-c to stop)\n");
        screen += &status_text(&after, &r);
        if !emit(&screen)? {
            break;
        }
        before = after;
        n += 1;
    }
    Ok(())
}

/// Writes `text` to standard output at once; `Ok(false)` when the reader has gone (a closed
/// pipe, as in `kfuse mem govern | head -1`), which ends a loop as SIGINT does, so the loop can
/// put back what it changed and exit quietly.
fn emit(text: &str) -> Result<bool> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e.into()),
    }
}

fn run(command: &[String]) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let (program, args) = command.split_first().context("no command given")?;
    sys::set_process_merging(true).context(
        "cannot turn on merging for the process (prctl PR_SET_MEMORY_MERGE needs Linux 6.4 or newer)",
    )?;
    if Ksm::system().get(Knob::Run).ok().flatten() != Some(1) {
        eprintln!(
            "note: ksmd is not running, so nothing merges until it is started \
             (`kfuse mem govern`, or write 1 to /sys/kernel/mm/ksm/run)"
        );
    }
    let error = Command::new(program).args(args).exec();
    Err(anyhow::Error::new(error).context(format!("cannot start `{program}`")))
}

fn govern(config: GovernorConfig, interval: f64, duration: Option<f64>, json: bool) -> Result<()> {
    if !(interval.is_finite() && interval > 0.0) {
        bail!("--interval must be a positive number of seconds");
    }
    if !sys::is_root() {
        bail!("the governor changes /sys/kernel/mm/ksm settings and needs root");
    }
    sys::install_stop_handlers();
    let mut governor = Governor::new(config)?;
    let start = Instant::now();
    let page = sys::page_size() as u64;
    loop {
        let tick = governor.tick()?;
        let text = if json {
            format!(
                "{}\n",
                json!({
                    "seconds": start.elapsed().as_secs_f64(),
                    "running": tick.running,
                    "pages_to_scan": tick.pages_to_scan,
                    "mergeable_pages": tick.sample.mergeable_pages,
                    "pages_sharing": tick.sample.counters.pages_sharing,
                    "profit_bytes": tick.sample.counters.general_profit,
                    "ksmd_cpu_fraction": tick.ksmd_cpu_fraction,
                    "scan_rate": tick.scan_rate,
                    "events": tick.events.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
                })
            )
        } else {
            let saved = Savings::from_counters(&tick.sample.counters, page);
            let mut text = format!(
                "[{:6.1} s] {} pages_to_scan {:6}  mergeable {}  saved {}  ksmd {}\n",
                start.elapsed().as_secs_f64(),
                if tick.running { "merging" } else { "idle   " },
                tick.pages_to_scan,
                mib((tick.sample.mergeable_pages * page) as f64),
                mib(saved.saved_bytes as f64),
                tick.ksmd_cpu_fraction
                    .map_or("n/a".into(), |f| format!("{:.1}% CPU", 100.0 * f)),
            );
            for event in &tick.events {
                text += &format!("           {event}\n");
            }
            text
        };
        if !emit(&text)? {
            break;
        }
        let deadline = Instant::now() + Duration::from_secs_f64(interval);
        while Instant::now() < deadline && !sys::stop_requested() {
            std::thread::sleep(Duration::from_millis(20));
        }
        if sys::stop_requested() || duration.is_some_and(|d| start.elapsed().as_secs_f64() >= d) {
            break;
        }
    }
    governor.restore()?;
    eprintln!("governor stopped; every KSM setting it changed is restored");
    Ok(())
}

fn audit_json(report: &AuditReport, threshold: u64) -> serde_json::Value {
    json!({
        "processes_scanned": report.processes_scanned,
        "ksm_pages": report.ksm_pages,
        "same_domain_pages": report.same_domain_pages,
        "threshold": threshold,
        "cross_domain": report.cross_domain.iter().map(|s| json!({
            "domains": s.domains.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
            "pages": s.pages,
            "anomaly": s.pages >= threshold,
            "processes": s.processes.iter().map(|(pid, name, domain)| json!({
                "pid": pid, "name": name, "domain": domain.to_string(),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

fn audit(kind: DomainKind, threshold: u64, json: bool, fail_on_anomaly: bool) -> Result<()> {
    let report = Auditor::new(kind).run(None)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&audit_json(&report, threshold))?
        );
    } else {
        println!(
            "audited {} processes: {} KSM pages, {} within one domain, {} groups shared across domains",
            report.processes_scanned,
            report.ksm_pages,
            report.same_domain_pages,
            report.cross_domain.len()
        );
        for share in &report.cross_domain {
            let domains: Vec<String> = share.domains.iter().map(|d| d.to_string()).collect();
            println!(
                "{} {} pages shared by {}",
                if share.pages >= threshold {
                    "ANOMALY"
                } else {
                    "note   "
                },
                share.pages,
                domains.join(" and ")
            );
            for (pid, name, domain) in &share.processes {
                println!("          {pid:>7} {name:16} {domain}");
            }
        }
    }
    if fail_on_anomaly && report.anomalies(threshold).next().is_some() {
        std::process::exit(3);
    }
    Ok(())
}

/// Synthetic weights: `mib` MiB of pseudo-random bytes fixed by `seed` (splitmix64).
pub fn weights(seed: u64, mib: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let mut out = Vec::with_capacity(mib << 20);
    while out.len() < mib << 20 {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.chunks(8).fold(0u64, |acc, c| {
        acc.rotate_left(5) ^ u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))
    })
}

fn hold(mib: usize, seed: u64, merge: bool, pool: Option<&Path>) -> Result<()> {
    let expected = weights(seed, mib);
    // Keep whichever holds the bytes alive until stdin closes.
    let (_region, _mapping, bytes_checksum);
    if let Some(socket) = pool {
        let stream = UnixStream::connect(socket)
            .with_context(|| format!("cannot connect to the pool at {}", socket.display()))?;
        let handle = Handle::receive(&stream)?;
        let mapping = handle.map()?;
        if mapping.as_slice() != &expected[..] {
            bail!(
                "the pool's `{}` does not hold the expected weights",
                handle.name()
            );
        }
        drop(expected);
        bytes_checksum = checksum(mapping.as_slice());
        _mapping = Some(mapping);
        _region = None;
    } else {
        let mut region = sys::Region::anonymous(expected.len())?;
        region.as_mut_slice()[..expected.len()].copy_from_slice(&expected);
        drop(expected);
        if merge {
            region.set_mergeable(true)?;
        }
        bytes_checksum = checksum(region.as_slice());
        _region = Some(region);
        _mapping = None;
    }
    println!("ready {} {bytes_checksum:016x}", std::process::id());
    std::io::stdout().flush()?;
    // Wait for the parent to close our stdin.
    let mut sink = String::new();
    while std::io::stdin().read_line(&mut sink)? > 0 {
        sink.clear();
    }
    Ok(())
}

/// The next connection on a non-blocking listener, waiting at most `limit`.
fn accept_within(listener: &UnixListener, limit: Duration) -> Result<UnixStream> {
    let deadline = Instant::now() + limit;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                return Ok(stream);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                bail!(
                    "no worker connected to the pool within {} s",
                    limit.as_secs()
                )
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Worker processes that hold weights; closing their stdin ends them.
struct Workers {
    children: Vec<Child>,
}

impl Workers {
    fn start(count: usize, args: &[String], uid: Option<u32>) -> Result<Workers> {
        use std::os::unix::process::CommandExt;
        let exe = std::env::current_exe().context("cannot find the kfuse executable")?;
        let mut children = Vec::new();
        for _ in 0..count {
            let mut command = Command::new(&exe);
            command
                .arg("mem")
                .arg("hold")
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            if let Some(uid) = uid {
                command.uid(uid).gid(uid);
            }
            children.push(command.spawn().context("cannot start a worker")?);
        }
        let mut workers = Workers { children };
        for child in &mut workers.children {
            let mut line = String::new();
            BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line)?;
            if !line.starts_with("ready") {
                let mut message = String::new();
                std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut message)?;
                let status = child.wait()?;
                bail!(
                    "a worker failed ({status}): {}",
                    message.trim().trim_start_matches("error: ")
                );
            }
        }
        Ok(workers)
    }

    fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|c| c.id()).collect()
    }

    /// Sum of RSS and PSS over the workers, in bytes.
    fn memory(&self) -> (u64, u64) {
        let procfs = Procfs::system();
        self.pids()
            .into_iter()
            .filter_map(|pid| procfs.rss_pss(pid).ok().flatten())
            .fold((0, 0), |(r, p), (rss, pss)| (r + rss, p + pss))
    }

    /// Bytes of the workers' memory that maps KSM pages.
    fn ksm_bytes(&self) -> u64 {
        let procfs = Procfs::system();
        self.pids()
            .into_iter()
            .filter_map(|pid| procfs.smaps_ksm(pid).ok().flatten())
            .map(|s| s.ksm_bytes)
            .sum()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for child in &mut self.children {
            drop(child.stdin.take());
        }
        for child in &mut self.children {
            let _ = child.wait();
        }
    }
}

fn demo(workers: usize, mib_each: usize, race_defaults: bool) -> Result<()> {
    if workers == 0 || mib_each == 0 {
        bail!("the demo needs at least one worker and one MiB");
    }
    let total = (workers * (mib_each << 20)) as f64;
    println!(
        "{workers} worker processes each hold the same {mib_each} MiB of weights ({} in all).\n",
        mib(total)
    );
    demo_kernel_ksm(workers, mib_each, race_defaults)?;
    println!();
    demo_pool(workers, mib_each)
}

/// Seconds until `team`'s pages map KSM pages (95% of them), calling `drive` every 200 ms, and
/// whether they did within a minute.
fn time_to_merge(
    team: &Workers,
    mib_each: usize,
    mut drive: impl FnMut() -> Result<()>,
) -> Result<(f64, bool)> {
    let want = (team.children.len() * (mib_each << 20)) as u64 * 95 / 100;
    let start = Instant::now();
    let mut last_drive = Instant::now() - Duration::from_secs(1);
    while team.ksm_bytes() < want {
        if start.elapsed() > Duration::from_secs(60) {
            return Ok((start.elapsed().as_secs_f64(), false));
        }
        if last_drive.elapsed() >= Duration::from_millis(200) {
            drive()?;
            last_drive = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((start.elapsed().as_secs_f64(), true))
}

fn demo_kernel_ksm(workers: usize, mib_each: usize, race_defaults: bool) -> Result<()> {
    println!("1. Kernel KSM: the workers mark their copies mergeable and ksmd merges them.");
    let ksm = Ksm::system();
    if !ksm.available() || !sys::is_root() {
        println!(
            "   skipped: {}",
            if ksm.available() {
                "starting ksmd needs root"
            } else {
                "this kernel has no KSM"
            }
        );
        return Ok(());
    }
    // The demo changes knobs itself around the governor's run, so it takes the lock first and
    // lends it to the governor.
    let lock = ksm.lock()?;
    let args = |seed: u64| {
        vec![
            "--mib".to_string(),
            mib_each.to_string(),
            "--seed".into(),
            seed.to_string(),
            "--merge".into(),
        ]
    };
    let defaults_took = if race_defaults {
        // Another team, holding other bytes, so that nothing it merges helps the governed run.
        let team = Workers::start(workers, &args(2), None)?;
        let mut guard = KnobGuard::new(&ksm);
        guard.set(Knob::PagesToScan, 100)?;
        guard.set(Knob::SleepMillisecs, 20)?;
        guard.set(Knob::Run, Run::Merge as u64)?;
        let (took, merged) = time_to_merge(&team, mib_each, || Ok(()))?;
        guard.restore()?;
        if merged {
            println!(
                "   at the kernel's default rate (100 pages every 20 ms) another team merged in \
                 {took:.1} s"
            );
        } else {
            println!("   at the kernel's default rate another team did not merge within 60 s");
        }
        merged.then_some(took)
    } else {
        None
    };
    let team = Workers::start(workers, &args(1), None)?;
    let (rss0, pss0) = team.memory();
    println!(
        "   before: RSS {}  PSS {} (what the workers really use)",
        mib(rss0 as f64),
        mib(pss0 as f64)
    );
    let config = GovernorConfig {
        target_merge_seconds: 2.0,
        cpu_cap: 0.5,
        min_profit_bytes: 0,
        ..GovernorConfig::default()
    };
    let mut governor = Governor::holding(lock, config, Ksm::system(), Procfs::system())?;
    let (took, merged) = time_to_merge(&team, mib_each, || {
        for event in &governor.tick()?.events {
            println!("   governor: {event}");
        }
        Ok(())
    })?;
    let (rss1, pss1) = team.memory();
    let counters = ksm.counters()?;
    let savings = Savings::from_counters(&counters, sys::page_size() as u64);
    governor.restore()?;
    println!(
        "   after {took:.1} s: RSS {}  PSS {}; {} of the workers' pages map KSM pages",
        mib(rss1 as f64),
        mib(pss1 as f64),
        mib(team.ksm_bytes() as f64)
    );
    println!(
        "   KSM counters: saved {} (pages_sharing), profit {} net of reverse-map items",
        mib(savings.saved_bytes as f64),
        mib(savings.profit_bytes as f64)
    );
    if let (Some(defaults), true) = (defaults_took, merged) {
        println!(
            "   the governor merged them {:.1}x as fast as the kernel's default rate",
            defaults / took
        );
    }
    println!(
        "   every KSM setting is restored; the workers exit and their merged pages go with them"
    );
    Ok(())
}

fn demo_pool(workers: usize, mib_each: usize) -> Result<()> {
    println!("2. The dedup pool: the weights go into a sealed memfd pool once; workers map them.");
    let domain = Domain::Uid(sys::effective_uid());
    let mut pool = Pool::new(
        domain.clone(),
        PoolOptions {
            same_behaviour: true,
        },
    )?;
    let bytes = weights(1, mib_each);
    let inserted = Instant::now();
    let own = pool.insert("weights", &bytes)?;
    let insert_seconds = inserted.elapsed().as_secs_f64();
    drop(bytes);
    let dir = std::env::temp_dir().join(format!("kfuse-mem-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let socket = dir.join("pool.sock");
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket)
        .with_context(|| format!("cannot listen on {}", socket.display()))?;
    // Anyone may connect: the pool's own domain check (SO_PEERCRED) decides who is served.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777))?;
    }
    listener.set_nonblocking(true)?;
    // Every worker asks the pool for the same weights.
    let pool_worker_args = vec![
        "--mib".to_string(),
        mib_each.to_string(),
        "--seed".into(),
        "1".into(),
        "--pool".into(),
        socket.display().to_string(),
    ];
    // Serve each worker as it connects, checking its domain.
    let server = std::thread::scope(|scope| -> Result<Workers> {
        let pool = &pool;
        let listener = &listener;
        let serving = scope.spawn(move || -> Result<()> {
            for _ in 0..workers {
                let stream = accept_within(listener, Duration::from_secs(30))?;
                pool.serve(&stream, "weights")?;
            }
            Ok(())
        });
        let team = Workers::start(workers, &pool_worker_args, None);
        serving.join().expect("the pool server thread")?;
        team
    })?;
    let (rss, pss) = server.memory();
    let stats = pool.stats();
    println!(
        "   inserted {} in {:.3} s; {} workers mapped it at once (no scan delay)",
        mib((mib_each << 20) as f64),
        insert_seconds,
        workers
    );
    println!(
        "   workers: RSS {}  PSS {}: one copy of the weights, shared copy-on-write",
        mib(rss as f64),
        mib(pss as f64)
    );
    println!(
        "   pool for {}: {} entries, {} pooled",
        stats.domain,
        stats.entries,
        mib(stats.pooled_bytes as f64),
    );
    if sys::is_root() {
        // A worker of another domain asks for the same weights and is refused.
        let stranger = std::thread::scope(|scope| {
            let pool = &pool;
            let listener = &listener;
            let serving = scope.spawn(move || -> Result<()> {
                let stream = accept_within(listener, Duration::from_secs(30))?;
                let _ = pool.serve(&stream, "weights");
                Ok(())
            });
            let result = Workers::start(1, &pool_worker_args, Some(65534));
            let _ = serving.join();
            result
        });
        match stranger {
            Ok(_) => bail!("a worker of uid 65534 was served weights of {domain}"),
            Err(e) => println!("   a worker running as uid 65534 asked too and was refused ({e})"),
        }
    }
    drop(server);
    drop(own);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
