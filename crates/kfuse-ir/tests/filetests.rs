//! Text-in, text-out tests of the `.kf` form. Each file in `tests/filetests` starts with
//! `# test: print` (parse, print; the expected text follows) or `# test: error` (parsing must
//! fail; the expected message follows), then the input, then a line `# ==== expected` and the
//! expected output. `KFUSE_BLESS=1 cargo test` rewrites the expected parts after a deliberate
//! change.

use std::path::Path;

use kfuse_ir::text::{parse_graph, print_graph};

fn check(header: &str, input: &str) -> Result<String, String> {
    match header {
        "# test: print" => {
            let graph = parse_graph(input).map_err(|e| format!("parse failed: {e}"))?;
            let printed = print_graph(&graph);
            let again =
                parse_graph(&printed).map_err(|e| format!("printed text does not parse: {e}"))?;
            if again != graph {
                return Err("printed text parses to a different graph".into());
            }
            Ok(printed)
        }
        "# test: error" => match parse_graph(input) {
            Ok(_) => Err("expected a parse error, but the program parsed".into()),
            Err(e) => Ok(format!("{e}\n")),
        },
        other => Err(format!("unknown test header {other:?}")),
    }
}

#[test]
fn filetests() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filetests");
    let n = kfuse_testkit::run_filetests(&dir, check);
    assert!(n >= 46, "only {n} file tests in {}", dir.display());
}
