//! The system calls memory fusion needs, wrapped safely: anonymous regions with `madvise`,
//! process-wide merging with `prctl`, sealed memfds and private file mappings, and passing file
//! descriptors between processes with their sender's credentials. All `unsafe` in the crate is
//! here.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// `prctl` options added in Linux 6.4 (not yet in every libc).
const PR_SET_MEMORY_MERGE: libc::c_int = 67;
const PR_GET_MEMORY_MERGE: libc::c_int = 68;

/// A `sysconf` value, or `default` where the system does not say.
fn sysconf_or(name: libc::c_int, default: u64) -> u64 {
    // SAFETY: sysconf has no memory effects.
    let value = unsafe { libc::sysconf(name) };
    if value > 0 {
        value as u64
    } else {
        default
    }
}

/// The size of a base page on this machine.
pub fn page_size() -> usize {
    sysconf_or(libc::_SC_PAGESIZE, 4096) as usize
}

/// Clock ticks per second, the unit of `utime` and `stime` in `/proc/<pid>/stat`.
pub fn clock_ticks_per_second() -> u64 {
    sysconf_or(libc::_SC_CLK_TCK, 100)
}

/// Whether this process runs with an effective uid of 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The effective uid of this process.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

fn check(result: libc::c_int) -> io::Result<libc::c_int> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

/// Turns KSM merging on or off for every present and future anonymous mapping of this process
/// (`prctl(PR_SET_MEMORY_MERGE)`, Linux 6.4). The setting is inherited across `fork` and kept
/// across `execve`, which is how `kfuse mem run` starts a program with merging on.
pub fn set_process_merging(on: bool) -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    check(unsafe { libc::prctl(PR_SET_MEMORY_MERGE, on as libc::c_ulong, 0, 0, 0) }).map(|_| ())
}

/// Whether process-wide merging is on for this process.
pub fn process_merging() -> io::Result<bool> {
    // SAFETY: prctl with integer arguments only.
    check(unsafe { libc::prctl(PR_GET_MEMORY_MERGE, 0, 0, 0, 0) }).map(|r| r != 0)
}

/// An owned, page-aligned anonymous private mapping, readable and writable.
pub struct Region {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the region is plain memory owned by this value.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

impl Region {
    /// Maps `len` bytes (rounded up to whole pages) of zeroed anonymous memory.
    pub fn anonymous(len: usize) -> io::Result<Region> {
        let len = round_up(len.max(1), page_size());
        // SAFETY: a fresh anonymous mapping; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Region {
            ptr: ptr as *mut u8,
            len,
        })
    }

    /// Reserves `len` bytes of address space (rounded up to pages) that are then filled with
    /// [`Region::map_file_private`] and [`Region::fill_anonymous`].
    pub fn reserve(len: usize) -> io::Result<Region> {
        Region::anonymous(len)
    }

    /// The length in bytes (whole pages).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never: regions are at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte's address.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// The bytes of the region.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is readable for `len` bytes while `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes of the region, writable. A write to a page that is shared (merged by KSM, or
    /// mapped privately from a pool) is copied by the kernel first.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is writable for `len` bytes and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Marks the region mergeable (`MADV_MERGEABLE`) or not (`MADV_UNMERGEABLE`, which also
    /// breaks every merge in it).
    pub fn set_mergeable(&self, on: bool) -> io::Result<()> {
        let advice = if on {
            libc::MADV_MERGEABLE
        } else {
            libc::MADV_UNMERGEABLE
        };
        // SAFETY: advice on a mapping this value owns.
        check(unsafe { libc::madvise(self.ptr as *mut libc::c_void, self.len, advice) }).map(|_| ())
    }

    /// Replaces pages `[offset, offset + len)` of the region with a private (copy-on-write)
    /// mapping of `file` at `file_offset`. Offsets and length must be page multiples.
    pub fn map_file_private(
        &mut self,
        offset: usize,
        len: usize,
        file: &File,
        file_offset: u64,
    ) -> io::Result<()> {
        self.check_range(offset, len)?;
        // SAFETY: MAP_FIXED inside a range this value owns; the old pages are replaced.
        let ptr = unsafe {
            libc::mmap(
                self.ptr.add(offset) as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_FIXED,
                file.as_raw_fd(),
                file_offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Replaces pages `[offset, offset + bytes.len())` with fresh anonymous memory holding
    /// `bytes` (rounded up to pages, the tail zeroed).
    pub fn fill_anonymous(&mut self, offset: usize, bytes: &[u8]) -> io::Result<()> {
        let len = round_up(bytes.len().max(1), page_size());
        self.check_range(offset, len)?;
        // SAFETY: MAP_FIXED inside a range this value owns.
        let ptr = unsafe {
            libc::mmap(
                self.ptr.add(offset) as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        self.as_mut_slice()[offset..offset + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }

    fn check_range(&self, offset: usize, len: usize) -> io::Result<()> {
        let page = page_size();
        if !offset.is_multiple_of(page) || !len.is_multiple_of(page) || offset + len > self.len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "range {offset}+{len} is not page-aligned inside a {}-byte region",
                    self.len
                ),
            ));
        }
        Ok(())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmapping the range this value mapped.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.len);
        }
    }
}

/// Rounds `n` up to a multiple of `to`.
pub fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

/// Creates an anonymous memory file that accepts seals.
pub fn memfd(name: &str) -> io::Result<File> {
    let name = std::ffi::CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "memfd name has a NUL byte"))?;
    // SAFETY: a valid C string; the result is checked.
    let fd = check(unsafe {
        libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    })?;
    // SAFETY: a fresh descriptor owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// The seals that make a memfd immutable: no writes, no growing, no shrinking, no more seals.
pub const FULL_SEALS: libc::c_int =
    libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;

/// Adds `seals` to a memfd.
pub fn add_seals(file: &File, seals: libc::c_int) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we hold.
    check(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) }).map(|_| ())
}

/// The seals on a memfd.
pub fn seals(file: &File) -> io::Result<libc::c_int> {
    // SAFETY: fcntl on a descriptor we hold.
    check(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) })
}

/// The uid, gid and pid of the process at the other end of a Unix socket (`SO_PEERCRED`).
pub fn peer_credentials(stream: &UnixStream) -> io::Result<(u32, u32, i32)> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    check(unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    })?;
    Ok((cred.uid, cred.gid, cred.pid))
}

/// `SO_PEERPIDFD` (Linux 6.5): a pidfd of the process that connected. The asm-generic value,
/// which x86-64 and arm64 use; not yet in every libc.
const SO_PEERPIDFD: libc::c_int = 77;

/// A process pinned by a pidfd: the descriptor keeps referring to that very process, whatever
/// later process is given its pid. Facts read from `/proc/<pid>` belong to the pinned process if
/// it is still there once they have been read, since a pid is reused only after its process is
/// gone.
pub struct PinnedProcess {
    pid: i32,
    pidfd: OwnedFd,
}

impl PinnedProcess {
    /// Pins the process at the other end of a Unix socket, whose pid `SO_PEERCRED` gave as `pid`.
    /// The kernel's own pidfd of the connecting process is used where it has one
    /// (`SO_PEERPIDFD`); elsewhere the pid is opened at once (`pidfd_open`, Linux 5.3), which
    /// leaves only the moment since the peer connected for its pid to be reused. Fails with
    /// `ESRCH` if the peer is already gone.
    pub fn peer(stream: &UnixStream, pid: i32) -> io::Result<PinnedProcess> {
        let mut fd: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `fd`.
        let peer = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_PEERPIDFD,
                &mut fd as *mut libc::c_int as *mut libc::c_void,
                &mut len,
            )
        };
        if peer == 0 && fd >= 0 {
            // SAFETY: a fresh descriptor the kernel gave us.
            let pidfd = unsafe { OwnedFd::from_raw_fd(fd) };
            return Ok(PinnedProcess { pid, pidfd });
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            // A kernel before 6.5: open the pid while the peer is most likely still there.
            Some(libc::ENOPROTOOPT) => PinnedProcess::open(pid),
            // The kernel knows the option but has no process to give: the peer is gone, and
            // opening its pid could pin a stranger.
            Some(libc::EINVAL | libc::ESRCH) => Err(io::Error::from_raw_os_error(libc::ESRCH)),
            _ => Err(error),
        }
    }

    /// Pins the process that has `pid` now (`pidfd_open`).
    pub fn open(pid: i32) -> io::Result<PinnedProcess> {
        // SAFETY: pidfd_open takes integers and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor the kernel gave us.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        Ok(PinnedProcess { pid, pidfd })
    }

    /// The pid the process had when it was pinned.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Whether the pinned process has not yet been reaped, so that its pid still names it.
    pub fn still_there(&self) -> io::Result<bool> {
        // SAFETY: signal 0 only checks that the process exists; no signal is sent.
        let result = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                0,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if result == 0 {
            return Ok(true);
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::ESRCH) => Ok(false),
            // Not allowed to signal it, which means it exists.
            Some(libc::EPERM) => Ok(true),
            _ => Err(error),
        }
    }
}

/// The most descriptors one message carries.
pub const MAX_FDS: usize = 253;

/// Sends `payload` with `fds` attached (`SCM_RIGHTS`).
pub fn send_with_fds(stream: &UnixStream, payload: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_FDS || payload.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a message carries 1 or more payload bytes and at most 253 descriptors",
        ));
    }
    let fd_bytes = std::mem::size_of_val(fds) as u32;
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    // SAFETY: msghdr is plain data; zeroed is a valid start.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer holds one header with room for `fds`.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&msg);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(fd_bytes) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr() as *const u8,
                libc::CMSG_DATA(header),
                fd_bytes as usize,
            );
        }
    }
    // SAFETY: msg points at live buffers for the duration of the call.
    let sent = unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    if sent as usize != payload.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "short send of a descriptor message",
        ));
    }
    Ok(())
}

/// Writes all of `bytes` to a connected socket without raising SIGPIPE if the peer has gone
/// (`MSG_NOSIGNAL`): a program that keeps SIGPIPE's default action gets an error, not death.
pub fn send_all(stream: &UnixStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: send reads at most `bytes.len()` bytes from a live buffer.
        let sent = unsafe {
            libc::send(
                stream.as_raw_fd(),
                bytes.as_ptr() as *const libc::c_void,
                bytes.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if sent < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        bytes = &bytes[sent as usize..];
    }
    Ok(())
}

/// Receives one message of at most `max_payload` bytes and the descriptors attached to it.
pub fn recv_with_fds(
    stream: &UnixStream,
    max_payload: usize,
) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut payload = vec![0u8; max_payload];
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) };
    let mut control = vec![0u64; (space as usize).div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: payload.as_mut_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    // SAFETY: msghdr is plain data; zeroed is a valid start.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = (control.len() * 8) as _;
    // SAFETY: msg points at live buffers for the duration of the call.
    let received = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if received < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote; each SCM_RIGHTS payload holds
    // descriptors that are now ours.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&msg);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(header);
                let count = ((*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    let fd = std::ptr::read_unaligned((data as *const RawFd).add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            header = libc::CMSG_NXTHDR(&msg, header);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "descriptors were truncated in transit",
        ));
    }
    payload.truncate(received as usize);
    Ok((payload, fds))
}

/// Holds an exclusive `flock` on a file until dropped: serializes everything that changes the
/// machine-wide KSM settings (tests, the governor, the demo). The holder writes its pid into
/// the file, so that a program refused the lock can say who has it.
pub struct FileLock {
    _file: File,
}

/// Why [`FileLock::try_exclusive`] did not get the lock.
#[derive(Debug)]
pub enum LockError {
    /// Another open file description holds it; the pid its holder wrote, if it did.
    Held(Option<u32>),
    /// The file could not be opened or locked.
    Io(io::Error),
}

impl FileLock {
    /// Opens the lock file without following a symbolic link, since it may lie in a directory
    /// anyone can write (`/run/lock`, the temporary directory).
    fn open(path: &std::path::Path) -> io::Result<File> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
    }

    /// Records this process as the holder.
    fn taken(mut file: File) -> io::Result<FileLock> {
        use std::io::{Seek, Write};
        file.set_len(0)?;
        file.rewind()?;
        writeln!(file, "{}", std::process::id())?;
        Ok(FileLock { _file: file })
    }

    /// Blocks until the lock on `path` (created if missing) is ours.
    pub fn exclusive(path: &std::path::Path) -> io::Result<FileLock> {
        let file = FileLock::open(path)?;
        loop {
            // SAFETY: flock on a descriptor we hold.
            match check(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) }) {
                Ok(_) => return FileLock::taken(file),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Takes the lock on `path` (created if missing) if nobody holds it, without waiting.
    pub fn try_exclusive(path: &std::path::Path) -> Result<FileLock, LockError> {
        let file = FileLock::open(path).map_err(LockError::Io)?;
        // SAFETY: flock on a descriptor we hold.
        match check(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }) {
            Ok(_) => FileLock::taken(file).map_err(LockError::Io),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let holder = std::fs::read_to_string(path)
                    .ok()
                    .and_then(|text| text.trim().parse().ok());
                Err(LockError::Held(holder))
            }
            Err(e) => Err(LockError::Io(e)),
        }
    }
}

/// Reads the 8-byte entries `[first, first + count)` of a pagemap-style file.
pub fn read_u64_entries(file: &File, first: u64, count: usize) -> io::Result<Vec<u64>> {
    use std::os::unix::fs::FileExt;
    let mut bytes = vec![0u8; count * 8];
    let mut done = 0;
    while done < bytes.len() {
        let n = file.read_at(&mut bytes[done..], first * 8 + done as u64)?;
        if n == 0 {
            break;
        }
        done += n;
    }
    bytes.truncate(done - done % 8);
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect())
}

/// Fills `bytes` with random bytes from the kernel.
pub fn random_bytes(bytes: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < bytes.len() {
        // SAFETY: getrandom writes at most the remaining length.
        let n = unsafe {
            libc::getrandom(
                bytes[done..].as_mut_ptr() as *mut libc::c_void,
                bytes.len() - done,
                0,
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        done += n as usize;
    }
    Ok(())
}

static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn request_stop(_signal: libc::c_int) {
    STOP.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Makes SIGINT, SIGTERM, SIGHUP (a closed terminal) and SIGQUIT set a flag instead of killing
/// the process, so a long-running loop (the governor, `mem top`) can stop cleanly and restore
/// what it changed. SIGPIPE is ignored, so that a reader closing the loop's output shows as a
/// write error the loop can stop on, rather than killing it with knobs still changed. Only
/// SIGKILL is left to end it uncleanly, and the record its knob guard keeps covers that.
pub fn install_stop_handlers() {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(signal, request_stop as *const () as libc::sighandler_t);
        }
    }
    // SAFETY: ignoring a signal touches no memory of this program.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// Whether SIGINT, SIGTERM, SIGHUP or SIGQUIT arrived since [`install_stop_handlers`].
pub fn stop_requested() -> bool {
    STOP.load(std::sync::atomic::Ordering::SeqCst)
}
