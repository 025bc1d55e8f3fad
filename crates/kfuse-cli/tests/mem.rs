//! `kfuse mem` end to end: status in every format, `run`, the audit and the governor's domain
//! admission with real processes of two users, the demo, and bad input. Tests that change KSM
//! settings need root and take the machine-wide KSM lock; without root they say so and skip.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use kfuse_mem::ksm::{Knob, KnobGuard, Ksm};
use kfuse_mem::process::Procfs;
use kfuse_mem::sys;
use kfuse_testkit::{skip, Prerequisite};

const NOBODY: u32 = 65534;

fn kfuse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kfuse"))
        .args(args)
        .output()
        .expect("kfuse runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Serializes this binary's tests that change KSM settings; the machine-wide KSM lock
/// serializes them with other programs.
static KSM_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A test's turn at the system's KSM: this binary's other KSM tests wait, and the machine-wide
/// lock is held except while a governor the test starts holds it.
struct Turn {
    ksm: Ksm,
    lock: Option<sys::FileLock>,
    _tests: std::sync::MutexGuard<'static, ()>,
}

impl Turn {
    /// Runs `start`, which starts a governor, with the machine-wide lock released for the
    /// governor to take; if another program took it first (the governor says who holds it),
    /// waits for that program and tries again. The lock stays released until
    /// [`Turn::relock`], since a governor that is still running holds it.
    fn with_lock_released<T>(&mut self, mut start: impl FnMut() -> (T, String)) -> T {
        for _ in 0..20 {
            self.lock = None;
            let (result, stderr) = start();
            if !stderr.contains("holds the KSM lock") {
                return result;
            }
            self.relock();
        }
        panic!("the KSM lock stayed with other programs");
    }

    /// Takes the machine-wide lock back, once the governors the test started have exited.
    fn relock(&mut self) {
        if self.lock.is_none() {
            self.lock = Some(self.ksm.lock().unwrap());
        }
    }
}

fn root_and_ksm(test: &str) -> Option<Turn> {
    let ksm = Ksm::system();
    if !ksm.available() {
        skip(test, Prerequisite::Ksm, "this kernel has no KSM");
        return None;
    }
    if !sys::is_root() {
        skip(
            test,
            Prerequisite::Root,
            "needs root (changes KSM settings, runs processes as another user)",
        );
        return None;
    }
    let tests = KSM_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let lock = ksm.lock().unwrap();
    Some(Turn {
        ksm,
        lock: Some(lock),
        _tests: tests,
    })
}

/// A `kfuse mem hold` process; it exits when dropped (its stdin closes).
struct Holder {
    child: Child,
}

impl Holder {
    fn start(args: &[&str], uid: Option<u32>) -> Holder {
        use std::os::unix::process::CommandExt;
        let mut command = Command::new(env!("CARGO_BIN_EXE_kfuse"));
        command
            .args(["mem", "hold"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if let Some(uid) = uid {
            command.uid(uid).gid(uid);
        }
        let mut child = command.spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("ready"), "holder did not start: {line:?}");
        Holder { child }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn ksm_bytes(&self) -> u64 {
        Procfs::system()
            .smaps_ksm(self.pid())
            .unwrap()
            .map_or(0, |s| s.ksm_bytes)
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

#[test]
fn status_reports_in_text_json_and_prometheus() {
    if !Ksm::system().available() {
        skip(
            "status_reports_in_text_json_and_prometheus",
            Prerequisite::Ksm,
            "no KSM in this kernel",
        );
        return;
    }
    // The report's knobs are compared with the system's below: hold the lock the tests that
    // change them take, so that none changes one in between.
    let _lock = Ksm::system().lock().ok();
    let text = kfuse(&["mem", "status", "--window", "0.1"]);
    assert!(text.status.success(), "{}", stderr(&text));
    assert!(stdout(&text).contains("saved") && stdout(&text).contains("profit"));
    let json = kfuse(&["mem", "status", "--json", "--window", "0.1"]);
    assert!(json.status.success(), "{}", stderr(&json));
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    for key in [
        "kernel",
        "knobs",
        "counters",
        "savings",
        "rates",
        "processes",
    ] {
        assert!(value.get(key).is_some(), "no `{key}` in {value}");
    }
    let knobs = value["knobs"].as_object().unwrap();
    assert_eq!(
        knobs["pages_to_scan"].as_u64(),
        Ksm::system().get(Knob::PagesToScan).unwrap()
    );
    let sharing = value["counters"]["pages_sharing"].as_u64().unwrap();
    let page = sys::page_size() as u64;
    let zero = value["counters"]["ksm_zero_pages"].as_u64().unwrap_or(0);
    assert_eq!(
        value["savings"]["saved_bytes"].as_u64().unwrap(),
        (sharing + zero) * page
    );
    let prom = kfuse(&["mem", "status", "--prometheus", "--window", "0"]);
    let prom = stdout(&prom);
    assert!(prom.contains("# TYPE kfuse_ksm_pages_sharing gauge"));
    assert!(prom.contains("kfuse_ksm_knob{knob=\"run\"}"));
    // Every sample line belongs to a family declared before it.
    let mut declared = std::collections::HashSet::new();
    for line in prom.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            declared.insert(rest.split_whitespace().next().unwrap().to_string());
        } else if !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(declared.contains(name), "undeclared sample {line}");
        }
    }
}

#[test]
fn top_refreshes_the_given_number_of_times() {
    if !Ksm::system().available() {
        skip(
            "top_refreshes_the_given_number_of_times",
            Prerequisite::Ksm,
            "no KSM in this kernel",
        );
        return;
    }
    let out = kfuse(&["mem", "top", "--interval", "0.05", "--iterations", "3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).matches("kfuse mem top").count(), 3);
    assert!(
        !stdout(&out).contains('\x1b'),
        "no screen clearing when not on a terminal"
    );
}

#[test]
fn mem_run_starts_a_program_with_merging_on() {
    if !std::path::Path::new("/proc/self/ksm_stat").exists() {
        skip(
            "mem_run_starts_a_program_with_merging_on",
            Prerequisite::Optional,
            "no /proc/<pid>/ksm_stat (Linux 6.1)",
        );
        return;
    }
    let out = kfuse(&["mem", "run", "--", "cat", "/proc/self/ksm_stat"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("ksm_merge_any: yes"),
        "{}",
        stdout(&out)
    );
    let plain = Command::new("cat")
        .arg("/proc/self/ksm_stat")
        .output()
        .unwrap();
    assert!(stdout(&plain).contains("ksm_merge_any: no"));
    let missing = kfuse(&["mem", "run", "--", "/nonexistent/program"]);
    assert!(!missing.status.success());
    assert!(stderr(&missing).contains("cannot start `/nonexistent/program`"));
}

/// Runs ksmd fast until every holder's weights map KSM pages.
fn merge_all(ksm: &Ksm, holders: &[&Holder], bytes_each: u64) -> KnobGuard {
    let mut guard = KnobGuard::new(ksm);
    guard.set(Knob::PagesToScan, 5_000).unwrap();
    guard.set(Knob::SleepMillisecs, 10).unwrap();
    guard.set(Knob::Run, 1).unwrap();
    let start = Instant::now();
    while holders
        .iter()
        .any(|h| h.ksm_bytes() < bytes_each * 95 / 100)
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "ksmd did not merge in 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Stop scanning so the pages stay as they are while audited.
    guard.set(Knob::Run, 0).unwrap();
    guard
}

#[test]
fn the_audit_flags_pages_shared_across_users_and_nothing_else() {
    let Some(turn) = root_and_ksm("the_audit_flags_pages_shared_across_users_and_nothing_else")
    else {
        return;
    };
    let ksm = &turn.ksm;
    let before = ksm.settings().unwrap();
    let mib = 2u64;
    // Seed 5 is held by root and by nobody; seed 6 by two root processes.
    let root_a = Holder::start(&["--mib", "2", "--seed", "5", "--merge"], None);
    let nobody = Holder::start(&["--mib", "2", "--seed", "5", "--merge"], Some(NOBODY));
    let root_b = Holder::start(&["--mib", "2", "--seed", "6", "--merge"], None);
    let root_c = Holder::start(&["--mib", "2", "--seed", "6", "--merge"], None);
    let mut guard = merge_all(ksm, &[&root_a, &nobody, &root_b, &root_c], mib << 20);
    let out = kfuse(&["mem", "audit", "--json", "--threshold", "64"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let groups = report["cross_domain"].as_array().unwrap();
    let pages = (mib << 20) / sys::page_size() as u64;
    let ours: Vec<&serde_json::Value> = groups
        .iter()
        .filter(|g| {
            g["processes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["pid"] == root_a.pid() || p["pid"] == nobody.pid())
        })
        .collect();
    assert_eq!(ours.len(), 1, "{report}");
    let group = ours[0];
    assert_eq!(
        group["domains"],
        serde_json::json!(["uid:0", format!("uid:{NOBODY}")])
    );
    assert!(
        group["pages"].as_u64().unwrap() >= pages * 9 / 10,
        "{group}"
    );
    assert_eq!(group["anomaly"], true);
    for g in groups {
        for p in g["processes"].as_array().unwrap() {
            assert!(
                p["pid"] != root_b.pid() && p["pid"] != root_c.pid(),
                "same-domain sharing was reported: {g}"
            );
        }
    }
    assert!(report["same_domain_pages"].as_u64().unwrap() >= pages * 9 / 10);
    let alarm = kfuse(&["mem", "audit", "--threshold", "64", "--fail-on-anomaly"]);
    assert_eq!(alarm.status.code(), Some(3), "{}", stdout(&alarm));
    assert!(stdout(&alarm).contains("ANOMALY"));
    drop((root_a, nobody, root_b, root_c));
    guard.restore().unwrap();
    assert_eq!(ksm.settings().unwrap(), before);
}

#[test]
fn the_governor_stops_merging_for_an_outsider_and_names_it() {
    let Some(mut turn) = root_and_ksm("the_governor_stops_merging_for_an_outsider_and_names_it")
    else {
        return;
    };
    let before = turn.ksm.settings().unwrap();
    let insider = Holder::start(&["--mib", "1", "--seed", "7", "--merge"], None);
    let mut governed = |extra: &[&str]| {
        let mut args = vec![
            "mem",
            "govern",
            "--admit",
            "uid:0",
            "--json",
            "--interval",
            "0.2",
            "--duration",
            "0.5",
        ];
        args.extend_from_slice(extra);
        let out = turn.with_lock_released(|| {
            let out = kfuse(&args);
            let err = stderr(&out);
            (out, err)
        });
        turn.relock();
        assert!(out.status.success(), "{}", stderr(&out));
        let ticks: Vec<serde_json::Value> = stdout(&out)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(stderr(&out).contains("restored"));
        ticks
    };
    let ticks = governed(&[]);
    assert_eq!(ticks[0]["running"], true, "{ticks:?}");
    assert!(ticks[0]["events"][0]
        .as_str()
        .unwrap()
        .starts_with("merging on"));
    let outsider = Holder::start(&["--mib", "1", "--seed", "7", "--merge"], Some(NOBODY));
    let ticks = governed(&[]);
    let events: Vec<String> = ticks
        .iter()
        .flat_map(|t| t["events"].as_array().unwrap().iter())
        .map(|e| e.as_str().unwrap().to_string())
        .collect();
    assert!(ticks.iter().all(|t| t["running"] == false), "{ticks:?}");
    let named = format!("process {} (kfuse) of uid:{NOBODY}", outsider.pid());
    assert!(events.iter().any(|e| e.contains(&named)), "{events:?}");
    assert!(!events
        .iter()
        .any(|e| e.contains(&format!("process {} ", insider.pid()))));
    drop((insider, outsider));
    assert_eq!(
        turn.ksm.settings().unwrap(),
        before,
        "the governor restored every knob"
    );
}

/// `kfuse mem govern | head -1`: when the reader goes, the governor stops as on SIGINT, puts
/// back every knob it changed and exits quietly, long before its `--duration`.
#[test]
fn the_governor_restores_its_knobs_when_its_reader_goes() {
    let Some(mut turn) = root_and_ksm("the_governor_restores_its_knobs_when_its_reader_goes")
    else {
        return;
    };
    let before = turn.ksm.settings().unwrap();
    // Mergeable memory, so that the governor turns merging on and has a knob to put back.
    let holder = Holder::start(&["--mib", "1", "--seed", "9", "--merge"], None);
    let (child, first) = turn.with_lock_released(|| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kfuse"))
            .args(["mem", "govern", "--json", "--interval", "0.05"])
            .args(["--duration", "60"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        if !first.is_empty() {
            return ((Some(child), first), String::new());
        }
        // Refused: nothing on standard output, the reason on standard error.
        let out = child.wait_with_output().unwrap();
        ((None, first), stderr(&out))
    });
    let child = child.expect("the governor started");
    let tick: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(tick["running"], true, "{first}");
    let closed = Instant::now();
    let out = child.wait_with_output().unwrap();
    turn.relock();
    assert!(
        closed.elapsed() < Duration::from_secs(20),
        "the governor ran on for {:?} after its reader went",
        closed.elapsed()
    );
    let err = stderr(&out);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("restored"), "{err}");
    drop(holder);
    assert_eq!(turn.ksm.settings().unwrap(), before, "every knob is back");
}

/// While a program holds the machine-wide KSM lock (here this test), a governor is refused and
/// told who holds it.
#[test]
fn a_governor_is_refused_while_another_holds_the_ksm_lock() {
    let Some(_turn) = root_and_ksm("a_governor_is_refused_while_another_holds_the_ksm_lock") else {
        return;
    };
    let out = kfuse(&["mem", "govern", "--duration", "0.1", "--interval", "0.05"]);
    assert!(!out.status.success());
    let holder = format!("pid {} ", std::process::id());
    assert!(
        stderr(&out).contains(&holder) && stderr(&out).contains("holds the KSM lock"),
        "{}",
        stderr(&out)
    );
}

/// Starts `kfuse mem govern --json` with the machine-wide lock released for it and returns it
/// once it has printed its first tick, which has turned merging on.
fn start_governor(turn: &mut Turn) -> Child {
    let child = turn.with_lock_released(|| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kfuse"))
            .args(["mem", "govern", "--json", "--interval", "0.05"])
            .args(["--duration", "60"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut first)
            .unwrap();
        if first.is_empty() {
            let out = child.wait_with_output().unwrap();
            return (None, stderr(&out));
        }
        let tick: serde_json::Value = serde_json::from_str(&first).unwrap();
        assert_eq!(tick["running"], true, "{first}");
        (Some(child), String::new())
    });
    child.expect("the governor started")
}

fn signal(child: &Child, signal: i32) {
    // SAFETY: kill only sends a signal to a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
}

/// SIGHUP (a closed terminal) and SIGQUIT stop the governor as SIGTERM does: it puts back every
/// knob it changed before it exits.
#[test]
fn the_governor_restores_its_knobs_on_hangup_and_quit() {
    let Some(mut turn) = root_and_ksm("the_governor_restores_its_knobs_on_hangup_and_quit") else {
        return;
    };
    let original_run = turn.ksm.get(Knob::Run).unwrap();
    // The governor turns merging on where it is off, which gives it a knob to put back.
    turn.ksm.set(Knob::Run, 0).unwrap();
    let before = turn.ksm.settings().unwrap();
    let holder = Holder::start(&["--mib", "1", "--seed", "10", "--merge"], None);
    for sig in [libc::SIGHUP, libc::SIGQUIT] {
        let child = start_governor(&mut turn);
        signal(&child, sig);
        let out = child.wait_with_output().unwrap();
        turn.relock();
        let err = stderr(&out);
        assert!(out.status.success(), "signal {sig}: {:?} {err}", out.status);
        assert!(err.contains("restored"), "signal {sig}: {err}");
        assert_eq!(turn.ksm.settings().unwrap(), before, "signal {sig}");
    }
    drop(holder);
    turn.ksm.set(Knob::Run, original_run.unwrap_or(0)).unwrap();
}

/// A governor killed by SIGKILL cannot restore anything, but it recorded the original knobs
/// before changing them: `kfuse mem restore`, or any other `kfuse mem` command, puts them back.
#[test]
fn knobs_of_a_governor_killed_outright_are_put_back_by_the_next_command() {
    let Some(mut turn) =
        root_and_ksm("knobs_of_a_governor_killed_outright_are_put_back_by_the_next_command")
    else {
        return;
    };
    let original_run = turn.ksm.get(Knob::Run).unwrap();
    // The governor turns merging on where it is off, which leaves a knob changed when it dies.
    turn.ksm.set(Knob::Run, 0).unwrap();
    let before = turn.ksm.settings().unwrap();
    let holder = Holder::start(&["--mib", "1", "--seed", "11", "--merge"], None);
    for command in [&["mem", "restore"][..], &["mem", "status", "--window", "0"]] {
        let child = start_governor(&mut turn);
        let pid = child.id();
        signal(&child, libc::SIGKILL);
        let out = child.wait_with_output().unwrap();
        turn.relock();
        assert!(!out.status.success());
        let record = turn
            .ksm
            .read_record()
            .unwrap()
            .expect("the governor's record");
        assert_eq!(record.pid, pid);
        assert!(
            record.knobs.contains(&(Knob::Run, "0".to_string())),
            "{record:?}"
        );
        assert_eq!(turn.ksm.get(Knob::Run).unwrap(), Some(1), "left changed");
        let out = turn.with_lock_released(|| {
            let out = kfuse(command);
            let err = stderr(&out);
            (out, err)
        });
        turn.relock();
        assert!(out.status.success(), "{command:?}: {}", stderr(&out));
        let said = format!("{}{}", stdout(&out), stderr(&out));
        assert!(
            said.contains(&format!("put back the KSM settings pid {pid} changed"))
                || said.contains(&format!("put back KSM settings that pid {pid} changed")),
            "{command:?}: {said}"
        );
        assert_eq!(turn.ksm.settings().unwrap(), before, "{command:?}");
        assert_eq!(turn.ksm.read_record().unwrap(), None);
    }
    let out = turn.with_lock_released(|| {
        let out = kfuse(&["mem", "restore"]);
        let err = stderr(&out);
        (out, err)
    });
    turn.relock();
    assert!(stdout(&out).contains("no KSM settings wait to be put back"));
    drop(holder);
    turn.ksm.set(Knob::Run, original_run.unwrap_or(0)).unwrap();
}

/// `kfuse mem top` stops on SIGHUP and SIGQUIT as on SIGINT, exiting cleanly.
#[test]
fn top_stops_cleanly_on_hangup_and_quit() {
    if !Ksm::system().available() {
        skip(
            "top_stops_cleanly_on_hangup_and_quit",
            Prerequisite::Ksm,
            "no KSM in this kernel",
        );
        return;
    }
    for sig in [libc::SIGHUP, libc::SIGQUIT] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kfuse"))
            .args(["mem", "top", "--interval", "0.05"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert!(first.contains("kfuse mem top"), "{first}");
        signal(&child, sig);
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "signal {sig}: {:?}", out.status);
    }
}

#[test]
fn the_demo_shares_weights_through_ksm_and_the_pool() {
    let out = kfuse(&[
        "mem",
        "demo",
        "--workers",
        "2",
        "--mib",
        "4",
        "--race-defaults",
    ]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("2. The dedup pool"), "{text}");
    // The pool line: workers' PSS is about one copy, well under their RSS.
    let line = text.lines().find(|l| l.contains("workers: RSS")).unwrap();
    let numbers: Vec<f64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let (rss, pss) = (numbers[0], numbers[1]);
    assert!(
        pss < 0.75 * rss,
        "pool sharing does not show in PSS: {line}"
    );
    if sys::is_root() && Ksm::system().available() {
        assert!(text.contains("map KSM pages"), "{text}");
        // The race against the kernel's default rate is reported, not judged: its ratio
        // depends on the machine.
        assert!(text.contains("at the kernel's default rate"), "{text}");
        assert!(
            text.contains("as fast as the kernel's default rate"),
            "{text}"
        );
        assert!(text.contains("was refused"), "{text}");
    } else {
        skip(
            "the_demo_shares_weights_through_ksm_and_the_pool (its kernel-KSM and cross-domain parts)",
            if sys::is_root() {
                Prerequisite::Ksm
            } else {
                Prerequisite::Root
            },
            "they need root and KSM; only the pool part was checked",
        );
    }
}

#[test]
fn bad_input_gets_clear_errors() {
    let cases: [(&[&str], &str); 5] = [
        (
            &[
                "mem",
                "hold",
                "--mib",
                "1",
                "--seed",
                "1",
                "--pool",
                "/nonexistent/pool.sock",
            ],
            "cannot connect to the pool at /nonexistent/pool.sock",
        ),
        (
            &["mem", "govern", "--admit", "tenant-a"],
            "bad domain `tenant-a`",
        ),
        (&["mem", "status", "--window=-1"], "--window"),
        (&["mem", "top", "--interval", "0"], "--interval"),
        (&["mem", "demo", "--workers", "0"], "at least one worker"),
    ];
    for (args, message) in cases {
        let out = kfuse(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr(&out).contains(message), "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).contains("panicked"), "{args:?}");
    }
    // Without a security module that labels processes, every process would read as
    // `unconfined`, so a label domain is refused rather than admitting everyone.
    if Procfs::system().check_labels().is_err() {
        let out = kfuse(&["mem", "audit", "--domain", "label"]);
        assert!(!out.status.success());
        assert!(
            stderr(&out).contains("none is loaded here"),
            "{}",
            stderr(&out)
        );
    }
}
