//! Per-process KSM figures (`/proc/<pid>/ksm_stat`, `ksm_merging_pages`, the `KSM:` lines of
//! `smaps`) and the security domain a process belongs to.

use std::fs;
use std::path::{Path, PathBuf};

use crate::MemError;

/// How processes are grouped into security domains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DomainKind {
    /// By real user id.
    Uid,
    /// By control group path (`/proc/<pid>/cgroup`).
    Cgroup,
    /// By security label (`/proc/<pid>/attr/current`: SELinux context or AppArmor profile);
    /// needs a security module that labels processes (see [`Procfs::check_labels`]).
    Label,
}

impl std::str::FromStr for DomainKind {
    type Err = MemError;
    fn from_str(text: &str) -> Result<Self, MemError> {
        match text {
            "uid" => Ok(DomainKind::Uid),
            "cgroup" => Ok(DomainKind::Cgroup),
            "label" => Ok(DomainKind::Label),
            _ => Err(MemError::Usage(format!(
                "unknown domain kind `{text}`: expected uid, cgroup or label"
            ))),
        }
    }
}

/// A security domain: processes in one domain may share pages, processes in different ones
/// must not.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Domain {
    /// Every process of one user.
    Uid(u32),
    /// Every process of one control group.
    Cgroup(String),
    /// Every process with one security label.
    Label(String),
}

impl std::fmt::Display for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Domain::Uid(uid) => write!(f, "uid:{uid}"),
            Domain::Cgroup(path) => write!(f, "cgroup:{path}"),
            Domain::Label(label) => write!(f, "label:{label}"),
        }
    }
}

impl std::str::FromStr for Domain {
    type Err = MemError;
    /// Parses `uid:N`, `cgroup:PATH` or `label:TEXT`.
    fn from_str(text: &str) -> Result<Self, MemError> {
        let bad = || {
            MemError::Usage(format!(
                "bad domain `{text}`: expected uid:N, cgroup:PATH or label:TEXT"
            ))
        };
        let (kind, value) = text.split_once(':').ok_or_else(bad)?;
        match kind {
            "uid" => value.parse().map(Domain::Uid).map_err(|_| bad()),
            "cgroup" if !value.is_empty() => Ok(Domain::Cgroup(value.to_string())),
            "label" if !value.is_empty() => Ok(Domain::Label(value.to_string())),
            _ => Err(bad()),
        }
    }
}

impl Domain {
    /// The kind of this domain.
    pub fn kind(&self) -> DomainKind {
        match self {
            Domain::Uid(_) => DomainKind::Uid,
            Domain::Cgroup(_) => DomainKind::Cgroup,
            Domain::Label(_) => DomainKind::Label,
        }
    }
}

/// One process's KSM figures.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessKsm {
    /// Process id.
    pub pid: u32,
    /// Command name.
    pub name: String,
    /// Real uid.
    pub uid: u32,
    /// Reverse-map items ksmd holds for this process (pages it tracks).
    pub rmap_items: u64,
    /// Pages of this process merged into the zero page.
    pub zero_pages: u64,
    /// Pages of this process that map a KSM page.
    pub merging_pages: u64,
    /// Bytes saved net of this process's rmap cost, as the kernel computes it.
    pub profit_bytes: i64,
    /// Process-wide merging is on (`prctl`).
    pub merge_any: bool,
    /// Some of its memory is mergeable.
    pub mergeable: bool,
}

/// Reads per-process figures from a `/proc`-like directory.
#[derive(Clone, Debug)]
pub struct Procfs {
    root: PathBuf,
}

impl Default for Procfs {
    fn default() -> Self {
        Procfs::system()
    }
}

impl Procfs {
    /// The running system's `/proc`.
    pub fn system() -> Procfs {
        Procfs {
            root: PathBuf::from("/proc"),
        }
    }

    /// A `/proc` copy at `root` (tests).
    pub fn at(root: impl Into<PathBuf>) -> Procfs {
        Procfs { root: root.into() }
    }

    /// The directory of one process.
    pub fn dir(&self, pid: u32) -> PathBuf {
        self.root.join(pid.to_string())
    }

    /// Every process id present now.
    pub fn pids(&self) -> Result<Vec<u32>, MemError> {
        let entries = fs::read_dir(&self.root).map_err(|e| MemError::io(&self.root, e))?;
        let mut pids: Vec<u32> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
            .collect();
        pids.sort_unstable();
        Ok(pids)
    }

    /// One process's KSM figures; `Ok(None)` if it has exited or hides them.
    pub fn ksm(&self, pid: u32) -> Result<Option<ProcessKsm>, MemError> {
        let dir = self.dir(pid);
        // `ksm_stat` came in 6.1; before it (5.19, 6.0) only `ksm_merging_pages` exists.
        let stat = match read_optional(&dir.join("ksm_stat"))? {
            Some(stat) => stat,
            None => match read_optional(&dir.join("ksm_merging_pages"))? {
                Some(pages) => format!("ksm_merging_pages {}", pages.trim()),
                None => return Ok(None),
            },
        };
        let Some(status) = read_optional(&dir.join("status"))? else {
            return Ok(None);
        };
        let mut out = ProcessKsm {
            pid,
            ..ProcessKsm::default()
        };
        for line in status.lines() {
            if let Some(name) = line.strip_prefix("Name:") {
                out.name = name.trim().to_string();
            } else if let Some(uids) = line.strip_prefix("Uid:") {
                out.uid = uids
                    .split_whitespace()
                    .next()
                    .and_then(|u| u.parse().ok())
                    .unwrap_or(0);
            }
        }
        for line in stat.lines() {
            let Some((key, value)) = line.split_once([' ', ':']) else {
                continue;
            };
            let value = value.trim_start_matches(':').trim();
            let number = || {
                value
                    .parse::<i64>()
                    .map_err(|_| MemError::Parse(dir.join("ksm_stat"), line.to_string()))
            };
            match key {
                "ksm_rmap_items" => out.rmap_items = number()? as u64,
                "ksm_zero_pages" => out.zero_pages = number()? as u64,
                "ksm_merging_pages" => out.merging_pages = number()? as u64,
                "ksm_process_profit" => out.profit_bytes = number()?,
                "ksm_merge_any" => out.merge_any = value == "yes",
                "ksm_mergeable" => out.mergeable = value == "yes",
                _ => {}
            }
        }
        Ok(Some(out))
    }

    /// KSM figures of every process that takes part in merging (mergeable or tracked), sorted by
    /// merging pages, largest first.
    pub fn merging_processes(&self) -> Result<Vec<ProcessKsm>, MemError> {
        let mut out = Vec::new();
        for pid in self.pids()? {
            if let Some(p) = self.ksm(pid)? {
                if p.mergeable || p.merge_any || p.rmap_items > 0 || p.merging_pages > 0 {
                    out.push(p);
                }
            }
        }
        out.sort_by(|a, b| {
            b.merging_pages
                .cmp(&a.merging_pages)
                .then(a.pid.cmp(&b.pid))
        });
        Ok(out)
    }

    /// Per-mapping figures from `smaps`: resident bytes in mergeable mappings and bytes mapped
    /// from KSM pages (the `KSM:` lines, 6.x).
    pub fn smaps_ksm(&self, pid: u32) -> Result<Option<SmapsKsm>, MemError> {
        let Some(text) = read_optional(&self.dir(pid).join("smaps"))? else {
            return Ok(None);
        };
        Ok(Some(SmapsKsm::parse(&text)))
    }

    /// A process's domain of the given kind; `Ok(None)` if it has exited.
    pub fn domain(&self, pid: u32, kind: DomainKind) -> Result<Option<Domain>, MemError> {
        let dir = self.dir(pid);
        match kind {
            DomainKind::Uid => {
                let Some(status) = read_optional(&dir.join("status"))? else {
                    return Ok(None);
                };
                let uid = status
                    .lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .and_then(|u| u.split_whitespace().next())
                    .and_then(|u| u.parse().ok())
                    .ok_or_else(|| MemError::Parse(dir.join("status"), "no Uid line".into()))?;
                Ok(Some(Domain::Uid(uid)))
            }
            DomainKind::Cgroup => {
                let Some(text) = read_optional(&dir.join("cgroup"))? else {
                    return Ok(None);
                };
                // cgroup v2 has one line `0::/path`; with v1 take the first controller line.
                let path = text
                    .lines()
                    .find(|l| l.starts_with("0::"))
                    .or_else(|| text.lines().next())
                    .and_then(|l| l.splitn(3, ':').nth(2))
                    .unwrap_or("/");
                Ok(Some(Domain::Cgroup(path.to_string())))
            }
            DomainKind::Label => {
                let path = dir.join("attr/current");
                let text = match fs::read_to_string(&path) {
                    Ok(text) => text,
                    // Without a security module the file cannot be read: every process would
                    // count as "unconfined", which separates nothing.
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Err(no_labels()),
                    Err(e) if gone(&e) => return Ok(None),
                    Err(e) => return Err(MemError::io(&path, e)),
                };
                let label = text.trim_end_matches('\0').trim();
                if label.is_empty() {
                    return Err(no_labels());
                }
                Ok(Some(Domain::Label(label.to_string())))
            }
        }
    }

    /// Refuses label domains where no security module (SELinux, AppArmor, Smack) labels
    /// processes: there `/proc/<pid>/attr/current` cannot be read, every process would count as
    /// `unconfined`, and a label domain would admit everyone.
    pub fn check_labels(&self) -> Result<(), MemError> {
        let path = self.root.join("self/attr/current");
        match fs::read_to_string(&path) {
            Ok(text) if !text.trim_end_matches('\0').trim().is_empty() => Ok(()),
            Ok(_) => Err(no_labels()),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) || gone(&e) => Err(no_labels()),
            Err(e) => Err(MemError::io(&path, e)),
        }
    }

    /// Resident and proportional set sizes from `smaps_rollup`, in bytes.
    pub fn rss_pss(&self, pid: u32) -> Result<Option<(u64, u64)>, MemError> {
        let Some(text) = read_optional(&self.dir(pid).join("smaps_rollup"))? else {
            return Ok(None);
        };
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
                .map(|kib| kib * 1024)
                .unwrap_or(0)
        };
        Ok(Some((field("Rss:"), field("Pss:"))))
    }
}

/// KSM-related totals over one process's mappings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SmapsKsm {
    /// Resident bytes in mappings marked mergeable (`mg` in VmFlags).
    pub mergeable_rss_bytes: u64,
    /// Bytes mapped from KSM pages (sum of `KSM:` lines).
    pub ksm_bytes: u64,
}

impl SmapsKsm {
    /// Totals from the text of a `smaps` file.
    pub fn parse(text: &str) -> SmapsKsm {
        let mut out = SmapsKsm::default();
        let mut rss = 0u64;
        let kib = |rest: &str| {
            rest.split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
                * 1024
        };
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("Rss:") {
                rss = kib(rest);
            } else if let Some(rest) = line.strip_prefix("KSM:") {
                out.ksm_bytes += kib(rest);
            } else if let Some(flags) = line.strip_prefix("VmFlags:") {
                if flags.split_whitespace().any(|f| f == "mg") {
                    out.mergeable_rss_bytes += rss;
                }
                rss = 0;
            }
        }
        out
    }
}

/// The refusal of a label domain on a machine without a labelling security module.
fn no_labels() -> MemError {
    MemError::Unsupported(
        "label domains need a security module that labels processes (SELinux, AppArmor or \
         Smack), and none is loaded here: every process would read as `unconfined`; use \
         uid:N or cgroup:PATH"
            .into(),
    )
}

/// Whether a read failed because the process is gone or hides the file: a process may exit
/// between listing and reading, and some files are hidden from other users.
fn gone(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
    ) || error.raw_os_error() == Some(libc::ESRCH)
}

fn read_optional(path: &Path) -> Result<Option<String>, MemError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if gone(&e) => Ok(None),
        Err(e) => Err(MemError::io(path, e)),
    }
}
