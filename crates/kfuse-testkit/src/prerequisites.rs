//! What a test needs from the machine, and skipping visibly when it is missing.
//!
//! libtest captures what a passing test prints with `eprintln!`, so a skip said that way never
//! shows in `cargo test`'s output, and a CI run whose machine lacks root or AVX-512 passes while
//! testing little. [`skip`] writes to the standard error descriptor itself, past the capture,
//! and in CI turns a prerequisite CI promises into a failure.

use std::io::Write;
use std::os::fd::AsFd;

/// Something a test needs from the machine it runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prerequisite {
    /// Root privileges (changing KSM settings, running processes as another user).
    Root,
    /// AVX-512 F and DQ, which kfuse's hand-written kernels use.
    Avx512,
    /// A C compiler (`cc`), for compiled kernels.
    CCompiler,
    /// KSM in the kernel (`/sys/kernel/mm/ksm`).
    Ksm,
    /// Something CI does not promise, such as clang or a kernel feature newer than CI's.
    Optional,
}

impl Prerequisite {
    /// What CI promises, named for the message when it is missing there; `None` for
    /// [`Prerequisite::Optional`]. CI runs as root on a CPU with AVX-512, with a C compiler, on a
    /// kernel with KSM.
    fn promised_by_ci(self) -> Option<&'static str> {
        match self {
            Prerequisite::Root => Some("root"),
            Prerequisite::Avx512 => Some("AVX-512"),
            Prerequisite::CCompiler => Some("a C compiler"),
            Prerequisite::Ksm => Some("KSM in the kernel"),
            Prerequisite::Optional => None,
        }
    }
}

/// Whether this CPU has the AVX-512 subsets kfuse's kernels use (F and DQ).
pub fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512dq")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether an environment value means yes: `1` or `true`.
fn yes(value: Option<&str>) -> bool {
    matches!(value.map(str::trim), Some("1" | "true"))
}

/// Whether a missing prerequisite fails the test instead of skipping it, given the values of
/// `CI` and `KFUSE_ALLOW_SKIP`: in CI (`CI` set to anything but empty, `0` or `false`) a
/// prerequisite CI promises must be there, unless `KFUSE_ALLOW_SKIP` is `1` or `true`.
pub fn skip_fails(missing: Prerequisite, ci: Option<&str>, allow_skip: Option<&str>) -> bool {
    let in_ci = ci.is_some_and(|v| !matches!(v.trim(), "" | "0" | "false"));
    in_ci && !yes(allow_skip) && missing.promised_by_ci().is_some()
}

/// Skips a test, visibly: writes `SKIPPED <test>: <reason>` to the process's standard error
/// descriptor, which libtest does not capture, so the line shows in `cargo test`'s normal
/// output. In CI it panics instead where CI promises the prerequisite (see [`skip_fails`]). The
/// caller returns after it, or goes on with the parts of the test that can run.
pub fn skip(test: &str, missing: Prerequisite, reason: &str) {
    let ci = std::env::var("CI").ok();
    let allow = std::env::var("KFUSE_ALLOW_SKIP").ok();
    if skip_fails(missing, ci.as_deref(), allow.as_deref()) {
        panic!(
            "{test} cannot run: {reason}. CI promises {}; set KFUSE_ALLOW_SKIP=1 to skip anyway",
            missing.promised_by_ci().unwrap_or("it")
        );
    }
    let line = format!("SKIPPED {test}: {reason}\n");
    // A duplicate of descriptor 2 written as a file: neither `eprint!` nor `io::stderr()`,
    // either of which a test harness may capture.
    let written = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map(std::fs::File::from)
        .and_then(|mut file| file.write_all(line.as_bytes()));
    if written.is_err() {
        eprint!("{line}");
    }
}
