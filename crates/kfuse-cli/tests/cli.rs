//! The `kfuse` binary end to end: numpy-matching results on .npy data, clear errors with a
//! non-zero exit for every kind of bad input, and no panic on malformed programs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kfuse_ir::Array;
use kfuse_testkit::{skip, Prerequisite};

fn kfuse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kfuse"))
        .args(args)
        .output()
        .expect("kfuse runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kfuse-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn programs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs")
}

/// Compares a kfuse output with numpy's float64 (or exact integer/bool) reference.
fn assert_close(case: &str, name: &str, got: &Array, want: &Array) {
    assert_eq!(got.shape(), want.shape(), "{case}/{name}: shape");
    let exact = !want.dtype().is_float();
    if exact {
        assert_eq!(got.dtype(), want.dtype(), "{case}/{name}: dtype");
    }
    for i in 0..got.n_elems() {
        let (g, w) = (got.get_f64(i), want.get_f64(i));
        let ok = if exact {
            g == w
        } else {
            (g - w).abs() <= 2e-5 * w.abs().max(1.0) || (g.is_nan() && w.is_nan())
        };
        assert!(ok, "{case}/{name}[{i}]: kfuse {g}, numpy {w}");
    }
}

#[test]
fn run_matches_numpy_on_every_fixture_program() {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(programs())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    cases.sort();
    assert!(cases.len() >= 6);
    for case in cases {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let out_dir = scratch(&name);
        let mut args = vec![
            "run".to_string(),
            case.join("program.kf").display().to_string(),
        ];
        for entry in std::fs::read_dir(&case).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "npy") {
                let input = path.file_stem().unwrap().to_string_lossy().into_owned();
                args.push("--input".into());
                args.push(format!("{input}={}", path.display()));
            }
        }
        args.push("--output-dir".into());
        args.push(out_dir.display().to_string());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = kfuse(&args);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let mut checked = 0;
        for entry in std::fs::read_dir(case.join("expected")).unwrap() {
            let path = entry.unwrap().path();
            let output = path.file_name().unwrap().to_string_lossy().into_owned();
            let want = kfuse_npy::load_npy(&path).unwrap();
            let got = kfuse_npy::load_npy(&out_dir.join(&output))
                .unwrap_or_else(|e| panic!("{name}/{output}: {e}"));
            assert_close(&name, &output, &got, &want);
            checked += 1;
        }
        assert!(checked > 0, "{name}: no expected outputs");
        std::fs::remove_dir_all(&out_dir).unwrap();
    }
}

#[test]
fn inputs_can_come_from_an_npz_archive() {
    let dir = scratch("npz");
    let case = programs().join("integers");
    let a = kfuse_npy::load_npy(&case.join("a.npy")).unwrap();
    let b = kfuse_npy::load_npy(&case.join("b.npy")).unwrap();
    kfuse_npy::save_npz(&dir.join("in.npz"), &[("a".into(), a), ("b".into(), b)]).unwrap();
    let o = kfuse(&[
        "run",
        case.join("program.kf").to_str().unwrap(),
        "--inputs-npz",
        dir.join("in.npz").to_str().unwrap(),
        "--output-dir",
        dir.join("out").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let want = kfuse_npy::load_npy(&case.join("expected/q.npy")).unwrap();
    assert_eq!(kfuse_npy::load_npy(&dir.join("out/q.npy")).unwrap(), want);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A member of the wrong shape, or one the program does not take, is refused from its header,
/// before its data is decompressed.
#[test]
fn npz_members_are_checked_against_the_program_before_their_data() {
    let dir = scratch("npz-shapes");
    let case = programs().join("integers");
    let program = case.join("program.kf");
    let a = kfuse_npy::load_npy(&case.join("a.npy")).unwrap();
    let wide = Array::from_vec(vec![5], vec![1i32, 2, 3, 4, 5]).unwrap();
    kfuse_npy::save_npz(
        &dir.join("wrong.npz"),
        &[("a".into(), a.clone()), ("b".into(), wide.clone())],
    )
    .unwrap();
    kfuse_npy::save_npz(&dir.join("stray.npz"), &[("z".into(), wide)]).unwrap();
    let out = dir.join("out").display().to_string();
    let wrong = dir.join("wrong.npz").display().to_string();
    let stray = dir.join("stray.npz").display().to_string();
    let p = program.to_str().unwrap();
    fails_with(
        &["run", p, "--inputs-npz", &wrong, "--output-dir", &out],
        "b.npy: input \"b\": expected i32[4], found i32[5] (in its header; the data was not read)",
    );
    fails_with(
        &["run", p, "--inputs-npz", &stray, "--output-dir", &out],
        "z.npy: \"z\" is not an input of this program",
    );
    fails_with(
        &["run", p, "--constants", &wrong, "--output-dir", &out],
        "b.npy: input \"b\": expected i32[4], found i32[5]",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A reader that stops early (`kfuse check big.kf | head -1`) ends kfuse quietly, as it ends any
/// Unix tool: no panic about failed printing, and either success or death by SIGPIPE.
#[test]
fn a_closed_standard_output_ends_kfuse_quietly() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::ExitStatusExt;
    let dir = scratch("closed-stdout");
    let program = dir.join("chain.kf");
    // Thousands of lines of output, far more than a pipe holds, so kfuse is still writing when
    // the reader goes.
    let mut text = String::from("%x = input() name=\"x\" : f32[4]\n%a0 = add(%x, %x)\n");
    for i in 1..6000 {
        text += &format!("%a{i} = add(%a{}, %x)\n", i - 1);
    }
    text += "output \"y\" = %a5999\n";
    std::fs::write(&program, text).unwrap();
    let p = program.to_str().unwrap();
    let commands: [&[&str]; 2] = [
        &["check", p],
        &["explain", p, "--cost-model", "fixed", "--fuse", "none"],
    ];
    for args in commands {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kfuse"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        // The reader, and with it the pipe's only read end, is dropped after one line.
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert!(!first.is_empty(), "{args:?} printed nothing");
        let out = child.wait_with_output().unwrap();
        let err = stderr(&out);
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?}: {err}"
        );
        assert!(
            out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
            "{args:?}: {:?} {err}",
            out.status
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn check_prints_the_program_with_types() {
    let o = kfuse(&["check", programs().join("mlp/program.kf").to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("%3 = matmul(%0, %1) : f32[4, 5]"), "{text}");
    assert!(
        stderr(&o).starts_with("ok: 11 nodes; inputs [x: f32[4, 8], w: f32[8, 5], b: f32[5]]"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn demo_runs_and_checks_itself() {
    let dir = scratch("demo");
    let o = kfuse(&["demo", "--output-dir", dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("argmax agrees with probs: true"), "{text}");
    // The plan, with the GELU in the first matmul's epilogue; the compiled runs checked
    // against the reference; the timed comparison.
    assert!(text.contains("policy cost; 5 kernel(s)"), "{text}");
    assert!(
        text.contains("add %15 + gelu %16 applied to each output tile"),
        "{text}"
    );
    assert!(
        text.contains("strict numerics: 3 fused kernel(s)")
            && text.contains("outputs bit-identical to the reference: true"),
        "{text}"
    );
    let fast = text
        .lines()
        .find_map(|l| l.strip_prefix("  largest difference from the reference: "))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
        .expect("the fast run's difference");
    assert!(fast < 1e-5, "{text}");
    assert!(text.contains("fused kernels: "), "{text}");
    // What the demo wrote runs again through `kfuse run`, compiled in strict mode, to bit-identical
    // results.
    let mut args = vec![
        "run".to_string(),
        dir.join("demo.kf").display().to_string(),
        "--numerics".into(),
        "strict".into(),
        "--output-dir".into(),
        dir.join("again").display().to_string(),
    ];
    for input in ["x", "gamma", "w1", "b1", "w2"] {
        args.push("--input".into());
        args.push(format!(
            "{input}={}",
            dir.join(format!("{input}.npy")).display()
        ));
    }
    let o = kfuse(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    for out in ["probs.npy", "class.npy"] {
        assert_eq!(
            kfuse_npy::load_npy(&dir.join(out)).unwrap(),
            kfuse_npy::load_npy(&dir.join("again").join(out)).unwrap()
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs kfuse and expects a clean failure whose message contains `needle`.
fn fails_with(args: &[&str], needle: &str) {
    let o = kfuse(args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
    assert!(
        err.lines().any(|l| l.starts_with("error: ")) && err.contains(needle),
        "{args:?}: {err}"
    );
    assert!(!err.contains("panicked"), "{args:?}: {err}");
}

#[test]
fn bad_input_of_every_kind_is_a_clear_error() {
    let dir = scratch("errors");
    let mlp = programs().join("mlp");
    let prog = mlp.join("program.kf");
    let p = prog.to_str().unwrap();
    let out = dir.join("out");
    let o = out.to_str().unwrap();
    let x = format!("x={}", mlp.join("x.npy").display());
    let w = format!("w={}", mlp.join("w.npy").display());
    let b = format!("b={}", mlp.join("b.npy").display());
    fails_with(
        &["check", "/nonexistent/prog.kf"],
        "cannot read /nonexistent/prog.kf: No such file",
    );
    fails_with(
        &["run", p, "--input", &x, "--input", &w, "--output-dir", o],
        "missing input \"b\" (expected f32[5])",
    );
    fails_with(
        &["run", p, "--input", "x=/nonexistent.npy", "--output-dir", o],
        "cannot read /nonexistent.npy (input \"x\")",
    );
    fails_with(
        &["run", p, "--input", "x", "--output-dir", o],
        "expected NAME=FILE.npy",
    );
    let wrong = format!("b={}", mlp.join("x.npy").display());
    fails_with(
        &[
            "run",
            p,
            "--input",
            &x,
            "--input",
            &w,
            "--input",
            &wrong,
            "--output-dir",
            o,
        ],
        "input \"b\": expected f32[5], found f32[4, 8]",
    );
    let extra = format!("bias={}", mlp.join("b.npy").display());
    fails_with(
        &[
            "run",
            p,
            "--input",
            &x,
            "--input",
            &w,
            "--input",
            &b,
            "--input",
            &extra,
            "--output-dir",
            o,
        ],
        "\"bias\" is not an input of this program",
    );
    // Program errors carry file:line:col.
    let bad = dir.join("bad.kf");
    std::fs::write(
        &bad,
        "%x = input() name=\"x\" : f32[2, 3]\n%y = input() name=\"y\" : f32[4]\n%z = add(%x, %y)\n",
    )
    .unwrap();
    fails_with(&["check", bad.to_str().unwrap()], &format!("{}:3:1: `%z` (add): operand 1: expected a shape that broadcasts with [2, 3], found f32[4]", bad.display()));
    std::fs::write(&bad, [0xff, 0xfe, b'%']).unwrap();
    fails_with(&["check", bad.to_str().unwrap()], "not UTF-8 text");
    // Output names that would escape the output directory are refused before anything runs.
    let escape = dir.join("escape.kf");
    std::fs::write(
        &escape,
        "%c = constant() value=[1.0] : f32[1]\noutput \"../evil\" = %c\n",
    )
    .unwrap();
    fails_with(
        &["run", escape.to_str().unwrap(), "--output-dir", o],
        "cannot be used as a file name",
    );
    assert!(!dir.join("evil.npy").exists());
    // A data-dependent failure names the node.
    let gather = dir.join("gather.kf");
    std::fs::write(&gather, "%x = constant() value=[1.0, 2.0] : f32[2]\n%i = constant() value=[2] : i64[1]\n%g = gather(%x, %i) axis=0\noutput \"g\" = %g\n").unwrap();
    fails_with(
        &["run", gather.to_str().unwrap(), "--output-dir", o],
        "node %2 (gather): index 2 is out of range for axis 0 of size 2",
    );
    let npy_as_program = mlp.join("x.npy");
    fails_with(
        &["check", npy_as_program.to_str().unwrap()],
        "not UTF-8 text",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A tensor too large for the machine is an error naming its node, its type and its size, in
/// both engines: the size is checked before anything is allocated, never an aborted process.
#[test]
fn sizes_too_large_to_allocate_are_clear_errors_in_both_engines() {
    let dir = scratch("too-large");
    let out = dir.join("out");
    let cases = [
        (
            "iota",
            "%x = iota() axis=0 : f32[1000000000000]\noutput \"x\" = %x\n",
            "node %0 (iota): f32[1000000000000] needs 4000000000000 bytes, more than the",
        ),
        (
            "pad",
            "%x = iota() axis=0 : f32[4]\n\
             %p = pad(%x) low=[0] high=[1000000000000] mode=constant value=0.0\n\
             output \"p\" = %p\n",
            "node %1 (pad): f32[1000000000004] needs 4000000000016 bytes, more than the",
        ),
        (
            "matmul",
            "%a = iota() axis=1 : f32[2, 100000000000]\n%b = iota() axis=0 : f32[100000000000, 2]\n\
             %c = matmul(%a, %b)\noutput \"c\" = %c\n",
            "node %0 (iota): f32[2, 100000000000] needs 800000000000 bytes, more than the",
        ),
        (
            "overflow",
            "%a = iota() axis=0 : f32[0, 4611686018427387904]\n%b = reduce_sum(%a) axes=[0]\n\
             output \"b\" = %b\n",
            "`%b` (reduce_sum): expected a result whose size fits in memory, found \
             f32[4611686018427387904]",
        ),
    ];
    for (name, text, needle) in cases {
        let program = dir.join(format!("{name}.kf"));
        std::fs::write(&program, text).unwrap();
        let p = program.to_str().unwrap();
        for engine in ["compiled", "reference"] {
            let args = [
                "run",
                p,
                "--engine",
                engine,
                "--output-dir",
                out.to_str().unwrap(),
            ];
            fails_with(&args, needle);
            assert!(
                !stderr(&kfuse(&args)).contains("memory allocation of"),
                "{name}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An empty tensor may have other dims whose product overflows; both engines reduce it.
#[test]
fn an_empty_tensor_with_huge_dims_reduces_in_both_engines() {
    let dir = scratch("empty-huge");
    let program = dir.join("empty.kf");
    std::fs::write(
        &program,
        "%a = iota() axis=0 : f32[0, 4611686018427387904]\n%b = reduce_sum(%a) axes=[1]\n\
         %c = iota() axis=0 : f32[2, 0, 4611686018427387904]\n%d = reduce_sum(%c) axes=[1, 2]\n\
         output \"b\" = %b\noutput \"d\" = %d\n",
    )
    .unwrap();
    for engine in ["compiled", "reference"] {
        let out = dir.join(engine);
        let o = kfuse(&[
            "run",
            program.to_str().unwrap(),
            "--engine",
            engine,
            "--output-dir",
            out.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(0), "{engine}: {}", stderr(&o));
        let b = kfuse_npy::load_npy(&out.join("b.npy")).unwrap();
        assert_eq!(b.shape().dims(), &[0]);
        let d = kfuse_npy::load_npy(&out.join("d.npy")).unwrap();
        assert_eq!(d.as_slice::<f32>(), Some(&[0.0f32, 0.0][..]), "{engine}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs kfuse to its end and returns its exit code, its peak resident memory in bytes and its
/// wall time. The memory comes from `wait4` for this child alone: `RUSAGE_CHILDREN` would take
/// the largest of every child the test binary has waited for, other tests' included.
fn kfuse_peak_memory(args: &[&str]) -> (Option<i32>, usize, std::time::Duration) {
    let start = std::time::Instant::now();
    let child = Command::new(env!("CARGO_BIN_EXE_kfuse"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("kfuse runs");
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: `rusage` is plain integers, for which all-zero bits are a valid value; `wait4`
    // writes only to the two locals it is given, and reaps a child this test spawned and that
    // nothing else waits for.
    let (reaped, usage) = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        (libc::wait4(pid, &mut status, 0, &mut usage), usage)
    };
    assert_eq!(reaped, pid, "{}", std::io::Error::last_os_error());
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    // Linux reports the peak in KiB.
    (code, usage.ru_maxrss as usize * 1024, start.elapsed())
}

/// A splat constant stays one value through parsing, verifying and printing: `kfuse check` on a
/// hundred lines each declaring a 1 GiB splat takes little time and memory. The same text on a
/// small shape still runs, in both engines.
#[test]
fn splat_constants_cost_nothing_until_they_run() {
    let dir = scratch("splats");
    let program = dir.join("splats.kf");
    let mut text = String::new();
    for i in 0..100 {
        text += &format!("%c{i} = constant() value={i}.5 : f32[268435456]\n");
    }
    text += "%s = add(%c0, %c1)\noutput \"s\" = %s\n";
    std::fs::write(&program, &text).unwrap();
    let p = program.to_str().unwrap();
    let (code, peak, elapsed) = kfuse_peak_memory(&["check", p]);
    assert_eq!(code, Some(0), "{}", stderr(&kfuse(&["check", p])));
    assert!(
        peak < 200 << 20,
        "kfuse check held {peak} bytes at its peak"
    );
    assert!(
        elapsed < std::time::Duration::from_secs(3),
        "kfuse check took {elapsed:?}"
    );
    let printed = String::from_utf8(kfuse(&["check", p]).stdout).unwrap();
    assert!(printed.contains("%99 = constant() value=99.5 : f32[268435456]\n"));

    let small = dir.join("small.kf");
    std::fs::write(
        &small,
        "%a = constant() value=1.5 : f32[3, 4]\n%b = constant() value=-2 : i32[4]\n\
         %c = constant() value=true : bool[2, 2]\n%i = iota() axis=1 : f32[3, 4]\n\
         %s = add(%i, %a)\n%t = mul(%b, %b)\n%u = not(%c)\n\
         output \"s\" = %s\noutput \"t\" = %t\noutput \"u\" = %u\n",
    )
    .unwrap();
    for engine in ["compiled", "reference"] {
        let out = dir.join(engine);
        let o = kfuse(&[
            "run",
            small.to_str().unwrap(),
            "--engine",
            engine,
            "--output-dir",
            out.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(0), "{engine}: {}", stderr(&o));
        let s = kfuse_npy::load_npy(&out.join("s.npy")).unwrap();
        let row = [1.5f32, 2.5, 3.5, 4.5];
        assert_eq!(s.as_slice::<f32>(), Some(&row.repeat(3)[..]), "{engine}");
        let t = kfuse_npy::load_npy(&out.join("t.npy")).unwrap();
        assert_eq!(t.as_slice::<i32>(), Some(&[4i32; 4][..]), "{engine}");
        let u = kfuse_npy::load_npy(&out.join("u.npy")).unwrap();
        assert_eq!(u.as_slice::<bool>(), Some(&[false; 4][..]), "{engine}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A misspelt workload name is an error naming it and every valid one, not an empty success.
#[test]
fn bench_refuses_unknown_workloads() {
    fails_with(
        &["bench", "--quick", "W1", "W9"],
        "unknown workload `W9`: kfuse bench takes W0, W1, W2a, W2b, W3, W4a, W4b, W5a, W5b, W6a",
    );
}

/// A thread count kfuse cannot use is an error naming it, not a silent fallback.
#[test]
fn a_bad_thread_count_is_refused() {
    let program = programs().join("indexing/program.kf");
    for bad in ["0", "two", "-3"] {
        let o = Command::new(env!("CARGO_BIN_EXE_kfuse"))
            .args(["check", program.to_str().unwrap()])
            .env("KFUSE_THREADS", bad)
            .output()
            .expect("kfuse runs");
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "KFUSE_THREADS={bad}: {err}");
        assert!(err.contains(&format!("KFUSE_THREADS=\"{bad}\"")), "{err}");
    }
    let o = Command::new(env!("CARGO_BIN_EXE_kfuse"))
        .args(["check", program.to_str().unwrap()])
        .env("KFUSE_THREADS", "2")
        .output()
        .expect("kfuse runs");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn malformed_program_files_never_panic_the_cli() {
    let dir = scratch("fuzz");
    let mut rng = kfuse_testkit::Rng::new(2718);
    let base = std::fs::read_to_string(programs().join("indexing/program.kf")).unwrap();
    let path = dir.join("p.kf");
    for round in 0..120 {
        let text = kfuse_testkit::mutate_text(&mut rng, &base);
        std::fs::write(&path, &text).unwrap();
        let o = kfuse(&["check", path.to_str().unwrap()]);
        assert!(
            matches!(o.status.code(), Some(0) | Some(1)),
            "round {round}: exit {:?}\n{text}\n{}",
            o.status,
            stderr(&o)
        );
        assert!(
            !stderr(&o).contains("panicked"),
            "round {round}: {}",
            stderr(&o)
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name)
        .display()
        .to_string()
}

#[test]
fn explain_shows_folded_batchnorm_and_the_structured_block() {
    let o = kfuse(&[
        "explain",
        &example("separable_block.kf"),
        "--cost-model",
        "fixed",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("pass fold-affine: sub %10, div %13, mul %14, add %15 folded into the weights of conv2d %9"),
        "{text}"
    );
    assert!(
        text.contains("policy cost; 1 kernel(s) (unfused: 4)"),
        "{text}"
    );
    assert!(
        text.contains(
            "structured kernel: conv2d %4 with depthwise conv2d %2 computed tile by tile"
        ),
        "{text}"
    );
    let o = kfuse(&["explain", &example("separable_block.kf"), "--json"]);
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["kernels"].as_array().unwrap().len(), 1, "{doc}");
    assert_eq!(doc["kernels"][0]["kind"], "structured");
    let passes: Vec<&str> = doc["passes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pass"].as_str().unwrap())
        .collect();
    assert_eq!(passes, ["constant-fold", "fold-affine", "dead-code"]);
}

/// ResNet's stem (convolution, bias, ReLU, max pool) is one structured kernel that pools the
/// convolution's rows in cache; on AVX-512 its routine pools them from the kernel's stage.
#[test]
fn explain_shows_the_resnet_stem_pooled_in_one_kernel() {
    let o = kfuse(&[
        "explain",
        &example("resnet_stem.kf"),
        "--cost-model",
        "fixed",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("1 kernel(s) (unfused: 4)"), "{text}");
    assert!(
        text.contains(
            "max pool2d %6 (3×3 window, stride 2×2) applied to the convolution's rows band by band in cache"
        ),
        "{text}"
    );
    let routine = if kfuse_testkit::has_avx512() {
        "each band's rows pooled from the kernel's stage in cache"
    } else {
        skip(
            "explain_shows_the_resnet_stem_pooled_in_one_kernel (its AVX-512 routine)",
            Prerequisite::Avx512,
            "this CPU lacks AVX-512: the stem's routine runs the convolution, then the pooling",
        );
        "then the pooling over its stored output"
    };
    assert!(text.contains(routine), "{text}");
}

#[test]
fn explain_shows_a_mobilenet_v2_block_as_one_kernel() {
    let o = kfuse(&[
        "explain",
        &example("mobilenet_v2_block.kf"),
        "--cost-model",
        "fixed",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(text.matches("pass fold-affine:").count(), 2, "{text}");
    assert!(text.contains("1 kernel(s) (unfused: 6)"), "{text}");
    assert!(
        text.contains(
            "its per-channel bias add %6 + clamp to [0, 6] %7 applied to each tile in cache"
        ),
        "{text}"
    );
    assert!(
        text.contains("epilogue per-channel bias add %11 + residual add %12"),
        "{text}"
    );
}

/// `explain` names the routine each convolution runs on in fast numerics: Winograd for a 3×3
/// stride-1 convolution of 16+ channels and wide rows, a direct kernel broadcasting output positions for
/// a strided 3×3 one, the microkernel over every other pixel for a strided 1×1 one (ResNet's
/// down-sampling block, whose add joins the first convolution as its epilogue).
#[test]
fn explain_names_each_convolutions_routine() {
    // Without AVX-512 every convolution takes the portable im2col route, whose name says
    // nothing about the choice between routines.
    if !kfuse_testkit::has_avx512() {
        skip(
            "explain_names_each_convolutions_routine",
            Prerequisite::Avx512,
            "Winograd and the direct microkernels need AVX-512, which this CPU lacks",
        );
        return;
    }
    let dir = scratch("routines");
    let program = dir.join("block.kf");
    std::fs::write(
        &program,
        "%x = input() name=\"x\" : f32[8, 64, 56, 56]\n\
         %w = input() name=\"w\" : f32[64, 64, 3, 3]\n\
         %c = conv2d(%x, %w) layout=nchw stride=[1, 1] padding=[1, 1, 1, 1] dilation=[1, 1] groups=1\n\
         %y = relu(%c)\n\
         %w2 = input() name=\"w2\" : f32[128, 64, 3, 3]\n\
         %d = conv2d(%y, %w2) layout=nchw stride=[2, 2] padding=[1, 1, 1, 1] dilation=[1, 1] groups=1\n\
         %w3 = input() name=\"w3\" : f32[128, 64, 1, 1]\n\
         %e = conv2d(%y, %w3) layout=nchw stride=[2, 2] padding=[0, 0, 0, 0] dilation=[1, 1] groups=1\n\
         %f = add(%d, %e)\n\
         output \"f\" = %f\n",
    )
    .unwrap();
    let o = kfuse(&[
        "explain",
        &program.display().to_string(),
        "--cost-model",
        "fixed",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    let routines: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("routine (fast numerics): "))
        .collect();
    assert_eq!(routines.len(), 3, "{text}");
    assert!(routines[0].starts_with("Winograd F(2×2, 3×3)"), "{text}");
    assert!(
        routines
            .iter()
            .any(|r| r.contains("broadcasting output positions")),
        "{text}"
    );
    assert!(
        routines
            .iter()
            .any(|r| r.contains("1×1 convolution, on a copy of every 2×2 pixel")),
        "{text}"
    );
    assert!(text.contains("with epilogue residual add %8"), "{text}");
    let o = kfuse(&["explain", &program.display().to_string(), "--json"]);
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let named = doc["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["routine"].is_string())
        .count();
    assert_eq!(named, 3, "{doc}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Ten steps of a 3-D Jacobi fused into one kernel took more than 23 GB to lower: each step
/// reads the one before at six shifted indices. `explain` shows the steps stored, and why.
#[test]
fn explain_stores_the_steps_of_a_stencil_and_says_why() {
    for (policy, kernels, reason) in [
        (
            "cost",
            10,
            "read at 6 indices, evaluated 6 times per element: recomputing it costs",
        ),
        (
            "greedy",
            5,
            "would pass the limit of 512 instructions evaluating it at each of the 36 indices",
        ),
    ] {
        let o = kfuse(&[
            "explain",
            &example("jacobi3d.kf"),
            "--cost-model",
            "fixed",
            "--fuse",
            policy,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.contains(&format!("policy {policy}; {kernels} kernel(s)")),
            "{text}"
        );
        assert!(text.contains(reason), "{text}");
    }
}

#[test]
fn explain_shows_kernels_bytes_and_boundaries() {
    let o = kfuse(&["explain", &example("layernorm.kf")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.starts_with("cost model: "), "{text}");
    assert!(
        text.contains("policy cost; 1 kernel(s) (unfused: 9)"),
        "{text}"
    );
    assert!(
        text.contains("fused row kernel over [8192, 1024], reducing axes [1]"),
        "{text}"
    );
    assert!(text.contains("%12 (add): graph output"), "{text}");
    // How the generated C runs each pass over a row: here all three as 16-lane vector bodies.
    assert!(
        text.contains("code: 16-lane vector bodies in every pass (3)"),
        "{text}"
    );

    // A reflect pad gathers: its pass keeps the scalar loop, and explain says which
    // instruction and why.
    let dir = scratch("explain-code");
    let program = dir.join("pad.kf");
    std::fs::write(
        &program,
        "%x = input() name=\"x\" : f32[64, 64]\n%p = pad(%x) low=[0, 1] high=[0, 1] mode=reflect\n%y = tanh(%p)\noutput \"y\" = %y\n",
    )
    .unwrap();
    let o = kfuse(&["explain", program.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("code: 16-lane vector bodies in 0 of 1 passes; pass 1 scalar: kernel IR %"),
        "{text}"
    );
    assert!(text.contains("compares indices"), "{text}");
    assert!(!text.contains("tiles of"), "{text}");

    // A transpose reads its operand across rows: the loops run in tiles, and explain says so.
    let program = dir.join("transpose.kf");
    std::fs::write(
        &program,
        "%x = input() name=\"x\" : f32[1024, 1024]\n%t = permute(%x) perm=[1, 0]\n%y = add(%t, %x)\noutput \"y\" = %y\n",
    )
    .unwrap();
    let o = kfuse(&["explain", program.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("; loops in tiles of 16 rows x 32 columns (an operand is read across rows)"),
        "{text}"
    );
    let o = kfuse(&["explain", program.to_str().unwrap(), "--json"]);
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["kernels"][0]["tiles"], serde_json::json!([16, 32]));
    std::fs::remove_dir_all(&dir).unwrap();

    let o = kfuse(&["explain", &example("two_outputs.kf"), "--json"]);
    let doc: serde_json::Value =
        serde_json::from_slice(&o.stdout).expect("explain --json prints JSON");
    let kernels = doc["kernels"].as_array().unwrap();
    assert_eq!(kernels.len(), 1);
    assert_eq!(
        kernels[0]["ops"],
        serde_json::json!(["mul %2", "add %5", "sub %6"])
    );
    assert_eq!(kernels[0]["bytes_read"], (2 * 64) << 20);
    assert_eq!(kernels[0]["bytes_written"], (2 * 64) << 20);
    assert_eq!(doc["unfused_kernels"], 3);
    assert_eq!(
        kernels[0]["passes"],
        serde_json::json!([{"vector": true, "blocks": 2}])
    );

    // A long transcendental chain runs eight blocks of 16 per iteration, and explain says so
    // (layer norm above runs the default two in each pass, which goes unsaid).
    let o = kfuse(&["explain", &example("softplus.kf")]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("; pass 1 runs 8 blocks of 16 per iteration"),
        "{text}"
    );
    let o = kfuse(&["explain", &example("softplus.kf"), "--json"]);
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        doc["kernels"][0]["passes"],
        serde_json::json!([{"vector": true, "blocks": 8}])
    );

    let greedy = kfuse(&[
        "explain",
        &example("expensive_broadcast.kf"),
        "--fuse",
        "greedy",
        "--json",
    ]);
    let cost = kfuse(&["explain", &example("expensive_broadcast.kf"), "--json"]);
    let count = |o: &Output| {
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["kernels"]
            .as_array()
            .unwrap()
            .len()
    };
    assert_eq!((count(&greedy), count(&cost)), (1, 2));

    let dir = scratch("dump");
    let o = kfuse(&[
        "explain",
        &example("softmax.kf"),
        "--dump",
        dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    for file in ["0-input.kf", "1-partition.txt", "2-k0.kir", "3-k0.c"] {
        assert!(dir.join(file).exists(), "{file} missing");
    }
    assert!(std::fs::read_to_string(dir.join("3-k0.c"))
        .unwrap()
        .contains("void kfuse_kernel("));
    // The vectorization report, where the C compiler gives one (GCC): softmax's row loops are
    // vectorized.
    match std::fs::read_to_string(dir.join("3-k0.vec.txt")) {
        Ok(report) => assert!(report.contains("loop vectorized"), "{report}"),
        Err(_) => skip(
            "explain_shows_kernels_bytes_and_boundaries (its vectorization report)",
            Prerequisite::Optional,
            "no 3-k0.vec.txt: the C compiler gives no -fopt-info-vec report (not GCC)",
        ),
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn run_says_which_tier_ran() {
    let case = programs().join("integers");
    let dir = scratch("tiers");
    let a = format!("a={}", case.join("a.npy").display());
    let b = format!("b={}", case.join("b.npy").display());
    let prog = case.join("program.kf");
    let o = kfuse(&[
        "run",
        prog.to_str().unwrap(),
        "--input",
        &a,
        "--input",
        &b,
        "--no-cc",
        "--output-dir",
        dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("0 as compiled C (0 from the cache), 1 on the tile interpreter"),
        "{}",
        stderr(&o)
    );
    assert!(
        stderr(&o).contains("runs on the tile interpreter: the tile interpreter was requested"),
        "{}",
        stderr(&o)
    );
    let o = kfuse(&[
        "run",
        prog.to_str().unwrap(),
        "--input",
        &a,
        "--input",
        &b,
        "--engine",
        "reference",
        "--output-dir",
        dir.to_str().unwrap(),
    ]);
    assert!(
        stderr(&o).contains("engine: reference interpreter"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn profile_writes_a_chrome_trace() {
    let case = programs().join("mlp");
    let dir = scratch("profile");
    let trace = dir.join("trace.json");
    let mut args: Vec<String> = vec!["run".into(), case.join("program.kf").display().to_string()];
    for input in ["x", "w", "b"] {
        args.push("--input".into());
        args.push(format!(
            "{input}={}",
            case.join(format!("{input}.npy")).display()
        ));
    }
    args.extend([
        "--output-dir".into(),
        dir.display().to_string(),
        "--profile".into(),
        trace.display().to_string(),
    ]);
    let o = kfuse(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    // The matmul absorbs its bias add and GELU; the softmax is one fused kernel after it.
    assert_eq!(events.len(), 2, "{doc}");
    assert_eq!(events[0]["name"], "%3 matmul+add+gelu_tanh");
    assert!(events
        .iter()
        .all(|e| e["ph"] == "X" && e["dur"].as_f64().unwrap() >= 0.0));
    assert!(
        stderr(&o).contains("k1") && stderr(&o).contains("B written"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--constants` binds a model's weights as constants of the program: the outputs equal
/// those of the same arrays bound as inputs (bit for bit in strict numerics, where no graph
/// pass refolds them), `--runs` repeats the run and reports its times, and a weight given
/// twice or a constant with no input of its name is a clear error.
#[test]
fn weights_can_be_constants_and_runs_repeated() {
    let case = programs().join("mlp");
    let dir = scratch("constants");
    let load = |name: &str| kfuse_npy::load_npy(&case.join(format!("{name}.npy"))).unwrap();
    kfuse_npy::save_npz(&dir.join("x.npz"), &[("x".into(), load("x"))]).unwrap();
    kfuse_npy::save_npz(
        &dir.join("weights.npz"),
        &[("w".into(), load("w")), ("b".into(), load("b"))],
    )
    .unwrap();
    kfuse_npy::save_npz(
        &dir.join("all.npz"),
        &[
            ("x".into(), load("x")),
            ("w".into(), load("w")),
            ("b".into(), load("b")),
        ],
    )
    .unwrap();
    let program = case.join("program.kf");
    let path = |name: &str| dir.join(name).display().to_string();
    for numerics in ["strict", "fast"] {
        let as_inputs = kfuse(&[
            "run",
            program.to_str().unwrap(),
            "--inputs-npz",
            &path("all.npz"),
            "--numerics",
            numerics,
            "--output-dir",
            &path("inputs"),
        ]);
        assert!(as_inputs.status.success(), "{}", stderr(&as_inputs));
        let as_constants = kfuse(&[
            "run",
            program.to_str().unwrap(),
            "--inputs-npz",
            &path("x.npz"),
            "--constants",
            &path("weights.npz"),
            "--runs",
            "3",
            "--numerics",
            numerics,
            "--output-dir",
            &path("constants"),
        ]);
        let err = stderr(&as_constants);
        assert!(as_constants.status.success(), "{err}");
        assert!(err.contains("3 runs: median"), "{err}");
        for out in std::fs::read_dir(dir.join("inputs")).unwrap() {
            let name = out.unwrap().file_name();
            let want = kfuse_npy::load_npy(&dir.join("inputs").join(&name)).unwrap();
            let got = kfuse_npy::load_npy(&dir.join("constants").join(&name)).unwrap();
            if numerics == "strict" {
                assert_eq!(got, want, "{name:?}");
            } else {
                assert_close("constants", &name.to_string_lossy(), &got, &want);
            }
        }
    }
    kfuse_npy::save_npz(&dir.join("stray.npz"), &[("v".into(), load("b"))]).unwrap();
    let cases = [
        (
            ["--inputs-npz", "all.npz", "--constants", "weights.npz"],
            "`w` is given both as a constant (--constants) and as an input",
        ),
        (
            ["--constants", "all.npz", "--constants", "x.npz"],
            "`x` is given twice in --constants",
        ),
        (
            ["--inputs-npz", "all.npz", "--constants", "stray.npz"],
            "the program has no input named `v`",
        ),
    ];
    for ([flag1, file1, flag2, file2], needle) in cases {
        let (file1, file2, out) = (path(file1), path(file2), path("out"));
        let args = [
            "run",
            program.to_str().unwrap(),
            flag1,
            &file1,
            flag2,
            &file2,
            "--output-dir",
            &out,
        ];
        fails_with(&args, needle);
    }
    fails_with(
        &[
            "run",
            program.to_str().unwrap(),
            "--inputs-npz",
            &path("x.npz"),
            "--constants",
            &path("missing.npz"),
            "--output-dir",
            &path("out"),
        ],
        "cannot read",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `kfuse bench --quick --json` runs every workload at small sizes and reports each: W0's
/// bandwidth rows and peak FMA, W1-W4 fused against unfused (the bench itself fails when the
/// fused result leaves the workload's tolerance), W5-W7 (each checked against the reference
/// interpreter likewise) and the cost-model case. Only the
/// report's shape and sanity are checked here, never a timing.
#[test]
fn bench_quick_reports_every_workload() {
    let out = kfuse(&["bench", "--quick", "--json"]);
    assert!(out.status.success(), "bench failed: {}", stderr(&out));
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("bench --json prints JSON");
    let w0 = report["w0"].as_array().expect("w0 rows");
    // copy, scale, add, triad; ordinary and (with AVX-512) streaming stores; 1 and 2 threads.
    assert!(w0.len() >= 8, "{w0:?}");
    for row in w0 {
        let gb = row["gb_per_s"].as_f64().unwrap();
        assert!(gb.is_finite() && gb > 0.0, "{row}");
    }
    let fma = &report["w0_fma"];
    match fma["rows"].as_array() {
        Some(rows) => {
            assert!(!rows.is_empty());
            for row in rows {
                let g = row["gflop_per_s"].as_f64().unwrap();
                assert!(g.is_finite() && g > 0.0, "{row}");
            }
        }
        None => skip(
            "bench_quick_reports_every_workload (W0's peak FMA)",
            Prerequisite::Avx512,
            &format!("not measured on this CPU: {}", fma["skipped"]),
        ),
    }
    let ids: Vec<&str> = report["workloads"]
        .as_array()
        .expect("workload rows")
        .iter()
        .map(|w| w["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["W1", "W2a", "W2b", "W3", "W4a", "W4b"]);
    for id in ["W5a", "W5b"] {
        assert!(
            report["gemm_epilogues"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["id"] == id && r["ratio"].as_f64().unwrap() > 0.0),
            "{id} missing"
        );
    }
    // W5-W7's rooflines: the limits measured in the run, a floor for each workload, and
    // W6a's fused floor no higher than its unfused one.
    let structured = |id: &str| {
        let rows = [&report["gemm_epilogues"], &report["convolutions"]];
        rows.iter()
            .flat_map(|r| r.as_array().unwrap().iter())
            .find(|r| r["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("{id} missing"))
    };
    // Every structured workload's result was checked against the reference interpreter, and
    // its error is reported.
    for id in ["W5a", "W5b", "W6a", "W6b", "W7"] {
        let row = structured(id);
        let error = row["max_rel_error"]
            .as_f64()
            .expect("an error against the reference");
        assert!((0.0..=1e-3).contains(&error), "{row}");
    }
    if fma["rows"].is_array() {
        let roof = &report["roof"];
        for limit in ["gflop_per_s", "gb_per_s"] {
            let v = roof[limit].as_f64().unwrap_or(0.0);
            assert!(v.is_finite() && v > 0.0, "{roof}");
        }
        for id in ["W5a", "W5b", "W6a", "W6b", "W7"] {
            let row = structured(id);
            let floor = row["floor_ms"].as_f64().expect("a floor");
            assert!(floor > 0.0 && floor.is_finite(), "{row}");
        }
        let w6a = structured("W6a");
        let (fused, unfused) = (
            w6a["floor_ms"].as_f64().unwrap(),
            w6a["unfused_floor_ms"].as_f64().unwrap(),
        );
        // Never above the unfused floor (equal where both are bound by arithmetic alone, as a
        // debug build's slow peak makes them).
        assert!(fused <= unfused * (1.0 + 1e-9), "{w6a}");
    }
    for id in [
        "W6a",
        "W6b",
        "W7",
        "mobilenet",
        "inverted",
        "inverted7",
        "mbconv",
        "mbv3",
        "resnet",
        "resnet7",
        "resnet18",
        "resnet50",
        "resnet18-nhwc",
    ] {
        assert!(
            report["convolutions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["id"] == id),
            "{id} missing"
        );
    }
    // The whole of ResNet-18 and ResNet-50 in fast numerics against the reference interpreter.
    for id in ["resnet18", "resnet50", "resnet18-nhwc"] {
        let network = report["convolutions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .unwrap();
        let error = network["max_rel_error"].as_f64().unwrap();
        assert!(error < 1e-4, "{id}'s logits off by {error}");
    }
    let nhwc = report["convolutions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "resnet18-nhwc")
        .unwrap();
    assert_eq!(nhwc["run_in_nchw"], true, "{nhwc}");
    assert_eq!(report["cost_model_case"].as_array().unwrap().len(), 2);
    // The bias alone, then ReLU, sigmoid, tanh, both forms of GELU and ReLU6.
    assert_eq!(report["activations"].as_array().unwrap().len(), 7);
    assert!(report["transpose"]["transpose_ms"].as_f64().unwrap() > 0.0);
    // The bf16-stored layer at K = 1024, 64 and 16, each with its three baselines.
    let cast = report["cast"].as_array().expect("cast rows");
    assert_eq!(cast.len(), 3);
    for row in cast {
        for key in ["ms", "f32_output_ms", "with_cast_kernel_ms", "unfused_ms"] {
            assert!(row[key].as_f64().unwrap() > 0.0, "{key}: {row}");
        }
    }
}

/// The first clang on `PATH`, if any.
fn clang() -> Option<String> {
    [
        "clang", "clang-19", "clang-18", "clang-17", "clang-16", "clang-15", "clang-14",
    ]
    .iter()
    .find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
    .map(|c| c.to_string())
}

/// Kernels compile with clang too (`CC`), through the same `kfuse_math.h` (GCC builtins or
/// clang intrinsics), and strict results equal the reference interpreter's bit for bit:
/// transcendentals in 16-lane bodies, relu, a row reduction, a fused transpose in tiles.
/// Skipped, saying so, where no clang is installed.
#[test]
fn kernels_compile_with_clang_and_stay_bit_exact() {
    let Some(cc) = clang() else {
        skip(
            "kernels_compile_with_clang_and_stay_bit_exact",
            Prerequisite::Optional,
            "no clang on PATH",
        );
        return;
    };
    let dir = scratch("clang");
    let program = dir.join("p.kf");
    std::fs::write(
        &program,
        "%x = input() name=\"x\" : f32[40, 70]\n%y = input() name=\"y\" : f32[70, 40]\n\
         %e = exp(%x)\n%l = log1p(%e)\n%t = tanh(%l)\n%r = relu(%t)\n\
         %m = reduce_max(%r) axes=[1] keepdims=true\n%d = sub(%r, %m)\n\
         %p = permute(%y) perm=[1, 0]\n%z = add(%d, %p)\noutput \"z\" = %z\n",
    )
    .unwrap();
    let values = |n: usize, seed: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104_729) % 2003) as f32 / 100.0 - 10.0)
            .collect()
    };
    let x = Array::from_vec(vec![40, 70], values(2800, 1)).unwrap();
    let y = Array::from_vec(vec![70, 40], values(2800, 2)).unwrap();
    kfuse_npy::save_npz(&dir.join("in.npz"), &[("x".into(), x), ("y".into(), y)]).unwrap();
    let run = |engine: &str, out: &str| {
        Command::new(env!("CARGO_BIN_EXE_kfuse"))
            .env("CC", &cc)
            .env("XDG_CACHE_HOME", dir.join("cache"))
            .args([
                "run",
                program.to_str().unwrap(),
                "--inputs-npz",
                dir.join("in.npz").to_str().unwrap(),
                "--engine",
                engine,
                "--numerics",
                "strict",
                "--output-dir",
                dir.join(out).to_str().unwrap(),
            ])
            .output()
            .unwrap()
    };
    let compiled = run("compiled", "compiled");
    assert!(compiled.status.success(), "{}", stderr(&compiled));
    assert!(
        stderr(&compiled).contains("0 on the tile interpreter"),
        "{cc}: {}",
        stderr(&compiled)
    );
    let reference = run("reference", "reference");
    assert!(reference.status.success(), "{}", stderr(&reference));
    let got = kfuse_npy::load_npy(&dir.join("compiled/z.npy")).unwrap();
    let want = kfuse_npy::load_npy(&dir.join("reference/z.npy")).unwrap();
    assert_eq!(
        kfuse_testkit::strict_difference(&got, &want),
        None,
        "z with {cc}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
