//! kfuse memory fusion: same-page merging, in the kernel and in user space.
//!
//! - [`ksm`]: the kernel's KSM, typed (knobs, counters, vmstat, features, savings), with a guard
//!   that restores every knob it changed;
//! - [`process`]: per-process KSM figures and security domains;
//! - [`sys`]: the system calls (regions with `madvise`, `prctl`, sealed memfds, descriptor
//!   passing);
//! - [`audit`]: KSM pages shared across security domains;
//! - [`governor`]: a closed-loop controller for ksmd's scan rate, with churn detection and
//!   domain admission;
//! - [`pool`]: the user-space dedup pool for read-only data, per security domain;
//! - [`probe`]: the write-timing probe that tells merged pages from unmerged ones;
//! - [`metrics`]: Prometheus text exposition.
//!
//! This crate depends on nothing in the compiler.

pub mod audit;
pub mod governor;
pub mod ksm;
pub mod metrics;
pub mod pool;
pub mod probe;
pub mod process;
pub mod sys;

use std::path::{Path, PathBuf};

/// Errors from memory fusion. `Unsupported` and `NeedsRoot` are limits of the machine or the
/// user, the rest name the file or call that failed.
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    /// A file could not be read or written.
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    /// A file did not hold what the kernel documents.
    #[error("{0}: unexpected content `{1}`")]
    Parse(PathBuf, String),
    /// A system call failed.
    #[error("{0} failed: {1}")]
    Os(String, std::io::Error),
    /// A knob was given a value it does not take.
    #[error("KSM knob `{knob}` does not take the value {1}", knob = .0.file())]
    BadValue(ksm::Knob, u64),
    /// The kernel lacks a feature.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The operation needs root.
    #[error("needs root: {0}")]
    NeedsRoot(String),
    /// A request was refused, for example a pool handle asked for from another domain.
    #[error("{0}")]
    Refused(String),
    /// A pool handle message was malformed.
    #[error("bad pool handle: {0}")]
    BadHandle(String),
    /// A caller asked for something that does not exist or cannot be done.
    #[error("{0}")]
    Usage(String),
}

impl MemError {
    fn io(path: &Path, error: std::io::Error) -> MemError {
        if error.kind() == std::io::ErrorKind::PermissionDenied && !sys::is_root() {
            return MemError::NeedsRoot(format!("{}: {error}", path.display()));
        }
        MemError::Io(path.to_path_buf(), error)
    }
}
