//! The cross-domain audit: which KSM pages are mapped by processes of different security
//! domains. Kernel KSM merges any identical mergeable pages, whoever owns them; a page shared
//! between two tenants is a channel between them (a write to it is measurably slower, which tells
//! one tenant what the other holds), and unrelated processes that suddenly share many pages are
//! an anomaly worth an alert.
//!
//! For every process, the mappings that hold KSM pages (the `KSM:` lines of `smaps`) are read
//! through `/proc/<pid>/pagemap` for page frame numbers, and each frame is checked in
//! `/proc/kpageflags` for the KSM flag. Frames seen in more than one domain are reported. Both
//! files give frame numbers to root only.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::PathBuf;

use crate::process::{Domain, DomainKind, Procfs};
use crate::{sys, MemError};

/// Bit of a pagemap entry: the page is present in RAM.
const PAGEMAP_PRESENT: u64 = 1 << 63;
/// Bits of a pagemap entry holding the frame number.
const PAGEMAP_PFN_MASK: u64 = (1 << 55) - 1;
/// Bit of a kpageflags entry: the frame is a KSM page.
const KPF_KSM: u64 = 1 << 21;

/// Pages shared by processes of more than one domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrossDomainShare {
    /// The domains whose processes map the same KSM pages.
    pub domains: Vec<Domain>,
    /// The processes involved: pid, name and domain.
    pub processes: Vec<(u32, String, Domain)>,
    /// How many KSM frames they share.
    pub pages: u64,
}

/// The result of one audit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditReport {
    /// Processes whose mappings were read.
    pub processes_scanned: usize,
    /// Distinct KSM frames seen.
    pub ksm_pages: u64,
    /// Frames seen in exactly one domain.
    pub same_domain_pages: u64,
    /// Groups of frames shared across domains, largest first.
    pub cross_domain: Vec<CrossDomainShare>,
}

impl AuditReport {
    /// Groups whose shared page count reaches `threshold`: what an operator is alerted to.
    pub fn anomalies(&self, threshold: u64) -> impl Iterator<Item = &CrossDomainShare> {
        self.cross_domain
            .iter()
            .filter(move |s| s.pages >= threshold)
    }
}

/// Reads frame numbers and page flags; needs root.
pub struct Auditor {
    procfs: Procfs,
    proc_root: PathBuf,
    kind: DomainKind,
}

impl Auditor {
    /// An auditor of the running system grouping processes by `kind`.
    pub fn new(kind: DomainKind) -> Auditor {
        Auditor {
            procfs: Procfs::system(),
            proc_root: PathBuf::from("/proc"),
            kind,
        }
    }

    /// Audits every process (or only `pids` when given).
    pub fn run(&self, pids: Option<&[u32]>) -> Result<AuditReport, MemError> {
        if self.kind == DomainKind::Label {
            self.procfs.check_labels()?;
        }
        if !sys::is_root() {
            return Err(MemError::NeedsRoot(
                "the audit reads page frame numbers from /proc/<pid>/pagemap and /proc/kpageflags"
                    .into(),
            ));
        }
        let flags_path = self.proc_root.join("kpageflags");
        let flags = File::open(&flags_path).map_err(|e| MemError::io(&flags_path, e))?;
        let pids = match pids {
            Some(p) => p.to_vec(),
            None => self.procfs.pids()?,
        };
        let self_pid = std::process::id();
        // Frame -> the processes mapping it.
        let mut frames: BTreeMap<u64, BTreeSet<(Domain, u32)>> = BTreeMap::new();
        let mut names: BTreeMap<u32, String> = BTreeMap::new();
        let mut scanned = 0;
        let mut ksm_flag_cache: BTreeMap<u64, bool> = BTreeMap::new();
        for pid in pids {
            if pid == self_pid {
                continue;
            }
            let Some(ranges) = self.ksm_ranges(pid)? else {
                continue;
            };
            let Some(domain) = self.procfs.domain(pid, self.kind)? else {
                continue;
            };
            scanned += 1;
            if ranges.is_empty() {
                continue;
            }
            let pagemap_path = self.procfs.dir(pid).join("pagemap");
            let Ok(pagemap) = File::open(&pagemap_path) else {
                continue;
            };
            let page = sys::page_size() as u64;
            for (start, end) in ranges {
                let entries =
                    sys::read_u64_entries(&pagemap, start / page, ((end - start) / page) as usize)
                        .map_err(|e| MemError::io(&pagemap_path, e))?;
                for entry in entries {
                    if entry & PAGEMAP_PRESENT == 0 {
                        continue;
                    }
                    let pfn = entry & PAGEMAP_PFN_MASK;
                    if pfn == 0 {
                        continue;
                    }
                    let is_ksm = match ksm_flag_cache.get(&pfn) {
                        Some(&known) => known,
                        None => {
                            let flag = sys::read_u64_entries(&flags, pfn, 1)
                                .map_err(|e| MemError::io(&flags_path, e))?
                                .first()
                                .is_some_and(|f| f & KPF_KSM != 0);
                            ksm_flag_cache.insert(pfn, flag);
                            flag
                        }
                    };
                    if is_ksm {
                        frames.entry(pfn).or_default().insert((domain.clone(), pid));
                    }
                }
            }
            if let Ok(Some(p)) = self.procfs.ksm(pid) {
                names.insert(pid, p.name);
            }
        }
        let mut report = AuditReport {
            processes_scanned: scanned,
            ksm_pages: frames.len() as u64,
            ..AuditReport::default()
        };
        // Domains sharing frames -> (the processes involved, frames shared).
        type Group = (BTreeSet<(u32, Domain)>, u64);
        let mut groups: BTreeMap<Vec<Domain>, Group> = BTreeMap::new();
        for mappers in frames.values() {
            let domains: BTreeSet<&Domain> = mappers.iter().map(|(d, _)| d).collect();
            if domains.len() < 2 {
                report.same_domain_pages += 1;
                continue;
            }
            let key: Vec<Domain> = domains.into_iter().cloned().collect();
            let group = groups.entry(key).or_default();
            group.1 += 1;
            for (domain, pid) in mappers {
                group.0.insert((*pid, domain.clone()));
            }
        }
        report.cross_domain = groups
            .into_iter()
            .map(|(domains, (processes, pages))| CrossDomainShare {
                domains,
                processes: processes
                    .into_iter()
                    .map(|(pid, domain)| {
                        (pid, names.get(&pid).cloned().unwrap_or_default(), domain)
                    })
                    .collect(),
                pages,
            })
            .collect();
        report
            .cross_domain
            .sort_by_key(|s| std::cmp::Reverse(s.pages));
        Ok(report)
    }

    /// Address ranges of a process's mappings that hold KSM pages; `None` if it has exited.
    fn ksm_ranges(&self, pid: u32) -> Result<Option<Vec<(u64, u64)>>, MemError> {
        let path = self.procfs.dir(pid).join("smaps");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(_) => return Ok(None),
        };
        Ok(Some(ksm_ranges_in_smaps(&text)))
    }
}

/// The `start-end` ranges of `smaps` entries whose `KSM:` line is above zero.
pub fn ksm_ranges_in_smaps(text: &str) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut current: Option<(u64, u64)> = None;
    for line in text.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((start, end)) = first.split_once('-') {
            if let (Ok(start), Ok(end)) =
                (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
            {
                current = Some((start, end));
                continue;
            }
        }
        if let Some(rest) = line.strip_prefix("KSM:") {
            let kib: u64 = rest
                .split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if kib > 0 {
                if let Some(range) = current {
                    out.push(range);
                }
            }
        }
    }
    out
}
