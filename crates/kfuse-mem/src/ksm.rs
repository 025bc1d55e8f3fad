//! The kernel's KSM, typed: every knob and counter under `/sys/kernel/mm/ksm`, the KSM lines of
//! `/proc/vmstat`, ksmd's CPU time, what this kernel supports, a guard that puts back every knob
//! it changed, and the savings arithmetic.
//!
//! Savings follow the kernel's own definitions (Documentation/admin-guide/mm/ksm.rst): the
//! memory saved is `pages_sharing` (plus `ksm_zero_pages` when `use_zero_pages` merges empty
//! pages into the zero page), not `pages_shared`, which counts the copies kept. The profit is
//! the saving minus the reverse-map items ksmd allocates for every page it tracks, which the
//! kernel reports as `general_profit`.

use std::fs;
use std::path::{Path, PathBuf};

use crate::sys;
use crate::MemError;

/// The default location of the KSM sysfs directory.
pub const SYSFS_KSM: &str = "/sys/kernel/mm/ksm";

/// Bytes of one reverse-map item (`struct ksm_rmap_item`) on 64-bit kernels.
pub const RMAP_ITEM_BYTES: u64 = 64;

/// A writable KSM setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Knob {
    /// 0 stops ksmd (merged pages stay merged), 1 runs it, 2 stops it and unmerges everything.
    Run,
    /// Pages scanned per wake-up.
    PagesToScan,
    /// Sleep between wake-ups, in milliseconds.
    SleepMillisecs,
    /// The most sites one KSM page may be shared by before a duplicate is made.
    MaxPageSharing,
    /// Whether pages on different NUMA nodes may merge.
    MergeAcrossNodes,
    /// Whether empty pages merge into the kernel's zero page.
    UseZeroPages,
    /// Whether ksmd skips pages that did not merge on recent scans (6.7).
    SmartScan,
    /// The scan advisor: `none` or `scan-time` (6.8), as 0 or 1.
    AdvisorMode,
    /// The advisor's CPU cap for ksmd, in percent.
    AdvisorMaxCpu,
    /// The advisor's upper bound on `pages_to_scan`.
    AdvisorMaxPagesToScan,
    /// The advisor's lower bound on `pages_to_scan`.
    AdvisorMinPagesToScan,
    /// The advisor's target time for one full scan, in seconds.
    AdvisorTargetScanTime,
    /// How often stale stable-node chains are pruned, in milliseconds.
    StableNodeChainsPruneMillisecs,
}

impl Knob {
    /// Every knob, in the order they are shown.
    pub const ALL: [Knob; 13] = [
        Knob::Run,
        Knob::PagesToScan,
        Knob::SleepMillisecs,
        Knob::MaxPageSharing,
        Knob::MergeAcrossNodes,
        Knob::UseZeroPages,
        Knob::SmartScan,
        Knob::AdvisorMode,
        Knob::AdvisorMaxCpu,
        Knob::AdvisorMaxPagesToScan,
        Knob::AdvisorMinPagesToScan,
        Knob::AdvisorTargetScanTime,
        Knob::StableNodeChainsPruneMillisecs,
    ];

    /// The sysfs file name.
    pub fn file(self) -> &'static str {
        match self {
            Knob::Run => "run",
            Knob::PagesToScan => "pages_to_scan",
            Knob::SleepMillisecs => "sleep_millisecs",
            Knob::MaxPageSharing => "max_page_sharing",
            Knob::MergeAcrossNodes => "merge_across_nodes",
            Knob::UseZeroPages => "use_zero_pages",
            Knob::SmartScan => "smart_scan",
            Knob::AdvisorMode => "advisor_mode",
            Knob::AdvisorMaxCpu => "advisor_max_cpu",
            Knob::AdvisorMaxPagesToScan => "advisor_max_pages_to_scan",
            Knob::AdvisorMinPagesToScan => "advisor_min_pages_to_scan",
            Knob::AdvisorTargetScanTime => "advisor_target_scan_time",
            Knob::StableNodeChainsPruneMillisecs => "stable_node_chains_prune_millisecs",
        }
    }

    /// The knob named by its sysfs file name.
    pub fn from_file(name: &str) -> Option<Knob> {
        Knob::ALL.into_iter().find(|k| k.file() == name)
    }
}

/// Values of [`Knob::Run`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Run {
    /// ksmd sleeps; merged pages stay merged.
    Stop = 0,
    /// ksmd scans and merges.
    Merge = 1,
    /// ksmd stops and every merged page is unmerged.
    Unmerge = 2,
}

/// The read-only KSM counters. A field is `None` where this kernel does not have the file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Full passes over all mergeable memory since ksmd started.
    pub full_scans: Option<u64>,
    /// Pages scanned so far (6.8).
    pub pages_scanned: Option<u64>,
    /// KSM pages in use: the single copies kept.
    pub pages_shared: Option<u64>,
    /// Extra sites mapping those copies: the pages saved.
    pub pages_sharing: Option<u64>,
    /// Pages ksmd skipped thanks to smart scan (6.7).
    pub pages_skipped: Option<u64>,
    /// Pages tracked but unique so far.
    pub pages_unshared: Option<u64>,
    /// Pages changing too fast to be merged.
    pub pages_volatile: Option<u64>,
    /// Empty pages merged into the zero page (6.10).
    pub ksm_zero_pages: Option<u64>,
    /// Bytes saved net of reverse-map cost, as the kernel reports it (6.4); may be negative.
    pub general_profit: Option<i64>,
    /// Chains of duplicate stable nodes (pages shared beyond `max_page_sharing`).
    pub stable_node_chains: Option<u64>,
    /// Duplicate stable nodes in those chains.
    pub stable_node_dups: Option<u64>,
}

/// The KSM lines of `/proc/vmstat`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KsmVmstat {
    /// Copy-on-write faults on KSM pages: writes that broke a merge (6.1).
    pub cow_ksm: Option<u64>,
    /// KSM pages copied on swap-in.
    pub ksm_swpin_copy: Option<u64>,
}

/// What this kernel's KSM offers, found by looking rather than by version number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Features {
    /// `uname -r`.
    pub kernel: String,
    /// The sysfs directory exists (CONFIG_KSM).
    pub ksm: bool,
    /// `prctl(PR_SET_MEMORY_MERGE)` (6.4).
    pub process_merging: bool,
    /// `/proc/<pid>/ksm_stat` (6.1).
    pub ksm_stat: bool,
    /// `general_profit` (6.4).
    pub general_profit: bool,
    /// `smart_scan` (6.7).
    pub smart_scan: bool,
    /// The scan advisor (6.8).
    pub advisor: bool,
    /// `cow_ksm` in vmstat.
    pub cow_ksm: bool,
    /// Writable knobs present.
    pub knobs: Vec<Knob>,
}

/// A handle on one KSM sysfs directory (the real one, or a copy for tests).
#[derive(Clone, Debug)]
pub struct Ksm {
    root: PathBuf,
    proc_root: PathBuf,
    /// Where the lock lives for a copy; `None` for the system's KSM, whose lock is
    /// machine-wide.
    state_dir: Option<PathBuf>,
}

impl Default for Ksm {
    fn default() -> Self {
        Ksm::system()
    }
}

impl Ksm {
    /// The running kernel's KSM.
    pub fn system() -> Ksm {
        Ksm {
            root: PathBuf::from(SYSFS_KSM),
            proc_root: PathBuf::from("/proc"),
            state_dir: None,
        }
    }

    /// KSM read from other directories: `root` in place of `/sys/kernel/mm/ksm` and `proc_root`
    /// in place of `/proc` (used by tests that must not touch the machine). Its lock lives in
    /// `root/.kfuse`, so a copy never contends with the machine's KSM.
    pub fn at(root: impl Into<PathBuf>, proc_root: impl Into<PathBuf>) -> Ksm {
        let root = root.into();
        Ksm {
            state_dir: Some(root.join(".kfuse")),
            root,
            proc_root: proc_root.into(),
        }
    }

    /// The sysfs directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether the directory exists (the kernel has KSM).
    pub fn available(&self) -> bool {
        self.root.join("run").exists()
    }

    fn read_raw(&self, file: &str) -> Result<Option<String>, MemError> {
        let path = self.root.join(file);
        match fs::read_to_string(&path) {
            Ok(text) => Ok(Some(text.trim().to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(MemError::io(&path, e)),
        }
    }

    fn read_counter(&self, file: &str) -> Result<Option<u64>, MemError> {
        match self.read_raw(file)? {
            None => Ok(None),
            Some(text) => text
                .parse()
                .map(Some)
                .map_err(|_| MemError::Parse(self.root.join(file), text)),
        }
    }

    /// The current value of a knob, or `None` where this kernel lacks it. `advisor_mode` reads
    /// as 0 (`none`) or 1 (`scan-time`).
    pub fn get(&self, knob: Knob) -> Result<Option<u64>, MemError> {
        if knob == Knob::AdvisorMode {
            return match self.read_raw(knob.file())? {
                None => Ok(None),
                Some(text) => match selected_choice(&text) {
                    Some("none") => Ok(Some(0)),
                    Some("scan-time") => Ok(Some(1)),
                    _ => Err(MemError::Parse(self.root.join(knob.file()), text)),
                },
            };
        }
        self.read_counter(knob.file())
    }

    /// Writes a knob. Prefer [`KnobGuard::set`], which puts the old value back.
    pub fn set(&self, knob: Knob, value: u64) -> Result<(), MemError> {
        let text = if knob == Knob::AdvisorMode {
            match value {
                0 => "none".to_string(),
                1 => "scan-time".to_string(),
                _ => return Err(MemError::BadValue(knob, value)),
            }
        } else {
            value.to_string()
        };
        self.write_raw(knob, &text)
    }

    fn write_raw(&self, knob: Knob, text: &str) -> Result<(), MemError> {
        let path = self.root.join(knob.file());
        if !path.exists() {
            return Err(MemError::Unsupported(format!(
                "this kernel has no KSM knob `{}`",
                knob.file()
            )));
        }
        fs::write(&path, text).map_err(|e| MemError::io(&path, e))
    }

    /// Every counter.
    pub fn counters(&self) -> Result<Counters, MemError> {
        Ok(Counters {
            full_scans: self.read_counter("full_scans")?,
            pages_scanned: self.read_counter("pages_scanned")?,
            pages_shared: self.read_counter("pages_shared")?,
            pages_sharing: self.read_counter("pages_sharing")?,
            pages_skipped: self.read_counter("pages_skipped")?,
            pages_unshared: self.read_counter("pages_unshared")?,
            pages_volatile: self.read_counter("pages_volatile")?,
            ksm_zero_pages: self.read_counter("ksm_zero_pages")?,
            general_profit: match self.read_raw("general_profit")? {
                None => None,
                Some(text) => Some(text.parse().map_err(|_| {
                    MemError::Parse(self.root.join("general_profit"), text.clone())
                })?),
            },
            stable_node_chains: self.read_counter("stable_node_chains")?,
            stable_node_dups: self.read_counter("stable_node_dups")?,
        })
    }

    /// Every knob this kernel has, with its value.
    pub fn settings(&self) -> Result<Vec<(Knob, u64)>, MemError> {
        let mut out = Vec::new();
        for knob in Knob::ALL {
            if let Some(value) = self.get(knob)? {
                out.push((knob, value));
            }
        }
        Ok(out)
    }

    /// The KSM lines of vmstat.
    pub fn vmstat(&self) -> Result<KsmVmstat, MemError> {
        let path = self.proc_root.join("vmstat");
        let text = fs::read_to_string(&path).map_err(|e| MemError::io(&path, e))?;
        let mut out = KsmVmstat::default();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            let (Some(name), Some(value)) = (words.next(), words.next()) else {
                continue;
            };
            let value = value.parse().ok();
            match name {
                "cow_ksm" => out.cow_ksm = value,
                "ksm_swpin_copy" => out.ksm_swpin_copy = value,
                _ => {}
            }
        }
        Ok(out)
    }

    /// What this kernel supports.
    pub fn features(&self) -> Result<Features, MemError> {
        let kernel = fs::read_to_string(self.proc_root.join("sys/kernel/osrelease"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let mut knobs = Vec::new();
        for knob in Knob::ALL {
            if self.root.join(knob.file()).exists() {
                knobs.push(knob);
            }
        }
        Ok(Features {
            kernel,
            ksm: self.available(),
            process_merging: self.proc_root.join("self/ksm_merging_pages").exists()
                && self.root.join("general_profit").exists(),
            ksm_stat: self.proc_root.join("self/ksm_stat").exists(),
            general_profit: self.root.join("general_profit").exists(),
            smart_scan: knobs.contains(&Knob::SmartScan),
            advisor: knobs.contains(&Knob::AdvisorMode),
            cow_ksm: self.vmstat()?.cow_ksm.is_some(),
            knobs,
        })
    }

    /// ksmd's process id, found by its name among kernel threads.
    pub fn ksmd_pid(&self) -> Option<u32> {
        let entries = fs::read_dir(&self.proc_root).ok()?;
        for entry in entries.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            if let Ok(comm) = fs::read_to_string(entry.path().join("comm")) {
                if comm.trim() == "ksmd" {
                    return Some(pid);
                }
            }
        }
        None
    }

    /// CPU seconds ksmd has used (user plus system), or `None` if it is not found.
    pub fn ksmd_cpu_seconds(&self) -> Option<f64> {
        let pid = self.ksmd_pid()?;
        let stat = fs::read_to_string(self.proc_root.join(format!("{pid}/stat"))).ok()?;
        cpu_seconds_from_stat(&stat)
    }

    /// The lock file that serializes programs changing these KSM settings:
    /// `/run/lock/kfuse-ksm.lock` for the system's (in the temporary directory where there is no
    /// `/run/lock`), `root/.kfuse/ksm.lock` for a copy.
    pub fn lock_path(&self) -> Result<PathBuf, MemError> {
        if let Some(dir) = &self.state_dir {
            fs::create_dir_all(dir).map_err(|e| MemError::io(dir, e))?;
            return Ok(dir.join("ksm.lock"));
        }
        let path = Path::new("/run/lock/kfuse-ksm.lock");
        Ok(if path.parent().is_some_and(|p| p.exists()) {
            path.to_path_buf()
        } else {
            std::env::temp_dir().join("kfuse-ksm.lock")
        })
    }

    /// Takes the machine-wide lock that serializes programs changing KSM settings, waiting for
    /// its holder to finish.
    pub fn lock(&self) -> Result<sys::FileLock, MemError> {
        let path = self.lock_path()?;
        sys::FileLock::exclusive(&path).map_err(|e| MemError::io(&path, e))
    }

    /// Takes the machine-wide KSM lock if nobody holds it; otherwise refuses, naming the
    /// holder's pid, since two programs steering ksmd at once undo each other's settings.
    pub fn try_lock(&self) -> Result<sys::FileLock, MemError> {
        let path = self.lock_path()?;
        match sys::FileLock::try_exclusive(&path) {
            Ok(lock) => Ok(lock),
            Err(sys::LockError::Io(e)) => Err(MemError::io(&path, e)),
            Err(sys::LockError::Held(holder)) => {
                let who = match holder {
                    Some(pid) => {
                        let name = fs::read_to_string(format!("/proc/{pid}/comm"))
                            .map(|n| format!(" ({})", n.trim()))
                            .unwrap_or_default();
                        format!("pid {pid}{name}")
                    }
                    None => "another process".to_string(),
                };
                Err(MemError::Refused(format!(
                    "{who} holds the KSM lock {}: another governor, or a program changing KSM \
                     settings, is running",
                    path.display()
                )))
            }
        }
    }
}

/// Where the system's record of changed knobs lives: on `/run`, a memory file system emptied at
/// boot, since the knobs are reset at boot too.
pub const SYSTEM_STATE_DIR: &str = "/run/kfuse";

/// The original values of KSM knobs that one process changed and has not put back yet, as it
/// recorded them (in [`Ksm::record_path`]) before changing any. A process killed by a signal it
/// cannot catch leaves the record behind, and the next program that takes the KSM lock puts the
/// knobs back ([`Ksm::recover`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnobRecord {
    /// The process that changed the knobs.
    pub pid: u32,
    /// Its start time in clock ticks after boot (`/proc/<pid>/stat`), which tells it from a
    /// later process given the same pid.
    pub start_time: u64,
    /// Each changed knob with the raw value to put back.
    pub knobs: Vec<(Knob, String)>,
}

const RECORD_HEADER: &str = "kfuse ksm knobs 1";

impl KnobRecord {
    /// An empty record of this process.
    fn of_this_process() -> Result<KnobRecord, MemError> {
        let pid = std::process::id();
        let start_time = start_time(pid).ok_or_else(|| {
            MemError::Parse(
                PathBuf::from("/proc/self/stat"),
                "no start time".to_string(),
            )
        })?;
        Ok(KnobRecord {
            pid,
            start_time,
            knobs: Vec::new(),
        })
    }

    /// Whether the process that wrote the record is this one.
    fn is_this_process(&self) -> bool {
        self.pid == std::process::id() && start_time(self.pid) == Some(self.start_time)
    }

    /// Whether the process that wrote the record still runs (and may still put its knobs back).
    pub fn writer_running(&self) -> bool {
        start_time(self.pid) == Some(self.start_time)
    }

    fn to_text(&self) -> String {
        let mut text = format!("{RECORD_HEADER}\npid {} {}\n", self.pid, self.start_time);
        for (knob, value) in &self.knobs {
            text += &format!("{} {value}\n", knob.file());
        }
        text
    }

    fn parse(text: &str, path: &Path) -> Result<KnobRecord, MemError> {
        let bad = |line: &str| MemError::Parse(path.to_path_buf(), line.to_string());
        let mut lines = text.lines();
        if lines.next() != Some(RECORD_HEADER) {
            return Err(bad(text.lines().next().unwrap_or("")));
        }
        let owner = lines.next().unwrap_or("");
        let mut words = owner.split_whitespace();
        let (Some("pid"), Some(pid), Some(start), None) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            return Err(bad(owner));
        };
        let mut record = KnobRecord {
            pid: pid.parse().map_err(|_| bad(owner))?,
            start_time: start.parse().map_err(|_| bad(owner))?,
            knobs: Vec::new(),
        };
        for line in lines {
            let (name, value) = line.split_once(' ').ok_or_else(|| bad(line))?;
            let knob = Knob::from_file(name).ok_or_else(|| bad(line))?;
            // Values go back into sysfs: only the words the kernel itself prints are accepted.
            if value.is_empty()
                || !value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(bad(line));
            }
            record.knobs.push((knob, value.to_string()));
        }
        Ok(record)
    }
}

/// A process's start time in clock ticks after boot, field 22 of `/proc/<pid>/stat`; `None` if
/// no such process runs.
fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: count fields after it, from
    // field 3.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// What [`Ksm::recover`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// No knobs wait to be put back.
    Nothing,
    /// The process that changed them still runs, and puts them back itself.
    WriterRunning(u32),
    /// Its knobs were put back.
    Restored(KnobRecord),
}

impl Ksm {
    fn state_dir(&self) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(SYSTEM_STATE_DIR))
    }

    /// The record of knobs changed and not yet put back: `/run/kfuse/ksm-knobs` for the
    /// system's KSM, `root/.kfuse/ksm-knobs` for a copy.
    pub fn record_path(&self) -> PathBuf {
        self.state_dir().join("ksm-knobs")
    }

    /// Creates the state directory if needed, mode 0700, and refuses one that another user
    /// could have prepared: it must be a real directory (not a link), owned by this user and
    /// writable by nobody else.
    fn secure_state_dir(&self) -> Result<PathBuf, MemError> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
        let dir = self.state_dir();
        match fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
        {
            Ok(()) => {}
            Err(e) => return Err(MemError::io(&dir, e)),
        }
        let meta = fs::symlink_metadata(&dir).map_err(|e| MemError::io(&dir, e))?;
        if !meta.is_dir() || meta.uid() != sys::effective_uid() || meta.mode() & 0o022 != 0 {
            return Err(MemError::Refused(format!(
                "{} is not a directory of this user closed to others; kfuse does not keep its \
                 record of KSM knobs there",
                dir.display()
            )));
        }
        Ok(dir)
    }

    /// The record of knobs changed and not yet put back, if there is one. A record this user
    /// does not own, or a link in its place, is refused.
    pub fn read_record(&self) -> Result<Option<KnobRecord>, MemError> {
        use std::io::Read;
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let path = self.record_path();
        let mut file = match fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
        {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(MemError::io(&path, e)),
        };
        let meta = file.metadata().map_err(|e| MemError::io(&path, e))?;
        if meta.uid() != sys::effective_uid() || meta.mode() & 0o077 != 0 {
            return Err(MemError::Refused(format!(
                "{} is not this user's private file; it is not trusted as a record of KSM knobs",
                path.display()
            )));
        }
        let mut text = String::new();
        file.read_to_string(&mut text)
            .map_err(|e| MemError::io(&path, e))?;
        KnobRecord::parse(&text, &path).map(Some)
    }

    /// Replaces the record atomically: a new file created exclusively (never through a link),
    /// mode 0600, synced, then renamed over the old one, so a crash leaves the old record or the
    /// new one, never a mix.
    fn write_record(&self, record: &KnobRecord) -> Result<(), MemError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let dir = self.secure_state_dir()?;
        let path = self.record_path();
        let temporary = dir.join(format!("ksm-knobs.{}.tmp", std::process::id()));
        // A file of this name is left only by a crashed process that had this pid.
        let _ = fs::remove_file(&temporary);
        let result = (|| {
            let mut file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&temporary)?;
            file.write_all(record.to_text().as_bytes())?;
            file.sync_all()?;
            fs::rename(&temporary, &path)
        })();
        if let Err(e) = result {
            let _ = fs::remove_file(&temporary);
            return Err(MemError::io(&path, e));
        }
        Ok(())
    }

    fn remove_record(&self) -> Result<(), MemError> {
        let path = self.record_path();
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(MemError::io(&path, e)),
        }
    }

    /// Puts back the knobs a process recorded and could not restore because it died (killed by
    /// SIGKILL, say), and removes the record; leaves the record of a process still running.
    /// The caller should hold the KSM lock, so that nobody changes knobs meanwhile.
    pub fn recover(&self) -> Result<Recovery, MemError> {
        let Some(record) = self.read_record()? else {
            return Ok(Recovery::Nothing);
        };
        if record.writer_running() {
            return Ok(Recovery::WriterRunning(record.pid));
        }
        self.write_back(&record.knobs)?;
        self.remove_record()?;
        Ok(Recovery::Restored(record))
    }

    /// Writes raw knob values, `run` last, so ksmd never runs on a half-restored configuration;
    /// reports the first failure after trying them all.
    fn write_back(&self, knobs: &[(Knob, String)]) -> Result<(), MemError> {
        let mut order: Vec<&(Knob, String)> = knobs.iter().rev().collect();
        order.sort_by_key(|(knob, _)| *knob == Knob::Run);
        let mut first_error = None;
        for (knob, raw) in order {
            if let Err(e) = self.write_raw(*knob, raw) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// The selected word of a sysfs choice list such as `[none] scan-time`.
fn selected_choice(text: &str) -> Option<&str> {
    if !text.contains('[') {
        return Some(text.trim());
    }
    text.split_whitespace()
        .find(|w| w.starts_with('['))
        .map(|w| w.trim_matches(|c| c == '[' || c == ']'))
}

/// User plus system CPU seconds from a `/proc/<pid>/stat` line.
pub fn cpu_seconds_from_stat(stat: &str) -> Option<f64> {
    // The command name is in parentheses and may hold spaces: count fields after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name come state (field 3) ... utime is field 14 and stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / sys::clock_ticks_per_second() as f64)
}

/// What merging saves, derived from the counters.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Savings {
    /// Bytes of one page.
    pub page_bytes: u64,
    /// Bytes no longer held because they map a shared copy: `(pages_sharing + ksm_zero_pages) *
    /// page`.
    pub saved_bytes: u64,
    /// Bytes of the shared copies themselves (`pages_shared * page`).
    pub shared_bytes: u64,
    /// Bytes of reverse-map items for every tracked page, where the kernel lets it be derived.
    pub rmap_bytes: Option<u64>,
    /// Saved bytes net of reverse-map cost (the kernel's `general_profit`), or the saving minus
    /// a lower bound on the rmap cost on kernels without it.
    pub profit_bytes: i64,
    /// Sites per shared copy (`(pages_shared + pages_sharing) / pages_shared`).
    pub sharing_factor: f64,
}

impl Savings {
    /// The savings these counters describe.
    pub fn from_counters(counters: &Counters, page_bytes: u64) -> Savings {
        let sharing = counters.pages_sharing.unwrap_or(0);
        let shared = counters.pages_shared.unwrap_or(0);
        let zero = counters.ksm_zero_pages.unwrap_or(0);
        let saved_bytes = (sharing + zero) * page_bytes;
        let (rmap_bytes, profit_bytes) = match counters.general_profit {
            Some(profit) => (Some((saved_bytes as i64 - profit).max(0) as u64), profit),
            None => {
                // Every merged or tracked page has at least one rmap item.
                let tracked = sharing + shared + counters.pages_unshared.unwrap_or(0);
                let rmap = tracked * RMAP_ITEM_BYTES;
                (None, saved_bytes as i64 - rmap as i64)
            }
        };
        Savings {
            page_bytes,
            saved_bytes,
            shared_bytes: shared * page_bytes,
            rmap_bytes,
            profit_bytes,
            sharing_factor: if shared == 0 {
                0.0
            } else {
                (shared + sharing) as f64 / shared as f64
            },
        }
    }
}

/// Changes KSM knobs and puts every one it changed back as it was, when dropped or on
/// [`KnobGuard::restore`]. `run` is restored last, so ksmd never runs with a half-restored
/// configuration. Before it changes a knob for the first time it records the knob's value in
/// [`Ksm::record_path`], so that the next program can put it back if this process is killed
/// before it restores; knobs left by a process that died that way are put back first.
pub struct KnobGuard {
    ksm: Ksm,
    saved: Vec<(Knob, String)>,
    restored: bool,
}

impl KnobGuard {
    /// A guard over `ksm` that has changed nothing yet.
    pub fn new(ksm: &Ksm) -> KnobGuard {
        KnobGuard {
            ksm: ksm.clone(),
            saved: Vec::new(),
            restored: false,
        }
    }

    /// Sets a knob, remembering (and recording) its first value.
    pub fn set(&mut self, knob: Knob, value: u64) -> Result<(), MemError> {
        if !self.saved.iter().any(|(k, _)| *k == knob) {
            let mut record = self.current_record()?;
            let raw = self.ksm.read_raw(knob.file())?.ok_or_else(|| {
                MemError::Unsupported(format!("this kernel has no KSM knob `{}`", knob.file()))
            })?;
            let raw = if knob == Knob::AdvisorMode {
                selected_choice(&raw).unwrap_or("none").to_string()
            } else {
                raw
            };
            // Another guard of this process may have changed the knob first: its value is the
            // original, and stays in the record.
            if !record.knobs.iter().any(|(k, _)| *k == knob) {
                record.knobs.push((knob, raw.clone()));
            }
            self.ksm.write_record(&record)?;
            self.saved.push((knob, raw));
        }
        self.ksm.set(knob, value)
    }

    /// The record this guard adds to: this process's own, or a fresh one once knobs left by a
    /// dead process are put back. Another running process's record means two programs are
    /// changing KSM settings at once, which is refused.
    fn current_record(&self) -> Result<KnobRecord, MemError> {
        match self.ksm.read_record()? {
            Some(record) if record.is_this_process() => Ok(record),
            Some(record) if record.writer_running() => Err(MemError::Refused(format!(
                "pid {} changed KSM settings and has not put them back yet (see {})",
                record.pid,
                self.ksm.record_path().display()
            ))),
            Some(_) => {
                self.ksm.recover()?;
                KnobRecord::of_this_process()
            }
            None => KnobRecord::of_this_process(),
        }
    }

    /// The knobs changed so far, with the values they will be restored to.
    pub fn changed(&self) -> &[(Knob, String)] {
        &self.saved
    }

    /// Puts every changed knob back; reports the first failure after trying them all. Once all
    /// are back they leave the record; after a failure they stay in it, for a later
    /// [`Ksm::recover`].
    pub fn restore(&mut self) -> Result<(), MemError> {
        self.restored = true;
        if self.saved.is_empty() {
            return Ok(());
        }
        self.ksm.write_back(&self.saved)?;
        let Some(mut record) = self.ksm.read_record()? else {
            return Ok(());
        };
        if !record.is_this_process() {
            return Ok(());
        }
        // Entries another guard of this process recorded first (with other values) stay.
        record.knobs.retain(|entry| !self.saved.contains(entry));
        if record.knobs.is_empty() {
            self.ksm.remove_record()
        } else {
            self.ksm.write_record(&record)
        }
    }
}

impl Drop for KnobGuard {
    fn drop(&mut self) {
        if !self.restored {
            if let Err(e) = self.restore() {
                eprintln!("kfuse-mem: could not restore a KSM knob: {e}");
            }
        }
    }
}

/// System memory pressure: `MemAvailable` and the PSI memory averages.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Pressure {
    /// `MemAvailable` in bytes.
    pub available_bytes: u64,
    /// `MemTotal` in bytes.
    pub total_bytes: u64,
    /// Share of the last 10 s in which some task stalled on memory (percent), if PSI is on.
    pub some_avg10: Option<f64>,
}

impl Ksm {
    /// The system's memory pressure now.
    pub fn pressure(&self) -> Result<Pressure, MemError> {
        let path = self.proc_root.join("meminfo");
        let text = fs::read_to_string(&path).map_err(|e| MemError::io(&path, e))?;
        let mut out = Pressure::default();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            let (Some(name), Some(kib)) = (words.next(), words.next()) else {
                continue;
            };
            let bytes = kib.parse::<u64>().unwrap_or(0) * 1024;
            match name {
                "MemAvailable:" => out.available_bytes = bytes,
                "MemTotal:" => out.total_bytes = bytes,
                _ => {}
            }
        }
        if let Ok(psi) = fs::read_to_string(self.proc_root.join("pressure/memory")) {
            out.some_avg10 = psi
                .lines()
                .find(|l| l.starts_with("some"))
                .and_then(|l| l.split_whitespace().find(|w| w.starts_with("avg10=")))
                .and_then(|w| w["avg10=".len()..].parse().ok());
        }
        Ok(out)
    }
}
