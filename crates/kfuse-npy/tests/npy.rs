//! Reading files numpy wrote, writing files numpy can read back (checked by round trip through
//! our reader and by byte layout), and clear errors for everything else.

use std::path::{Path, PathBuf};

use kfuse_ir::{f16, Array, DType};
use kfuse_npy::{load_npy, load_npz, read_npy, save_npy, save_npz, write_npy, NpyError};
use kfuse_testkit::{random_array, random_shape, Rng};

fn file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/files")
        .join(name)
}

fn base() -> Vec<f32> {
    (0..24).map(|i| i as f32 / 7.0).collect()
}

#[test]
fn reads_every_layout_numpy_writes() {
    for name in [
        "f32_c.npy",
        "f32_fortran.npy",
        "f32_big_endian.npy",
        "f32_v2.npy",
    ] {
        let a = load_npy(&file(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(a.shape().dims(), &[2, 3, 4], "{name}");
        assert_eq!(a.as_slice::<f32>().unwrap(), base().as_slice(), "{name}");
    }
    let d = load_npy(&file("f64_big_endian_fortran.npy")).unwrap();
    let want: Vec<f64> = base().iter().map(|&x| x as f64).collect();
    assert_eq!(d.as_slice::<f64>().unwrap(), want.as_slice());
}

#[test]
fn reads_every_supported_dtype() {
    let h = load_npy(&file("f16.npy")).unwrap();
    let want: Vec<f16> = [1.0, -0.0, f32::INFINITY, 6e-8, 65504.0]
        .iter()
        .map(|&x| f16::from_f32(x))
        .collect();
    assert_eq!(
        h.as_slice::<f16>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>(),
        want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    assert_eq!(
        load_npy(&file("i32.npy")).unwrap(),
        Array::from_vec(vec![1, 2], vec![i32::MIN, i32::MAX]).unwrap()
    );
    assert_eq!(
        load_npy(&file("i64.npy")).unwrap(),
        Array::from_vec(vec![3], vec![i64::MIN, i64::MAX, 0]).unwrap()
    );
    assert_eq!(
        load_npy(&file("u8.npy")).unwrap(),
        Array::from_vec(vec![3], vec![0u8, 255, 7]).unwrap()
    );
    assert_eq!(
        load_npy(&file("bool.npy")).unwrap(),
        Array::from_vec(vec![2, 2], vec![true, false, false, true]).unwrap()
    );
    assert_eq!(
        load_npy(&file("scalar.npy")).unwrap(),
        Array::scalar(2.5f64)
    );
    let e = load_npy(&file("empty.npy")).unwrap();
    assert_eq!(
        (e.dtype(), e.shape().dims()),
        (DType::F32, &[0usize, 3][..])
    );
}

#[test]
fn reads_stored_and_compressed_archives() {
    let stored = load_npz(&file("stored.npz")).unwrap();
    assert_eq!(
        stored.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        vec!["a", "b"]
    );
    assert_eq!(stored[0].1.as_slice::<f32>().unwrap(), base().as_slice());
    assert_eq!(
        stored[1].1,
        Array::from_vec(vec![3], vec![1i64, 2, 3]).unwrap()
    );
    let compressed = load_npz(&file("compressed.npz")).unwrap();
    assert_eq!(
        compressed[0].1.as_slice::<f32>().unwrap(),
        base().as_slice()
    );
    assert_eq!(
        compressed[1].1,
        Array::from_vec(vec![1], vec![true]).unwrap()
    );
}

#[test]
fn unsupported_dtypes_are_named() {
    for (name, needle) in [
        ("unsupported_i8.npy", "'|i1'"),
        ("unsupported_complex.npy", "'<c16'"),
        ("unsupported_object.npy", "'|O'"),
    ] {
        let err = load_npy(&file(name)).unwrap_err();
        assert!(matches!(err, NpyError::Unsupported(_)), "{name}: {err}");
        assert!(
            err.to_string().contains(needle.trim_matches('\'')),
            "{name}: {err}"
        );
    }
}

#[test]
fn missing_files_say_so() {
    let err = load_npy(Path::new("/nonexistent/x.npy")).unwrap_err();
    assert!(err.to_string().contains("No such file"), "{err}");
}

#[test]
fn written_files_match_numpy_layout_and_round_trip() {
    let a = Array::from_vec(vec![2, 3, 4], base()).unwrap();
    let mut bytes = Vec::new();
    write_npy(&mut bytes, &a).unwrap();
    // numpy's own file for the same array is byte-identical.
    assert_eq!(bytes, std::fs::read(file("f32_c.npy")).unwrap());
    let mut rng = Rng::new(5);
    for _ in 0..300 {
        let dtype = rng.pick(&[
            DType::F32,
            DType::F64,
            DType::F16,
            DType::I32,
            DType::I64,
            DType::U8,
            DType::Bool,
        ]);
        let ty = kfuse_ir::TensorType {
            dtype,
            shape: random_shape(&mut rng, 4),
        };
        let array = random_array(&mut rng, &ty);
        let mut buf = Vec::new();
        write_npy(&mut buf, &array).unwrap();
        assert_eq!(
            buf.len() % 64,
            (array.n_elems() * dtype.size_bytes()) % 64,
            "data is 64-byte aligned"
        );
        assert_eq!(read_npy(buf.as_slice()).unwrap(), array);
    }
}

#[test]
fn bf16_is_written_widened_to_f32() {
    let a = Array::from_vec(
        vec![2],
        vec![
            kfuse_ir::bf16::from_f32(1.5),
            kfuse_ir::bf16::from_f32(-3.0),
        ],
    )
    .unwrap();
    let mut buf = Vec::new();
    write_npy(&mut buf, &a).unwrap();
    assert_eq!(
        read_npy(buf.as_slice()).unwrap(),
        Array::from_vec(vec![2], vec![1.5f32, -3.0]).unwrap()
    );
}

#[test]
fn saving_is_atomic_and_archives_round_trip() {
    let dir = std::env::temp_dir().join(format!("kfuse-npy-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let a = Array::from_vec(vec![3], vec![1.0f32, 2.0, 3.0]).unwrap();
    let path = dir.join("a.npy");
    save_npy(&path, &a).unwrap();
    assert_eq!(load_npy(&path).unwrap(), a);
    let arrays = vec![
        ("x".to_string(), a.clone()),
        (
            "flags".to_string(),
            Array::from_vec(vec![2], vec![true, false]).unwrap(),
        ),
    ];
    save_npz(&dir.join("both.npz"), &arrays).unwrap();
    assert_eq!(load_npz(&dir.join("both.npz")).unwrap(), arrays);
    // No temporary files are left behind.
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
    // A save into a missing directory fails cleanly.
    assert!(save_npy(&dir.join("missing-dir/b.npy"), &a).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn truncated_and_corrupted_files_are_errors() {
    let good = std::fs::read(file("f32_c.npy")).unwrap();
    for cut in [0, 5, 9, 40, good.len() - 1] {
        let err = read_npy(&good[..cut]).unwrap_err();
        assert!(matches!(err, NpyError::Format(_)), "cut {cut}: {err}");
    }
    let err = read_npy(&good[..good.len() - 4]).unwrap_err();
    assert!(
        err.to_string().contains("needs 96 bytes, found 92"),
        "{err}"
    );
    let mut lying = good.clone();
    let header = String::from_utf8_lossy(&lying[10..128]).replace("(2, 3, 4)", "(9, 9, 9)");
    lying[10..128].copy_from_slice(header.as_bytes());
    assert!(read_npy(lying.as_slice()).is_err());
    let mut huge = good.clone();
    let header = String::from_utf8_lossy(&huge[10..128])
        .replace("(2, 3, 4)", "(99999999999, 99999999999, 9)");
    let header = format!("{header:<118}");
    huge.splice(10..128, header.bytes().take(118));
    assert!(read_npy(huge.as_slice()).is_err());
    // Random corruption never panics.
    let mut rng = Rng::new(11);
    for _ in 0..2000 {
        let mut bytes = good.clone();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(bytes.len());
            bytes[at] = rng.next_u64() as u8;
        }
        let _ = read_npy(bytes.as_slice());
    }
    assert!(load_npz(&file("f32_c.npy")).is_err());
}

/// `.npy` bytes with `header` (padded as numpy pads it) followed by `data`.
fn npy_with_header(header: &str, data: &[u8]) -> Vec<u8> {
    let mut header = header.to_string();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

#[test]
fn headers_with_multi_byte_characters_are_errors_not_panics() {
    let headers = [
        // The byte-order mark of `descr` is where a byte index once split a character.
        "{'descr': 'é4', 'fortran_order': False, 'shape': (1,), }",
        "{'descr': '€', 'fortran_order': False, 'shape': (1,), }",
        "{'descr': '<f€', 'fortran_order': False, 'shape': (1,), }",
        "{'dé': '<f4', 'fortran_order': False, 'shape': (1,), }",
        "{'descr': '<f4', 'fortran_order': Fałse, 'shape': (1,), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (１,), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)€ }",
        "{'descr': 'ü",
        "{\"😀",
    ];
    for header in headers {
        let bytes = npy_with_header(header, &[0; 4]);
        let err = read_npy(bytes.as_slice()).unwrap_err();
        assert!(
            matches!(err, NpyError::Format(_) | NpyError::Unsupported(_)),
            "{header}: {err}"
        );
    }
    let err = read_npy(
        npy_with_header(
            "{'descr': 'é4', 'fortran_order': False, 'shape': (1,), }",
            &[0; 4],
        )
        .as_slice(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("dtype \"é4\""), "{err}");
}

#[test]
fn shapes_whose_strides_overflow_are_errors_even_when_empty() {
    // No elements, but the product of the other extents overflows, as would its strides.
    for (order, shape) in [
        ("False", "(0, 1099511627776, 1099511627776)"),
        ("True", "(2, 1099511627776, 1099511627776, 0)"),
    ] {
        let header = format!("{{'descr': '<f4', 'fortran_order': {order}, 'shape': {shape}, }}");
        let err = read_npy(npy_with_header(&header, &[]).as_slice()).unwrap_err();
        assert!(err.to_string().contains("is too large"), "{shape}: {err}");
    }
    // An empty array whose extents fit still reads, in either order.
    let header = "{'descr': '<f4', 'fortran_order': True, 'shape': (3, 0, 5), }";
    let empty = read_npy(npy_with_header(header, &[]).as_slice()).unwrap();
    assert_eq!(empty.shape().dims(), &[3, 0, 5]);
}

#[test]
fn a_header_declaring_more_than_the_file_holds_is_refused_before_reading() {
    let dir = std::env::temp_dir().join(format!("kfuse-npy-huge-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("huge.npy");
    // 2^40 f32 elements: 4 TiB declared, 16 bytes present.
    let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }";
    std::fs::write(&path, npy_with_header(header, &[0; 16])).unwrap();
    let err = load_npy(&path).unwrap_err();
    assert!(
        err.to_string()
            .contains("needs 4398046511104 bytes, found 16"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An archive of `.npy` members written as given, stored or deflated.
fn archive(members: &[(&str, Vec<u8>)], method: zip::CompressionMethod) -> Vec<u8> {
    let mut cursor = std::io::Cursor::new(Vec::new());
    let mut zip = zip::ZipWriter::new(&mut cursor);
    let options = zip::write::SimpleFileOptions::default().compression_method(method);
    for (name, bytes) in members {
        zip.start_file(*name, options).unwrap();
        std::io::Write::write_all(&mut zip, bytes).unwrap();
    }
    zip.finish().unwrap();
    cursor.into_inner()
}

#[test]
fn archive_members_are_checked_against_expected_types_before_their_data() {
    let good = std::fs::read(file("f32_c.npy")).unwrap();
    // A member whose header declares a million elements but whose data is missing: if its data
    // were read before the check, the error would be about truncation instead.
    let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000, 1000), }";
    let liar = npy_with_header(header, &[]);
    for method in [
        zip::CompressionMethod::Stored,
        zip::CompressionMethod::Deflated,
    ] {
        let bytes = archive(&[("a.npy", good.clone()), ("b.npy", liar.clone())], method);
        let mut seen = Vec::new();
        let err = kfuse_npy::read_npz_checked(std::io::Cursor::new(&bytes), |name, ty| {
            seen.push((name.to_string(), ty.to_string()));
            if ty.shape.dims() == [2, 3, 4] {
                Ok(())
            } else {
                Err(format!("expected f32[2, 3, 4], found {ty}"))
            }
        })
        .unwrap_err();
        assert!(matches!(err, NpyError::Rejected(_)), "{err}");
        assert_eq!(
            err.to_string(),
            "b.npy: expected f32[2, 3, 4], found f32[1000, 1000]"
        );
        assert_eq!(
            seen,
            vec![
                ("a".to_string(), "f32[2, 3, 4]".to_string()),
                ("b".to_string(), "f32[1000, 1000]".to_string())
            ]
        );
        // Unchecked, the same member fails on the sizes its archive entry records.
        let err = kfuse_npy::read_npz(std::io::Cursor::new(&bytes)).unwrap_err();
        assert!(
            err.to_string().contains(
                "b.npy: data is truncated: shape [1000, 1000] of f32 needs 4000000 bytes, found 0"
            ),
            "{err}"
        );
    }
}

/// A fresh scratch directory for the output-file tests.
fn output_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kfuse-npy-out-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Saving never writes through a symbolic link planted where a temporary file might go: the
/// file it points to keeps its contents, and the output is written in full.
#[test]
fn saving_never_writes_through_a_planted_link() {
    let dir = output_dir("links");
    let victim = dir.join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let target = dir.join("out.npy");
    let pid = std::process::id();
    // The names the writer has used or may use for its temporary file.
    for planted in [
        format!(".out.npy.{pid}.tmp"),
        format!(".kfuse-{pid}-0-out.npy.tmp"),
        format!(".kfuse-{pid}-1-out.npy.tmp"),
    ] {
        std::os::unix::fs::symlink(&victim, dir.join(planted)).unwrap();
    }
    let array = Array::from_vec(vec![3], vec![1.0f32, 2.0, 3.0]).unwrap();
    save_npy(&target, &array).unwrap();
    // Again over the existing file, which takes the rename path.
    save_npy(&target, &array).unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert_eq!(load_npy(&target).unwrap(), array);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An output whose name is as long as the file system allows is written: the temporary name
/// stays within the limit.
#[test]
fn outputs_with_the_longest_names_are_written() {
    let dir = output_dir("long");
    let name = format!("{}.npy", "n".repeat(251));
    let array = Array::from_vec(vec![2], vec![7i32, 8]).unwrap();
    let path = dir.join(&name);
    save_npy(&path, &array).unwrap();
    save_npy(&path, &array).unwrap();
    assert_eq!(load_npy(&path).unwrap(), array);
    save_npz(
        &dir.join(format!("{}.npz", "z".repeat(251))),
        &[("a".into(), array)],
    )
    .unwrap();
    // Nothing but the outputs is left in the directory.
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 2, "{names:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
