//! Every op against known values. Each file in `tests/ops` is a program whose data are constants,
//! followed by expectation lines:
//!
//! * `# expect "out" = [values] : type` — bitwise equal (any NaN matches any NaN; `-0.0` and
//!   `0.0` differ);
//! * `# expect "out" ~ TOL = [values] : type` — within `TOL * max(1, |want|)`, same NaN and
//!   infinity positions;
//! * `# error "text"` — the run fails with a message containing `text`.

use std::path::Path;

use kfuse_interp::{run, CustomOps};
use kfuse_ir::text::parse_graph;
use kfuse_ir::{Array, Op};

fn expected_array(values: &str, ty: &str) -> Result<Array, String> {
    let g = parse_graph(&format!("%e = constant() value={values} : {ty}\n"))
        .map_err(|e| format!("bad expectation: {e}"))?;
    match &g.nodes()[0].op {
        Op::Constant { value } => Ok(value.clone()),
        _ => unreachable!(),
    }
}

fn compare(name: &str, got: &Array, want: &Array, tol: Option<f64>) -> Result<(), String> {
    if got.ty() != want.ty() {
        return Err(format!(
            "{name}: type {} but expected {}",
            got.ty(),
            want.ty()
        ));
    }
    for i in 0..got.n_elems() {
        let (g, w) = (got.get_f64(i), want.get_f64(i));
        let ok = match tol {
            None => (g.is_nan() && w.is_nan()) || got.get_bits(i) == want.get_bits(i),
            Some(t) => {
                (g.is_nan() && w.is_nan())
                    || (w.is_infinite() && g == w)
                    || (w.is_finite() && (g - w).abs() <= t * w.abs().max(1.0))
            }
        };
        if !ok {
            return Err(format!(
                "{name}[{i}]: got {g:e} ({:#x}), expected {w:e} ({:#x})",
                got.get_bits(i),
                want.get_bits(i)
            ));
        }
    }
    Ok(())
}

fn run_file(path: &Path) -> Result<usize, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let graph = parse_graph(&text).map_err(|e| format!("parse: {e}"))?;
    let result = run(&graph, &[], &CustomOps::new());
    let mut checked = 0;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# error ") {
            let want = rest.trim().trim_matches('"');
            match &result {
                Ok(_) => {
                    return Err(format!(
                        "expected an error containing {want:?}, but the run succeeded"
                    ))
                }
                Err(e) if e.to_string().contains(want) => checked += 1,
                Err(e) => return Err(format!("expected an error containing {want:?}, got: {e}")),
            }
        }
        let Some(rest) = line.strip_prefix("# expect ") else {
            continue;
        };
        let outputs = result.as_ref().map_err(|e| format!("run failed: {e}"))?;
        let (name, rest) = rest
            .trim_start_matches('"')
            .split_once('"')
            .ok_or("expect needs a quoted output name")?;
        let rest = rest.trim();
        let (tol, rest) = match rest.strip_prefix('~') {
            Some(r) => {
                let (t, r) = r
                    .trim()
                    .split_once(' ')
                    .ok_or("expect ~ needs a tolerance")?;
                (
                    Some(t.parse::<f64>().map_err(|_| format!("bad tolerance {t}"))?),
                    r.trim(),
                )
            }
            None => (None, rest),
        };
        let rest = rest.strip_prefix('=').ok_or("expect needs `=`")?.trim();
        let (values, ty) = rest.rsplit_once(':').ok_or("expect needs `: type`")?;
        let want = expected_array(values.trim(), ty.trim())?;
        let got = &outputs
            .iter()
            .find(|(n, _)| n == name)
            .ok_or(format!("no output named {name:?}"))?
            .1;
        compare(name, got, &want, tol)?;
        checked += 1;
    }
    Ok(checked)
}

#[test]
fn every_op_matches_known_values() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ops");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    let mut failures = Vec::new();
    let mut total = 0;
    for p in &paths {
        match run_file(p) {
            Ok(0) => failures.push(format!("{}: no expectations", p.display())),
            Ok(n) => total += n,
            Err(e) => failures.push(format!("{}: {e}", p.display())),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(total > 150, "only {total} expectations checked");
}
