//! numpy `.npy` and `.npz` files as kfuse [`Array`]s.
//!
//! Reads format versions 1.0 to 3.0, little- or big-endian, C or Fortran order, with dtypes
//! `f4 f8 f2 i4 i8 u1 b1` (f32, f64, f16, i32, i64, u8, bool). Writes version 1.0 (2.0 when the
//! header needs it), little-endian, C order. numpy has no bfloat16: a bf16 array is written widened
//! to f32, which is exact. `.npz` archives may be stored or deflated (`savez_compressed`).

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::Path;

use kfuse_ir::{Array, DType, Shape, Storage, TensorType};

/// Why a file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The bytes are not a valid `.npy` file.
    #[error("not a valid .npy file: {0}")]
    Format(String),
    /// A valid file kfuse cannot represent.
    #[error("unsupported .npy content: {0}")]
    Unsupported(String),
    #[error("not a valid .npz archive: {0}")]
    Zip(String),
    /// An `.npz` member whose header the caller refused, before its data was read.
    #[error("{0}")]
    Rejected(String),
}

const MAGIC: &[u8] = b"\x93NUMPY";

fn format_err<T>(msg: impl Into<String>) -> Result<T, NpyError> {
    Err(NpyError::Format(msg.into()))
}

/// The parsed header dictionary.
struct Header {
    descr: String,
    fortran_order: bool,
    shape: Vec<usize>,
}

/// Parses numpy's header, a Python dict literal such as
/// `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }`.
fn parse_header(text: &str) -> Result<Header, NpyError> {
    let text = text.trim();
    let body = text
        .strip_prefix('{')
        .and_then(|t| t.trim_end().strip_suffix('}'))
        .ok_or_else(|| NpyError::Format(format!("header is not a dict: {text:?}")))?;
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    let mut rest = body.trim();
    while !rest.is_empty() {
        let Some((key, after)) = quoted(rest)? else {
            return format_err(format!("expected a quoted key at {rest:?}"));
        };
        rest = after
            .trim_start()
            .strip_prefix(':')
            .ok_or_else(|| NpyError::Format(format!("expected ':' after key {key:?}")))?
            .trim_start();
        match key {
            "descr" => {
                let (text, after) = quoted(rest)?.ok_or_else(|| {
                    NpyError::Unsupported("structured dtypes (descr is not a string)".into())
                })?;
                descr = Some(text.to_string());
                rest = after;
            }
            "fortran_order" => {
                if let Some(r) = rest.strip_prefix("True") {
                    fortran = Some(true);
                    rest = r;
                } else if let Some(r) = rest.strip_prefix("False") {
                    fortran = Some(false);
                    rest = r;
                } else {
                    return format_err("fortran_order is not True or False");
                }
            }
            "shape" => {
                let inner = rest
                    .strip_prefix('(')
                    .ok_or_else(|| NpyError::Format("shape is not a tuple".into()))?;
                let (tuple, after) = inner
                    .split_once(')')
                    .ok_or_else(|| NpyError::Format("unterminated shape tuple".into()))?;
                let dims = tuple
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| {
                        s.trim_end_matches('L')
                            .parse::<usize>()
                            .map_err(|_| NpyError::Format(format!("bad dimension {s:?} in shape")))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                shape = Some(dims);
                rest = after;
            }
            other => return format_err(format!("unknown header key {other:?}")),
        }
        rest = rest.trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    match (descr, fortran, shape) {
        (Some(descr), Some(fortran_order), Some(shape)) => Ok(Header {
            descr,
            fortran_order,
            shape,
        }),
        _ => format_err("header lacks one of 'descr', 'fortran_order', 'shape'"),
    }
}

/// Splits a quoted Python string literal off the front of `text`: `Ok(None)` if `text` does not
/// start with a quote, else the literal's contents and what follows the closing quote. Slicing
/// happens only next to the one-byte quotes, so any text, whatever its characters, is safe.
fn quoted(text: &str) -> Result<Option<(&str, &str)>, NpyError> {
    let Some(quote) = text.chars().next().filter(|c| *c == '\'' || *c == '"') else {
        return Ok(None);
    };
    let inner = &text[quote.len_utf8()..];
    let end = inner
        .find(quote)
        .ok_or_else(|| NpyError::Format(format!("unterminated string at {text:?}")))?;
    Ok(Some((&inner[..end], &inner[end + quote.len_utf8()..])))
}

/// Maps a numpy descr to a dtype and whether its bytes are big-endian.
fn dtype_of(descr: &str) -> Result<(DType, bool), NpyError> {
    // The byte-order mark is one character, which need not be one byte in a hostile header.
    let mut chars = descr.chars();
    let order = chars.next();
    let code = chars.as_str();
    let big = match order {
        Some('<' | '|' | '=') => false,
        Some('>') => true,
        _ => return Err(NpyError::Unsupported(format!("dtype {descr:?}"))),
    };
    let dtype = match code {
        "f4" => DType::F32,
        "f8" => DType::F64,
        "f2" => DType::F16,
        "i4" => DType::I32,
        "i8" => DType::I64,
        "u1" => DType::U8,
        "b1" => DType::Bool,
        _ => {
            return Err(NpyError::Unsupported(format!(
                "dtype {descr:?} (kfuse reads f4, f8, f2, i4, i8, u1 and b1; cast the array first)"
            )))
        }
    };
    Ok((dtype, big))
}

fn descr_of(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 | DType::BF16 => "<f4",
        DType::F64 => "<f8",
        DType::F16 => "<f2",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::U8 => "|u1",
        DType::Bool => "|b1",
    }
}

/// What a `.npy` header declares, read before any of the data.
struct Preamble {
    /// The array's dtype and shape.
    ty: TensorType,
    /// Whether the data's bytes are big-endian.
    big_endian: bool,
    /// Whether the data is in column-major order.
    fortran_order: bool,
    /// Bytes of the data the shape needs.
    n_bytes: usize,
    /// Bytes of the file before the data: magic, version, header length and header.
    header_bytes: u64,
}

/// Reads and checks the magic string, the version and the header, leaving `reader` at the
/// first byte of the data. Every size the header implies is computed with checked arithmetic.
fn read_preamble(reader: &mut impl Read) -> Result<Preamble, NpyError> {
    let mut prefix = [0u8; 8];
    reader
        .read_exact(&mut prefix)
        .map_err(|_| NpyError::Format("file is shorter than the .npy preamble".into()))?;
    if &prefix[..6] != MAGIC {
        return format_err("missing the \\x93NUMPY magic string");
    }
    let (header_len, length_bytes) = match prefix[6] {
        1 => {
            let mut b = [0u8; 2];
            reader
                .read_exact(&mut b)
                .map_err(|_| NpyError::Format("truncated header length".into()))?;
            (u16::from_le_bytes(b) as usize, 2)
        }
        2 | 3 => {
            let mut b = [0u8; 4];
            reader
                .read_exact(&mut b)
                .map_err(|_| NpyError::Format("truncated header length".into()))?;
            (u32::from_le_bytes(b) as usize, 4)
        }
        v => {
            return Err(NpyError::Unsupported(format!(
                "format version {v}.{}",
                prefix[7]
            )))
        }
    };
    if header_len > 1 << 20 {
        return format_err(format!("header length {header_len} is implausibly large"));
    }
    let mut header = vec![0u8; header_len];
    reader
        .read_exact(&mut header)
        .map_err(|_| NpyError::Format("truncated header".into()))?;
    let header =
        String::from_utf8(header).map_err(|_| NpyError::Format("header is not text".into()))?;
    let header = parse_header(&header)?;
    let (dtype, big_endian) = dtype_of(&header.descr)?;
    if header.shape.len() > kfuse_ir::shape::MAX_RANK {
        return Err(NpyError::Unsupported(format!(
            "rank {} (kfuse allows up to {})",
            header.shape.len(),
            kfuse_ir::shape::MAX_RANK
        )));
    }
    let shape = Shape::new(header.shape);
    // Strides multiply every extent but the innermost, so even an empty array must keep the
    // product of its nonzero extents in range: (0, 2^40, 2^40) holds nothing, yet its strides
    // overflow.
    let extent_bytes = shape
        .dims()
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(dtype.size_bytes(), |acc, &d| acc.checked_mul(d));
    let n_bytes = extent_bytes
        .and(shape.checked_n_elems())
        .and_then(|n| n.checked_mul(dtype.size_bytes()))
        .ok_or_else(|| NpyError::Format(format!("shape {shape} is too large")))?;
    Ok(Preamble {
        ty: TensorType { dtype, shape },
        big_endian,
        fortran_order: header.fortran_order,
        n_bytes,
        header_bytes: (MAGIC.len() + 2 + length_bytes + header_len) as u64,
    })
}

/// Reads the data a preamble declares. `available` is how many bytes follow the header where
/// the container says (a file's length, an archive member's size): a header that declares more
/// is refused before anything is allocated.
fn read_data(
    reader: impl Read,
    preamble: Preamble,
    available: Option<u64>,
) -> Result<Array, NpyError> {
    let Preamble {
        ty: TensorType { dtype, shape },
        big_endian,
        fortran_order,
        n_bytes,
        ..
    } = preamble;
    let truncated = |found: u64| {
        NpyError::Format(format!(
            "data is truncated: shape {shape} of {dtype} needs {n_bytes} bytes, found {found}"
        ))
    };
    let mut data = Vec::new();
    // Without a length to check against, the buffer grows only as data actually arrives, so a
    // lying header cannot force a huge allocation.
    if let Some(available) = available {
        if (n_bytes as u64) > available {
            return Err(truncated(available));
        }
        data.try_reserve_exact(n_bytes).map_err(|_| {
            NpyError::Format(format!(
                "cannot allocate {n_bytes} bytes for shape {shape} of {dtype}"
            ))
        })?;
    }
    reader.take(n_bytes as u64).read_to_end(&mut data)?;
    if data.len() != n_bytes {
        return Err(truncated(data.len() as u64));
    }
    let size = dtype.size_bytes();
    if big_endian && size > 1 {
        for chunk in data.chunks_exact_mut(size) {
            chunk.reverse();
        }
    }
    let storage = decode(dtype, &data)?;
    let storage = if fortran_order && shape.rank() > 1 && n_bytes > 0 {
        fortran_to_c(storage, &shape)
    } else {
        storage
    };
    Array::new(shape, storage).map_err(|e| NpyError::Format(e.to_string()))
}

/// Reads one array from `.npy` bytes.
pub fn read_npy(mut reader: impl Read) -> Result<Array, NpyError> {
    let preamble = read_preamble(&mut reader)?;
    read_data(reader, preamble, None)
}

fn decode(dtype: DType, data: &[u8]) -> Result<Storage, NpyError> {
    macro_rules! le {
        ($t:ty, $n:expr) => {
            data.chunks_exact($n)
                .map(|c| <$t>::from_le_bytes(c.try_into().expect("chunk size")))
                .collect()
        };
    }
    Ok(match dtype {
        DType::F32 => Storage::F32(le!(f32, 4)),
        DType::F64 => Storage::F64(le!(f64, 8)),
        DType::F16 => Storage::F16(
            data.chunks_exact(2)
                .map(|c| kfuse_ir::f16::from_le_bytes([c[0], c[1]]))
                .collect(),
        ),
        DType::I32 => Storage::I32(le!(i32, 4)),
        DType::I64 => Storage::I64(le!(i64, 8)),
        DType::U8 => Storage::U8(data.to_vec()),
        DType::Bool => Storage::Bool(
            data.iter()
                .map(|&b| match b {
                    0 => Ok(false),
                    1 => Ok(true),
                    other => Err(NpyError::Format(format!("bool element holds byte {other}"))),
                })
                .collect::<Result<_, _>>()?,
        ),
        DType::BF16 => unreachable!("numpy has no bf16 descr"),
    })
}

/// Reorders column-major storage into row-major.
fn fortran_to_c(storage: Storage, shape: &Shape) -> Storage {
    let dims = shape.dims();
    let n = shape.n_elems();
    // Fortran strides: cumulative products from the left.
    let mut fstrides = vec![1usize; dims.len()];
    for k in 1..dims.len() {
        fstrides[k] = fstrides[k - 1] * dims[k - 1];
    }
    let cstrides = shape.strides();
    let source = |c_index: usize| -> usize {
        (0..dims.len())
            .map(|k| (c_index / cstrides[k]) % dims[k] * fstrides[k])
            .sum()
    };
    fn reorder<T: Copy>(v: &[T], n: usize, source: impl Fn(usize) -> usize) -> Vec<T> {
        (0..n).map(|i| v[source(i)]).collect()
    }
    kfuse_ir::with_storage!(&storage, v => <_ as kfuse_ir::Element>::wrap(reorder(v, n, source)))
}

/// Writes `array` as `.npy` bytes.
pub fn write_npy(mut writer: impl Write, array: &Array) -> Result<(), NpyError> {
    let dims: Vec<String> = array.shape().dims().iter().map(|d| d.to_string()).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
        descr_of(array.dtype())
    );
    // Pad with spaces so that the data starts 64-byte aligned; the header ends in a newline.
    let (version, len_bytes) = if header.len() + 11 < 65_536 {
        (1u8, 2)
    } else {
        (2u8, 4)
    };
    let preamble = MAGIC.len() + 2 + len_bytes;
    let total = (preamble + header.len() + 1).div_ceil(64) * 64;
    header.push_str(&" ".repeat(total - preamble - header.len() - 1));
    header.push('\n');
    writer.write_all(MAGIC)?;
    writer.write_all(&[version, 0])?;
    if version == 1 {
        writer.write_all(&(header.len() as u16).to_le_bytes())?;
    } else {
        writer.write_all(&(header.len() as u32).to_le_bytes())?;
    }
    writer.write_all(header.as_bytes())?;
    let mut bytes = Vec::with_capacity(array.n_elems() * array.dtype().size_bytes().max(4));
    match array.storage() {
        Storage::F32(v) => v
            .iter()
            .for_each(|x| bytes.extend_from_slice(&x.to_le_bytes())),
        Storage::F64(v) => v
            .iter()
            .for_each(|x| bytes.extend_from_slice(&x.to_le_bytes())),
        Storage::F16(v) => v
            .iter()
            .for_each(|x| bytes.extend_from_slice(&x.to_le_bytes())),
        Storage::BF16(v) => v
            .iter()
            .for_each(|x| bytes.extend_from_slice(&x.to_f32().to_le_bytes())),
        Storage::I32(v) => v
            .iter()
            .for_each(|x| bytes.extend_from_slice(&x.to_le_bytes())),
        Storage::I64(v) => v
            .iter()
            .for_each(|x| bytes.extend_from_slice(&x.to_le_bytes())),
        Storage::U8(v) => bytes.extend_from_slice(v),
        Storage::Bool(v) => bytes.extend(v.iter().map(|&b| b as u8)),
    }
    writer.write_all(&bytes)?;
    Ok(())
}

/// Reads a `.npy` file. A header that declares more data than the file holds is refused before
/// anything is allocated for it.
pub fn load_npy(path: &Path) -> Result<Array, NpyError> {
    let file = File::open(path)?;
    let length = file.metadata()?.len();
    let mut reader = std::io::BufReader::new(file);
    let preamble = read_preamble(&mut reader)?;
    let available = length.saturating_sub(preamble.header_bytes);
    read_data(reader, preamble, Some(available))
}

/// Writes a `.npy` file atomically: the data goes to a temporary file beside it, which is then
/// renamed over the target, so a failure never leaves a partial file (see [`atomic_write`]).
pub fn save_npy(path: &Path, array: &Array) -> Result<(), NpyError> {
    atomic_write(path, |w| write_npy(w, array))
}

/// Writes `path` atomically with `body`. Where the file system has unnamed temporary files
/// (Linux's `O_TMPFILE`), the data is written to one in the target's directory and linked into
/// place only when complete and synced: a process killed while writing (SIGINT, SIGTERM or
/// SIGKILL) leaves nothing behind. Elsewhere the temporary file is named (`.kfuse-<pid>-<n>-`
/// and the start of the target's name, within the file system's name limit), created
/// exclusively so that a planted symbolic link is never followed, and removed on every error.
fn atomic_write(
    path: &Path,
    body: impl FnOnce(&mut std::io::BufWriter<&File>) -> Result<(), NpyError>,
) -> Result<(), NpyError> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| {
        NpyError::Io(std::io::Error::other(format!(
            "{} is not a file path",
            path.display()
        )))
    })?;
    let write =
        |file: &File,
         body: Box<dyn FnOnce(&mut std::io::BufWriter<&File>) -> Result<(), NpyError> + '_>|
         -> Result<(), NpyError> {
            let mut w = std::io::BufWriter::new(file);
            body(&mut w)?;
            w.flush()?;
            drop(w);
            file.sync_all()?;
            Ok(())
        };
    #[cfg(target_os = "linux")]
    if let Some(file) = unnamed_file(dir) {
        write(&file, Box::new(body))?;
        return link_into_place(&file, dir, name, path);
    }
    let (tmp, file) = named_temporary(dir, name)?;
    let result = write(&file, Box::new(body)).and_then(|()| Ok(std::fs::rename(&tmp, path)?));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// A temporary name in `dir` for a file that becomes `name`: hidden, unique to this process and
/// attempt, and short enough for any file system (255 bytes) whatever the length of `name`.
fn temporary_name(dir: &Path, name: &std::ffi::OsStr, attempt: u32) -> std::path::PathBuf {
    let name = name.to_string_lossy();
    let mut end = name.len().min(160);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    dir.join(format!(
        ".kfuse-{}-{attempt}-{}.tmp",
        std::process::id(),
        &name[..end]
    ))
}

/// A new file under a [`temporary_name`], created exclusively (never through a link).
fn named_temporary(
    dir: &Path,
    name: &std::ffi::OsStr,
) -> Result<(std::path::PathBuf, File), NpyError> {
    let mut attempt = 0;
    loop {
        let tmp = temporary_name(dir, name, attempt);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
        {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => {
                attempt += 1
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// An unnamed file in `dir` (`O_TMPFILE`), where the file system has them.
#[cfg(target_os = "linux")]
fn unnamed_file(dir: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .mode(0o666)
        .open(dir)
        .ok()
}

/// Gives the complete unnamed `file` its name `path`: linked straight to it where no file of
/// that name exists, else linked to a temporary name and renamed over the old file.
#[cfg(target_os = "linux")]
fn link_into_place(
    file: &File,
    dir: &Path,
    name: &std::ffi::OsStr,
    path: &Path,
) -> Result<(), NpyError> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::io::AsRawFd;
    let source = std::ffi::CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .expect("no NUL in a number");
    let link = |target: &Path| -> std::io::Result<()> {
        let target = std::ffi::CString::new(target.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::other("a NUL in the output path"))?;
        // SAFETY: both paths are NUL-terminated strings that live across the call.
        let rc = unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                source.as_ptr(),
                libc::AT_FDCWD,
                target.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    match link(path) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e.into()),
        Err(_) => {}
    }
    let mut attempt = 0;
    loop {
        let tmp = temporary_name(dir, name, attempt);
        match link(&tmp) {
            Ok(()) => {
                let renamed = std::fs::rename(&tmp, path);
                if renamed.is_err() {
                    let _ = std::fs::remove_file(&tmp);
                }
                return Ok(renamed?);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => {
                attempt += 1
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Reads every array of an `.npz` archive, in archive order, named without the `.npy` suffix.
pub fn read_npz(reader: impl Read + Seek) -> Result<Vec<(String, Array)>, NpyError> {
    read_npz_checked(reader, |_, _| Ok(()))
}

/// [`read_npz`], with `check` called on each member's name (without `.npy`) and declared type
/// as soon as its header is read: an `Err(reason)` stops the read with
/// [`NpyError::Rejected`] before the member's data is decompressed or allocated, so a caller
/// that knows the types it expects never inflates a member of the wrong shape.
pub fn read_npz_checked(
    reader: impl Read + Seek,
    mut check: impl FnMut(&str, &TensorType) -> Result<(), String>,
) -> Result<Vec<(String, Array)>, NpyError> {
    let mut archive = zip::ZipArchive::new(reader).map_err(|e| NpyError::Zip(e.to_string()))?;
    let mut arrays = Vec::new();
    for i in 0..archive.len() {
        let mut entry = archive
            .by_index(i)
            .map_err(|e| NpyError::Zip(e.to_string()))?;
        let name = entry
            .name()
            .map_err(|e| NpyError::Zip(e.to_string()))?
            .to_string();
        let key = name.strip_suffix(".npy").unwrap_or(&name).to_string();
        let in_member = |e: NpyError| match e {
            NpyError::Format(m) => NpyError::Format(format!("{name}: {m}")),
            NpyError::Unsupported(m) => NpyError::Unsupported(format!("{name}: {m}")),
            other => other,
        };
        // The archive's directory gives each member's uncompressed size: the data a header
        // declares must fit in it.
        let size = entry.size();
        let preamble = read_preamble(&mut entry).map_err(in_member)?;
        check(&key, &preamble.ty)
            .map_err(|reason| NpyError::Rejected(format!("{name}: {reason}")))?;
        let available = size.saturating_sub(preamble.header_bytes);
        let array = read_data(entry, preamble, Some(available)).map_err(in_member)?;
        arrays.push((key, array));
    }
    Ok(arrays)
}

/// Reads a `.npz` file.
pub fn load_npz(path: &Path) -> Result<Vec<(String, Array)>, NpyError> {
    read_npz(std::io::BufReader::new(File::open(path)?))
}

/// Reads a `.npz` file, checking each member's declared type first (see [`read_npz_checked`]).
pub fn load_npz_checked(
    path: &Path,
    check: impl FnMut(&str, &TensorType) -> Result<(), String>,
) -> Result<Vec<(String, Array)>, NpyError> {
    read_npz_checked(std::io::BufReader::new(File::open(path)?), check)
}

/// Writes arrays into an uncompressed `.npz` archive (as `numpy.savez` does), atomically.
pub fn save_npz(path: &Path, arrays: &[(String, Array)]) -> Result<(), NpyError> {
    atomic_write(path, |w| {
        let mut zip = zip::ZipWriter::new_stream(w);
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .large_file(true);
        for (name, array) in arrays {
            zip.start_file(format!("{name}.npy"), options)
                .map_err(|e| NpyError::Zip(e.to_string()))?;
            write_npy(&mut zip, array)?;
        }
        zip.finish().map_err(|e| NpyError::Zip(e.to_string()))?;
        Ok(())
    })
}
