//! Text-in, text-out tests of the `.kf` form. Each file in `tests/filetests` starts with
//! `# test: print` (parse, print; the expected text follows) or `# test: error` (parsing must
//! fail; the expected message follows), then the input, then a line `# ==== expected` and the
//! expected output. `KFUSE_BLESS=1 cargo test` rewrites the expected parts after a deliberate
//! change.

use std::path::Path;

use kfuse_ir::text::{parse_graph, print_graph};

const MARKER: &str = "# ==== expected\n";

fn run_file(path: &Path, bless: bool) -> Result<(), String> {
    let content = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let (input, expected) = content
        .split_once(MARKER)
        .ok_or("missing the `# ==== expected` line")?;
    let mode = input.lines().next().unwrap_or("").trim();
    let actual = match mode {
        "# test: print" => {
            let graph = parse_graph(input).map_err(|e| format!("parse failed: {e}"))?;
            let printed = print_graph(&graph);
            let again =
                parse_graph(&printed).map_err(|e| format!("printed text does not parse: {e}"))?;
            if again != graph {
                return Err("printed text parses to a different graph".into());
            }
            printed
        }
        "# test: error" => match parse_graph(input) {
            Ok(_) => return Err("expected a parse error, but the program parsed".into()),
            Err(e) => format!("{e}\n"),
        },
        other => return Err(format!("unknown test header {other:?}")),
    };
    if actual == expected {
        return Ok(());
    }
    if bless {
        std::fs::write(path, format!("{input}{MARKER}{actual}")).map_err(|e| e.to_string())?;
        return Ok(());
    }
    Err(format!("expected:\n{expected}\nactual:\n{actual}"))
}

#[test]
fn filetests() {
    let bless = std::env::var_os("KFUSE_BLESS").is_some();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filetests");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    assert!(
        paths.len() >= 10,
        "filetests missing from {}",
        dir.display()
    );
    let failures: Vec<String> = paths
        .iter()
        .filter_map(|p| {
            run_file(p, bless)
                .err()
                .map(|e| format!("{}: {e}", p.display()))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} filetest(s) failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
