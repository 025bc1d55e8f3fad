//! The memory this machine has available, as the operating system reports it: the figure every
//! buffer a program asks for is checked against before it is allocated.

use kfuse_ir::MemoryLimit;

/// What the machine has available now: `MemAvailable` in `/proc/meminfo` (free memory plus the
/// caches the kernel would give back), so a buffer that fits is one the machine can hold
/// without swapping or the out-of-memory killer. Where the file cannot be read (not Linux),
/// there is no figure and only the allocator refuses a buffer. A container's cgroup limit,
/// which may be lower, is not read.
pub fn available_memory() -> MemoryLimit {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_available(&text))
        .map_or(MemoryLimit::NONE, MemoryLimit::available)
}

/// The `MemAvailable:` line of `/proc/meminfo`, in bytes.
fn mem_available(meminfo: &str) -> Option<usize> {
    let line = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemAvailable:"))?;
    let kib: usize = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_in_bytes() {
        let text =
            "MemTotal:       32768000 kB\nMemFree:         1000 kB\nMemAvailable:   24000000 kB\n";
        assert_eq!(mem_available(text), Some(24_000_000 * 1024));
        assert_eq!(mem_available("MemFree: 1000 kB\n"), None);
        assert_eq!(mem_available("MemAvailable: lots\n"), None);
    }

    #[test]
    fn this_machine_reports_a_figure() {
        if cfg!(target_os = "linux") {
            let bytes = available_memory().available_bytes();
            assert!(bytes.is_some_and(|b| b > 0), "{bytes:?}");
        }
    }
}
