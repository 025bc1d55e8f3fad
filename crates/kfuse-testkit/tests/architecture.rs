//! Architecture invariants from ARCHITECTURE.md, checked: dependencies between kfuse crates point
//! one way, the test kit is never a dependency of a product crate, and the core crates do no I/O
//! and no unsafe code.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Each crate and the kfuse crates it may depend on (normal dependencies).
const ALLOWED: &[(&str, &[&str])] = &[
    ("kfuse-ir", &[]),
    ("kfuse-math", &[]),
    ("kfuse-interp", &["kfuse-ir", "kfuse-math"]),
    ("kfuse-npy", &["kfuse-ir"]),
    ("kfuse-opt", &["kfuse-ir", "kfuse-interp"]),
    ("kfuse-fusion", &["kfuse-ir"]),
    ("kfuse-kernel", &["kfuse-ir", "kfuse-fusion"]),
    // The hand-written routines know nothing of the compiler.
    ("kfuse-routines", &["kfuse-ir", "kfuse-math"]),
    (
        "kfuse-cpu",
        &[
            "kfuse-ir",
            "kfuse-math",
            "kfuse-interp",
            "kfuse-kernel",
            "kfuse-routines",
        ],
    ),
    (
        "kfuse-runtime",
        &[
            "kfuse-ir",
            "kfuse-interp",
            "kfuse-opt",
            "kfuse-fusion",
            "kfuse-kernel",
            "kfuse-cpu",
            "kfuse-routines",
        ],
    ),
    (
        "kfuse",
        &[
            "kfuse-ir",
            "kfuse-opt",
            "kfuse-interp",
            "kfuse-npy",
            "kfuse-fusion",
            "kfuse-kernel",
            "kfuse-cpu",
            "kfuse-routines",
            "kfuse-runtime",
        ],
    ),
    ("kfuse-mem", &[]),
    ("kfuse-cli", &["kfuse", "kfuse-mem"]),
    ("kfuse-testkit", &["kfuse-ir"]),
];

/// Crates that must not touch files, processes, the network, or write `unsafe`.
const PURE: &[&str] = &[
    "kfuse-ir",
    "kfuse-math",
    "kfuse-interp",
    "kfuse-fusion",
    "kfuse-kernel",
];

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The kfuse dependencies listed under `section` of a manifest.
fn kfuse_deps(manifest: &str, section: &str) -> Vec<String> {
    let mut deps = Vec::new();
    let mut inside = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == section;
        } else if inside && line.starts_with("kfuse") {
            deps.push(
                line.split(|c: char| c == '=' || c == '.' || c.is_whitespace())
                    .next()
                    .unwrap()
                    .to_string(),
            );
        }
    }
    deps
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn dependencies_point_one_way() {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(crates_dir()).unwrap() {
        let dir = entry.unwrap().path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "{name}: the directory must be named as the crate"
        );
        let Some(permitted) = allowed.get(name.as_str()) else {
            panic!("{name} is not in the dependency table of this test and ARCHITECTURE.md");
        };
        for dep in kfuse_deps(&manifest, "[dependencies]") {
            assert!(
                permitted.contains(&dep.as_str()),
                "{name} must not depend on {dep}"
            );
        }
        seen.push(name);
    }
    assert_eq!(seen.len(), ALLOWED.len(), "crates found: {seen:?}");
}

#[test]
fn core_crates_do_no_io_and_no_unsafe() {
    for name in PURE {
        let mut files = Vec::new();
        rust_files(&crates_dir().join(name).join("src"), &mut files);
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for forbidden in ["unsafe", "std::fs", "std::net", "std::process", "std::io::"] {
                assert!(
                    !text.contains(forbidden),
                    "{} uses {forbidden}",
                    file.display()
                );
            }
        }
    }
}

#[test]
fn memory_fusion_keeps_its_unsafe_code_in_one_module() {
    let mut files = Vec::new();
    rust_files(&crates_dir().join("kfuse-mem").join("src"), &mut files);
    assert!(files.len() > 1);
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        if file.file_name().unwrap() != "sys.rs" {
            assert!(!text.contains("unsafe"), "{} uses unsafe", file.display());
        }
    }
}
