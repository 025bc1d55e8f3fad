//! Compiling rendered kernels with the system C compiler, caching shared objects on disk, and
//! loading them.
//!
//! The cache key hashes the C source, the compiler flags, the compiler's version line and the CPU
//! model (the code is built for `-march=native`), so a cached object is only reused where it was
//! built for the same thing.
//!
//! A cached object is code that `kfuse` loads and runs, so the cache must be trusted as much as
//! the binary. The directory is the user's own with mode 0700 (another user's directory, or a
//! symbolic link, is refused with a message). Every object has a tag beside it: a SipHash-2-4
//! MAC of its cache key and bytes under a random secret kept in the directory (mode 0600).
//! An object whose tag is missing or wrong (truncated, corrupt, another kernel's object under
//! this name, or one planted by hand) is never loaded: it is rebuilt. Each compilation passes
//! its source to the compiler on standard input (so the object's bytes depend on the source
//! alone), writes the object under a name unique to the process and thread, and renames the
//! synced object into place after its tag, so concurrent compilations of one kernel never read
//! each other's half-written files and always install matching objects and tags.

use std::ffi::c_void;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// Floating-point rules for generated code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Numerics {
    /// Bit-identical to the reference interpreter: no contraction, no reassociation.
    Strict,
    /// FMA contraction and reassociation allowed (error bound in docs/numerics.md).
    Fast,
}

impl Numerics {
    pub fn name(self) -> &'static str {
        match self {
            Numerics::Strict => "strict",
            Numerics::Fast => "fast",
        }
    }

    fn flags(self) -> &'static [&'static str] {
        match self {
            // No trap is observed, so selects around divisions and conversions may be
            // evaluated on every lane: without this GCC leaves such loops scalar, about ten
            // times slower (`tests/vectorized.rs` guards it). It changes no value.
            Numerics::Strict => &["-ffp-contract=off", "-fno-trapping-math"],
            Numerics::Fast => &[
                "-ffp-contract=fast",
                "-fassociative-math",
                "-freciprocal-math",
                "-fno-signed-zeros",
                "-fno-trapping-math",
            ],
        }
    }
}

const COMMON_FLAGS: &[&str] = &[
    "-O3",
    "-march=native",
    "-mprefer-vector-width=512",
    "-fschedule-insns",
    "-std=gnu11",
    "-fPIC",
    "-shared",
    "-fwrapv",
    "-fno-math-errno",
    "-w",
];

/// The kernel entry point: `(args, o_lo, o_hi, j_lo, j_hi)`.
pub type KernelFn = unsafe extern "C" fn(*const *mut c_void, i64, i64, i64, i64);

/// A loaded kernel. Keeps its shared object loaded for as long as the function may be called.
#[derive(Clone)]
pub struct CompiledKernel {
    _library: Arc<libloading::Library>,
    function: KernelFn,
    pub path: PathBuf,
}

impl std::fmt::Debug for CompiledKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CompiledKernel({})", self.path.display())
    }
}

/// A file name part unique to this process and thread, for files that are renamed or removed
/// after the compiler has run.
fn unique_suffix() -> String {
    format!("{}.{:?}", std::process::id(), std::thread::current().id()).replace(['(', ')'], "")
}

/// Writes `bytes` to a new file at `path`, created exclusively (an existing file or a planted
/// symbolic link makes it fail) with mode 0600, and synced.
fn write_new(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600).custom_flags(libc::O_NOFOLLOW);
    }
    let written = options.open(path).and_then(|mut file| {
        file.write_all(bytes)?;
        file.sync_all()
    });
    written.map_err(|e| {
        let _ = std::fs::remove_file(path);
        format!("cannot write {}: {e}", path.display())
    })
}

/// Which loops of a kernel the C compiler vectorized, from GCC's `-fopt-info-vec` report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VectorReport {
    /// The report's lines about the kernel function (not the shared math header), each
    /// `LINE:COL: optimized: loop vectorized using 64 byte vectors` or `... missed: REASON`.
    pub lines: Vec<String>,
}

impl VectorReport {
    /// Whether at least one loop of the kernel function was vectorized.
    pub fn vectorized(&self) -> bool {
        self.lines.iter().any(|l| l.contains("loop vectorized"))
    }
}

impl Compiler {
    /// Compiles `source` (not cached, not loaded) asking the compiler which of the kernel
    /// function's loops it vectorized and why others were not, for `kfuse explain --dump` and
    /// for tests that keep kernels vectorized. `Ok(None)` where the compiler has no such
    /// report (GCC's `-fopt-info-vec`; clang has none by that name).
    pub fn vectorization_report(
        &self,
        source: &str,
        numerics: Numerics,
    ) -> Result<Option<VectorReport>, String> {
        let c_file = self
            .cache_dir
            .join(format!("vec-report-{}.c", unique_suffix()));
        write_new(&c_file, source.as_bytes())?;
        let out = Command::new(&self.program)
            .args(COMMON_FLAGS.iter().filter(|f| **f != "-shared"))
            .args(numerics.flags())
            .args([
                "-fopt-info-vec-optimized",
                "-fopt-info-vec-missed",
                "-S",
                "-o",
            ])
            .arg(if cfg!(windows) { "NUL" } else { "/dev/null" })
            .arg(&c_file)
            .output();
        let _ = std::fs::remove_file(&c_file);
        let out = out.map_err(|e| format!("cannot run {}: {e}", self.program))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            if stderr.contains("fopt-info") {
                return Ok(None);
            }
            return Err(format!("{} failed:\n{stderr}", self.program));
        }
        // Report lines name `FILE:LINE:COL:`; keep those inside the kernel function, which
        // follows the math header in the source.
        let first = source
            .lines()
            .position(|l| l.starts_with("void kfuse_kernel("))
            .map_or(0, |i| i + 1);
        let prefix = format!("{}:", c_file.display());
        let mut lines = stderr
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .filter(|l| {
                l.split(':')
                    .next()
                    .and_then(|n| n.parse::<usize>().ok())
                    .is_some_and(|n| n >= first)
            })
            .map(str::to_string)
            .collect::<Vec<_>>();
        lines.dedup();
        Ok(Some(VectorReport { lines }))
    }
}

impl CompiledKernel {
    pub fn function(&self) -> KernelFn {
        self.function
    }
}

/// Whether a compilation hit the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    Hit,
    Miss,
}

/// The system C compiler and the cache directory.
#[derive(Clone)]
pub struct Compiler {
    pub program: String,
    pub version: String,
    pub cache_dir: PathBuf,
    cpu: String,
    /// The cache's secret, which keys the tags of its objects.
    secret: [u8; 16],
}

impl std::fmt::Debug for Compiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiler")
            .field("program", &self.program)
            .field("version", &self.version)
            .field("cache_dir", &self.cache_dir)
            .finish_non_exhaustive()
    }
}

/// The default cache directory: `$KFUSE_CACHE_DIR`, else `$XDG_CACHE_HOME/kfuse`, else
/// `~/.cache/kfuse`, else `kfuse-cache-<uid>` under the system temporary directory (which
/// [`Compiler::detect`] refuses if another user made it first).
pub fn default_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("KFUSE_CACHE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("kfuse");
    }
    if let Some(h) = std::env::var_os("HOME") {
        return PathBuf::from(h).join(".cache/kfuse");
    }
    std::env::temp_dir().join(format!("kfuse-cache-{}", user_id()))
}

/// The effective user id (0 where there are no users).
fn user_id() -> u32 {
    #[cfg(unix)]
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    return unsafe { libc::geteuid() };
    #[cfg(not(unix))]
    0
}

/// Makes `dir` a directory of this user's that no one else can write, creating it (mode 0700)
/// where missing. A symbolic link, something not a directory, or a directory of another user is
/// refused; this user's directory open to others is closed to them.
pub fn private_dir(dir: &Path) -> Result<(), String> {
    let refuse = |why: String| {
        Err(format!(
            "refusing the kernel cache {}: {why}; set KFUSE_CACHE_DIR to a directory of your own",
            dir.display()
        ))
    };
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    if let Err(e) = builder.create(dir) {
        return refuse(format!("cannot create it: {e}"));
    }
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(meta) => meta,
        Err(e) => return refuse(format!("cannot read it: {e}")),
    };
    if meta.file_type().is_symlink() {
        return refuse("it is a symbolic link".into());
    }
    if !meta.is_dir() {
        return refuse("it is not a directory".into());
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        if meta.uid() != user_id() {
            return refuse(format!("it belongs to user {}, not to you", meta.uid()));
        }
        if meta.mode() & 0o077 != 0 {
            if let Err(e) = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)) {
                return refuse(format!(
                    "others may write it, and making it private failed: {e}"
                ));
            }
        }
    }
    Ok(())
}

/// The cache's secret: 16 random bytes in `dir/secret`, made on first use.
fn cache_secret(dir: &Path) -> Result<[u8; 16], String> {
    let path = dir.join("secret");
    for _ in 0..2 {
        match read_private(&path) {
            Ok(bytes) => {
                if let Ok(secret) = <[u8; 16]>::try_from(bytes.as_slice()) {
                    return Ok(secret);
                }
                // A damaged secret is replaced: every object it tagged is then rebuilt.
                let _ = std::fs::remove_file(&path);
            }
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(format!("cannot read {}: {e}", path.display()))
            }
            Err(_) => {}
        }
        let mut secret = [0u8; 16];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut secret))
            .map_err(|e| format!("cannot read /dev/urandom for the cache's secret: {e}"))?;
        // Written under a unique name and linked into place, so that of two processes making
        // the secret at once both end up with the one that was linked first.
        let tmp = dir.join(format!("secret.tmp{}", unique_suffix()));
        write_new(&tmp, &secret)?;
        let linked = std::fs::hard_link(&tmp, &path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => return Ok(secret),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("cannot create {}: {e}", path.display())),
        }
    }
    Err(format!(
        "cannot settle the cache's secret in {}",
        dir.display()
    ))
}

/// The whole of a regular file, not following a symbolic link.
fn read_private(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NOFOLLOW);
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut options.open(path)?, &mut bytes)?;
    Ok(bytes)
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// FNV-1a and SipHash of the same bytes, as 32 hex digits.
fn key(parts: &[&str]) -> String {
    let mut fnv: u64 = 0xcbf2_9ce4_8422_2325;
    let mut sip = std::collections::hash_map::DefaultHasher::new();
    for p in parts {
        for b in p.bytes().chain([0u8]) {
            fnv = (fnv ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
        p.hash(&mut sip);
    }
    format!("{fnv:016x}{:016x}", sip.finish())
}

impl Compiler {
    /// Finds the C compiler (`$CC`, else `cc`), checks that it runs, and makes `cache_dir` a
    /// private cache ([`private_dir`]) with its secret.
    pub fn detect(cache_dir: PathBuf) -> Result<Compiler, String> {
        let program = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = Command::new(&program)
            .arg("--version")
            .output()
            .map_err(|e| format!("no C compiler ({program}): {e}"))?;
        if !out.status.success() {
            return Err(format!("{program} --version failed"));
        }
        let version = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .to_string();
        private_dir(&cache_dir)?;
        let secret = cache_secret(&cache_dir)?;
        Ok(Compiler {
            program,
            version,
            cache_dir,
            cpu: cpu_model(),
            secret,
        })
    }

    /// The cache path a source would compile to.
    pub fn object_path(&self, source: &str, numerics: Numerics) -> PathBuf {
        self.cache_dir
            .join(format!("{}.so", self.entry_key(source, numerics)))
    }

    fn entry_key(&self, source: &str, numerics: Numerics) -> String {
        let flags = format!("{:?}{:?}", COMMON_FLAGS, numerics.flags());
        key(&[source, &flags, &self.version, &self.cpu])
    }

    /// The tag of the object `bytes` cached under `entry`: a keyed MAC of both, as hex.
    fn tag(&self, entry: &str, bytes: &[u8]) -> String {
        use siphasher::sip128::{Hasher128, SipHasher24};
        let mut mac = SipHasher24::new_with_key(&self.secret);
        mac.write(entry.as_bytes());
        mac.write(&[0]);
        mac.write(bytes);
        format!("{:032x}", mac.finish128().as_u128())
    }

    /// Whether the object at `object` is the one its tag vouches for.
    fn vouched(&self, entry: &str, object: &Path) -> bool {
        let tag_path = object.with_extension("tag");
        match (read_private(object), read_private(&tag_path)) {
            (Ok(bytes), Ok(tag)) => tag == self.tag(entry, &bytes).as_bytes(),
            _ => false,
        }
    }

    /// Compiles `source` (or finds it in the cache), loads it and returns its `kfuse_kernel`.
    pub fn compile(
        &self,
        source: &str,
        numerics: Numerics,
    ) -> Result<(CompiledKernel, CacheOutcome), String> {
        let (library, path, outcome) = self.compile_library(source, numerics)?;
        Ok((
            CompiledKernel::from_library(library, &path, "kfuse_kernel")?,
            outcome,
        ))
    }

    /// Compiles `source` (or finds it in the cache) and loads the shared object; kernels are then
    /// taken from it by name with [`CompiledKernel::from_library`]. A cached object is loaded
    /// only if its tag vouches for it, and one that fails to load is rebuilt once.
    pub fn compile_library(
        &self,
        source: &str,
        numerics: Numerics,
    ) -> Result<(Arc<libloading::Library>, PathBuf, CacheOutcome), String> {
        let entry = self.entry_key(source, numerics);
        let object = self.cache_dir.join(format!("{entry}.so"));
        let mut outcome = CacheOutcome::Hit;
        if !self.vouched(&entry, &object) {
            self.build(&entry, source, numerics)?;
            outcome = CacheOutcome::Miss;
        }
        // SAFETY: the object was built by this module from kfuse-rendered C (its tag, keyed by
        // the private cache's secret, says so); loading it runs no initializers of ours.
        let loaded = unsafe { libloading::Library::new(&object) };
        let library = match loaded {
            Ok(library) => library,
            Err(_) if outcome == CacheOutcome::Hit => {
                self.build(&entry, source, numerics)?;
                outcome = CacheOutcome::Miss;
                // SAFETY: as above, freshly built.
                unsafe { libloading::Library::new(&object) }
                    .map_err(|e| format!("cannot load {}: {e}", object.display()))?
            }
            Err(e) => return Err(format!("cannot load {}: {e}", object.display())),
        };
        Ok((Arc::new(library), object, outcome))
    }

    /// Compiles `source` into the cache as `entry`: the source goes to the compiler on its
    /// standard input, so that the object's bytes depend on the source alone (a file name would
    /// be recorded in it) and concurrent builds of one kernel install identical objects; the
    /// object is written under a name unique to this thread, synced, and moved into place after
    /// its tag.
    fn build(&self, entry: &str, source: &str, numerics: Numerics) -> Result<(), String> {
        use std::io::Write;
        let tmp = self
            .cache_dir
            .join(format!("{entry}.{}.so.tmp", unique_suffix()));
        let child = Command::new(&self.program)
            .args(COMMON_FLAGS)
            .args(numerics.flags())
            .arg("-o")
            .arg(&tmp)
            .args(["-x", "c", "-", "-lm"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn();
        let out = child.and_then(|mut child| {
            let mut stdin = child.stdin.take().expect("stdin was piped");
            // Written from a thread of its own while this one collects the output, so that a
            // compiler writing much before it has read everything cannot block either side.
            let source = source.to_owned();
            let writer = std::thread::spawn(move || stdin.write_all(source.as_bytes()));
            let out = child.wait_with_output();
            let written = writer.join().expect("the source writer does not panic");
            let out = out?;
            // A compiler that failed early may close its input unread; its own error says more.
            if out.status.success() {
                written?;
            }
            Ok(out)
        });
        let installed = out
            .map_err(|e| format!("cannot run {}: {e}", self.program))
            .and_then(|out| {
                if out.status.success() {
                    Ok(())
                } else {
                    Err(format!(
                        "{} failed on kernel {entry}:\n{}",
                        self.program,
                        String::from_utf8_lossy(&out.stderr)
                    ))
                }
            })
            .and_then(|()| self.install(entry, &tmp));
        let _ = std::fs::remove_file(&tmp);
        installed
    }

    /// Moves the compiled object `tmp` into the cache as `entry`, with its tag.
    fn install(&self, entry: &str, tmp: &Path) -> Result<(), String> {
        let bytes = read_private(tmp).map_err(|e| format!("cannot read {}: {e}", tmp.display()))?;
        std::fs::File::open(tmp)
            .and_then(|f| f.sync_all())
            .map_err(|e| format!("cannot sync {}: {e}", tmp.display()))?;
        let object = self.cache_dir.join(format!("{entry}.so"));
        let tag_path = object.with_extension("tag");
        let tag_tmp = self
            .cache_dir
            .join(format!("{entry}.{}.tag.tmp", unique_suffix()));
        write_new(&tag_tmp, self.tag(entry, &bytes).as_bytes())?;
        let moved =
            std::fs::rename(&tag_tmp, &tag_path).and_then(|()| std::fs::rename(tmp, &object));
        let _ = std::fs::remove_file(&tag_tmp);
        moved.map_err(|e| format!("cannot move {} into the cache: {e}", tmp.display()))
    }
}

impl CompiledKernel {
    /// The kernel function `name` of a loaded library.
    pub fn from_library(
        library: Arc<libloading::Library>,
        path: &Path,
        name: &str,
    ) -> Result<CompiledKernel, String> {
        let symbol = format!("{name}\0");
        // SAFETY: kfuse renders every kernel function with the `KernelFn` signature.
        let function: KernelFn = unsafe {
            *library
                .get::<KernelFn>(symbol.as_bytes())
                .map_err(|e| format!("{}: {e}", path.display()))?
        };
        Ok(CompiledKernel {
            _library: library,
            function,
            path: path.to_path_buf(),
        })
    }
}
