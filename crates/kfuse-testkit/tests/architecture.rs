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
    ("kfuse-autodiff", &["kfuse-ir"]),
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
            "kfuse-autodiff",
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
    "kfuse-autodiff",
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

/// The top-level modules of crate `name` (`src/m.rs` with what lies under `src/m/`) and, for
/// each, the other top-level modules its code names through `crate::` (names that `lib.rs`
/// re-exports count as their module's). Comments are not code.
fn module_graph(name: &str) -> BTreeMap<String, std::collections::BTreeSet<String>> {
    let src = crates_dir().join(name).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let module_of = |file: &Path| {
        let rel = file.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        first.trim_end_matches(".rs").to_string()
    };
    let modules: std::collections::BTreeSet<String> = files
        .iter()
        .map(|f| module_of(f))
        .filter(|m| m != "lib")
        .collect();
    let code = |file: &Path| -> String {
        std::fs::read_to_string(file)
            .unwrap()
            .lines()
            .map(|l| l.split("//").next().unwrap())
            .collect::<Vec<_>>()
            .join("\n")
    };
    // `pub use module::{A, B};` and `pub use module::A;` in lib.rs.
    let mut reexported: BTreeMap<String, String> = BTreeMap::new();
    let lib = code(&src.join("lib.rs"));
    for item in lib.split(';') {
        let Some(path) = item.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, rest)) = path.split_once("::") else {
            continue;
        };
        if modules.contains(module) {
            for name in rest.trim_matches(|c| c == '{' || c == '}').split(',') {
                let name = name.trim().rsplit("::").next().unwrap().trim();
                reexported.insert(name.to_string(), module.to_string());
            }
        }
    }
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut graph: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let from = module_of(file);
        if from == "lib" {
            continue;
        }
        let text = code(file);
        let mut named = Vec::new();
        for (at, _) in text.match_indices("crate::") {
            let rest = &text[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                named.extend(group.split(',').map(|p| ident(p.trim())));
            } else {
                named.push(ident(rest));
            }
        }
        let edges = graph.entry(from.clone()).or_default();
        for name in named {
            let to = if modules.contains(&name) {
                name
            } else if let Some(module) = reexported.get(&name) {
                module.clone()
            } else {
                continue;
            };
            if to != from {
                edges.insert(to);
            }
        }
    }
    graph
}

/// A cycle in `graph`, if it has one, as the modules along it.
fn find_cycle(graph: &BTreeMap<String, std::collections::BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, std::collections::BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut std::collections::BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|p| p == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = std::collections::BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// Modules inside the backend and the routines depend on each other one way, as the crates do:
/// a module can be read, tested and replaced from the bottom up.
#[test]
fn modules_have_no_import_cycle() {
    for name in ["kfuse-routines", "kfuse-cpu"] {
        let graph = module_graph(name);
        assert!(graph.len() >= 3, "{name}: modules found: {graph:?}");
        if let Some(cycle) = find_cycle(&graph) {
            panic!("{name}: modules import each other: {}", cycle.join(" -> "));
        }
    }
}

/// The cycle check finds a cycle where there is one.
#[test]
fn a_cycle_between_modules_is_found() {
    let mut graph: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    graph.entry("a".into()).or_default().insert("b".into());
    graph.entry("b".into()).or_default().insert("c".into());
    graph.entry("c".into()).or_default();
    assert_eq!(find_cycle(&graph), None);
    graph.get_mut("c").unwrap().insert("a".into());
    assert_eq!(
        find_cycle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}
