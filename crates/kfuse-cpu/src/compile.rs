//! Compiling rendered kernels with the system C compiler, caching shared objects on disk, and
//! loading them.
//!
//! The cache key hashes the C source, the compiler flags, the compiler's version line and the CPU
//! model (the code is built for `-march=native`), so a cached object is only reused where it was
//! built for the same thing. Objects are compiled to a temporary name and renamed into place, so
//! concurrent compilations of the same kernel are safe.

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

fn write_source(path: &std::path::Path, source: &str) -> Result<(), String> {
    std::fs::write(path, source).map_err(|e| format!("cannot write {}: {e}", path.display()))
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
        std::fs::create_dir_all(&self.cache_dir)
            .map_err(|e| format!("cannot create {}: {e}", self.cache_dir.display()))?;
        let c_file = self
            .cache_dir
            .join(format!("vec-report-{}.c", unique_suffix()));
        write_source(&c_file, source)?;
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
#[derive(Clone, Debug)]
pub struct Compiler {
    pub program: String,
    pub version: String,
    pub cache_dir: PathBuf,
    cpu: String,
}

/// The default cache directory: `$KFUSE_CACHE_DIR`, else `$XDG_CACHE_HOME/kfuse`, else
/// `~/.cache/kfuse`, else a directory under the system temporary directory.
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
    std::env::temp_dir().join("kfuse-cache")
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
    /// Finds the C compiler (`$CC`, else `cc`) and checks that it runs.
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
        Ok(Compiler {
            program,
            version,
            cache_dir,
            cpu: cpu_model(),
        })
    }

    /// The cache path a source would compile to.
    pub fn object_path(&self, source: &str, numerics: Numerics) -> PathBuf {
        let flags = format!("{:?}{:?}", COMMON_FLAGS, numerics.flags());
        self.cache_dir.join(format!(
            "{}.so",
            key(&[source, &flags, &self.version, &self.cpu])
        ))
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
    /// taken from it by name with [`CompiledKernel::from_library`].
    pub fn compile_library(
        &self,
        source: &str,
        numerics: Numerics,
    ) -> Result<(Arc<libloading::Library>, PathBuf, CacheOutcome), String> {
        let object = self.object_path(source, numerics);
        let outcome = if object.exists() {
            CacheOutcome::Hit
        } else {
            std::fs::create_dir_all(&self.cache_dir)
                .map_err(|e| format!("cannot create {}: {e}", self.cache_dir.display()))?;
            let c_file = object.with_extension("c");
            let tmp = object.with_extension(format!("so.tmp{}", unique_suffix()));
            write_source(&c_file, source)?;
            let out = Command::new(&self.program)
                .args(COMMON_FLAGS)
                .args(numerics.flags())
                .arg("-o")
                .arg(&tmp)
                .arg(&c_file)
                .arg("-lm")
                .output()
                .map_err(|e| format!("cannot run {}: {e}", self.program))?;
            if !out.status.success() {
                let _ = std::fs::remove_file(&tmp);
                return Err(format!(
                    "{} failed on {}:\n{}",
                    self.program,
                    c_file.display(),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            std::fs::rename(&tmp, &object)
                .map_err(|e| format!("cannot move {} into the cache: {e}", tmp.display()))?;
            CacheOutcome::Miss
        };
        // SAFETY: the object was produced by this module from kfuse-rendered C; loading it runs
        // no initializers of ours.
        let library = unsafe { libloading::Library::new(&object) }
            .map_err(|e| format!("cannot load {}: {e}", object.display()))?;
        Ok((Arc::new(library), object, outcome))
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
