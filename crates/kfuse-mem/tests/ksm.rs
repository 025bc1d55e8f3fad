//! The typed KSM interface: parsing and the restoring guard on a copy of the sysfs directory,
//! then merging observed for real (root only).

mod common;

use std::fs;
use std::path::PathBuf;

use common::{ksm_or_skip, merged_pages_in, page_of, wait_for};
use kfuse_mem::ksm::{cpu_seconds_from_stat, Counters, Knob, KnobGuard, Ksm, Recovery, Savings};
use kfuse_mem::process::{Procfs, SmapsKsm};
use kfuse_mem::sys::{self, Region};
use kfuse_mem::MemError;

/// A scratch copy of a KSM sysfs directory and a `/proc` with a vmstat.
fn fake(name: &str, files: &[(&str, &str)]) -> (Ksm, PathBuf) {
    let dir = std::env::temp_dir().join(format!("kfuse-mem-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("ksm")).unwrap();
    fs::create_dir_all(dir.join("proc")).unwrap();
    for (file, text) in files {
        fs::write(dir.join("ksm").join(file), format!("{text}\n")).unwrap();
    }
    fs::write(
        dir.join("proc/vmstat"),
        "nr_free_pages 5\ncow_ksm 17\nksm_swpin_copy 2\n",
    )
    .unwrap();
    (Ksm::at(dir.join("ksm"), dir.join("proc")), dir)
}

#[test]
fn counters_and_knobs_are_read_typed_and_missing_files_are_none() {
    let (ksm, dir) = fake(
        "counters",
        &[
            ("run", "1"),
            ("pages_to_scan", "100"),
            ("advisor_mode", "none [scan-time]"),
            ("pages_shared", "10"),
            ("pages_sharing", "30"),
            ("pages_unshared", "5"),
            ("general_profit", "-4096"),
        ],
    );
    assert_eq!(ksm.get(Knob::Run).unwrap(), Some(1));
    assert_eq!(ksm.get(Knob::AdvisorMode).unwrap(), Some(1));
    assert_eq!(ksm.get(Knob::SmartScan).unwrap(), None);
    let c = ksm.counters().unwrap();
    assert_eq!(c.pages_sharing, Some(30));
    assert_eq!(c.general_profit, Some(-4096));
    assert_eq!(c.full_scans, None);
    let v = ksm.vmstat().unwrap();
    assert_eq!((v.cow_ksm, v.ksm_swpin_copy), (Some(17), Some(2)));
    assert!(matches!(
        ksm.set(Knob::SmartScan, 1),
        Err(MemError::Unsupported(_))
    ));
    assert!(matches!(
        ksm.set(Knob::AdvisorMode, 7),
        Err(MemError::BadValue(..))
    ));
    fs::write(dir.join("ksm/pages_shared"), "lots\n").unwrap();
    let err = ksm.counters().unwrap_err();
    assert!(err.to_string().contains("pages_shared") && err.to_string().contains("lots"));
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn the_guard_restores_every_knob_it_changed_and_only_those() {
    let (ksm, dir) = fake(
        "guard",
        &[
            ("run", "0"),
            ("pages_to_scan", "100"),
            ("sleep_millisecs", "20"),
            ("advisor_mode", "[none] scan-time"),
        ],
    );
    {
        let mut guard = KnobGuard::new(&ksm);
        guard.set(Knob::PagesToScan, 5000).unwrap();
        guard.set(Knob::PagesToScan, 7000).unwrap();
        guard.set(Knob::AdvisorMode, 1).unwrap();
        guard.set(Knob::Run, 1).unwrap();
        assert_eq!(ksm.get(Knob::PagesToScan).unwrap(), Some(7000));
        assert_eq!(
            fs::read_to_string(dir.join("ksm/advisor_mode")).unwrap(),
            "scan-time"
        );
        assert_eq!(guard.changed().len(), 3);
        assert!(guard.set(Knob::SmartScan, 1).is_err(), "absent knob");
    }
    assert_eq!(ksm.get(Knob::PagesToScan).unwrap(), Some(100));
    assert_eq!(ksm.get(Knob::Run).unwrap(), Some(0));
    assert_eq!(
        fs::read_to_string(dir.join("ksm/advisor_mode")).unwrap(),
        "none"
    );
    assert_eq!(
        fs::read_to_string(dir.join("ksm/sleep_millisecs")).unwrap(),
        "20\n"
    );
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn savings_count_pages_sharing_and_net_out_the_reverse_map() {
    let counters = Counters {
        pages_shared: Some(10),
        pages_sharing: Some(30),
        ksm_zero_pages: Some(2),
        general_profit: Some(32 * 4096 - 50 * 64),
        ..Counters::default()
    };
    let s = Savings::from_counters(&counters, 4096);
    assert_eq!(
        s.saved_bytes,
        32 * 4096,
        "pages_sharing plus zero pages, not pages_shared"
    );
    assert_eq!(s.shared_bytes, 10 * 4096);
    assert_eq!(s.rmap_bytes, Some(50 * 64));
    assert_eq!(s.profit_bytes, 32 * 4096 - 50 * 64);
    assert!((s.sharing_factor - 4.0).abs() < 1e-12);
    // Without general_profit, at least one rmap item per tracked page is charged.
    let old = Counters {
        general_profit: None,
        pages_unshared: Some(60),
        ..counters
    };
    let s = Savings::from_counters(&old, 4096);
    assert_eq!(s.profit_bytes, 32 * 4096 - 100 * 64);
}

#[test]
fn proc_text_is_parsed_without_trusting_it() {
    let stat = "37 (ksm d) (x) S 2 0 0 0 -1 2129984 0 0 0 0 150 250 0 0 25 5 1 0 36 0 0";
    let ticks = sys::clock_ticks_per_second() as f64;
    assert_eq!(cpu_seconds_from_stat(stat), Some(400.0 / ticks));
    assert_eq!(cpu_seconds_from_stat("garbage"), None);
    let smaps = "7f00-7f10 rw-p 0 0 0\nRss:  64 kB\nKSM:  16 kB\nVmFlags: rd wr mg\n\
                 7f20-7f30 rw-p 0 0 0\nRss:  8 kB\nKSM:  0 kB\nVmFlags: rd wr\n";
    assert_eq!(
        SmapsKsm::parse(smaps),
        SmapsKsm {
            mergeable_rss_bytes: 64 * 1024,
            ksm_bytes: 16 * 1024
        }
    );
    assert_eq!(
        kfuse_mem::audit::ksm_ranges_in_smaps(smaps),
        vec![(0x7f00, 0x7f10)]
    );
}

#[test]
fn this_kernel_s_features_are_detected() {
    let ksm = Ksm::system();
    if !ksm.available() {
        kfuse_testkit::skip(
            "this_kernel_s_features_are_detected",
            kfuse_testkit::Prerequisite::Ksm,
            "no KSM in this kernel",
        );
        return;
    }
    let f = ksm.features().unwrap();
    assert!(f.ksm && f.knobs.contains(&Knob::Run) && f.knobs.contains(&Knob::PagesToScan));
    assert!(!f.kernel.is_empty());
    // Each flag agrees with the file it stands for.
    assert_eq!(f.smart_scan, ksm.root().join("smart_scan").exists());
    assert_eq!(f.general_profit, ksm.root().join("general_profit").exists());
    assert_eq!(
        f.ksm_stat,
        std::path::Path::new("/proc/self/ksm_stat").exists()
    );
}

#[test]
fn merging_is_observed_per_process_and_the_savings_add_up() {
    let Some((ksm, _lock)) = ksm_or_skip("merging_is_observed_per_process_and_the_savings_add_up")
    else {
        return;
    };
    let settings_before = ksm.settings().unwrap();
    let page = sys::page_size();
    // 64 pages: 16 contents, 4 copies each.
    let mut region = Region::anonymous(64 * page).unwrap();
    for i in 0..64 {
        region.as_mut_slice()[i * page..(i + 1) * page]
            .copy_from_slice(&page_of(1_000 + i as u64 % 16));
    }
    let ksm_bytes_before = Procfs::system()
        .smaps_ksm(std::process::id())
        .unwrap()
        .unwrap()
        .ksm_bytes;
    region.set_mergeable(true).unwrap();
    let mut guard = KnobGuard::new(&ksm);
    guard.set(Knob::PagesToScan, 5_000).unwrap();
    guard.set(Knob::SleepMillisecs, 10).unwrap();
    guard.set(Knob::Run, 1).unwrap();
    let took = wait_for(30.0, || merged_pages_in(&region) >= 64);
    assert!(
        took.is_some(),
        "64 duplicated pages were not merged in 30 s"
    );
    let me = Procfs::system().ksm(std::process::id()).unwrap().unwrap();
    assert!(me.mergeable, "madvise(MADV_MERGEABLE) shows in ksm_stat");
    assert!(!me.merge_any, "prctl merging was not asked for");
    assert_eq!(
        me.profit_bytes,
        (me.merging_pages + me.zero_pages) as i64 * page as i64
            - me.rmap_items as i64 * kfuse_mem::ksm::RMAP_ITEM_BYTES as i64,
        "per-process profit is merged pages net of 64-byte rmap items"
    );
    let smaps = Procfs::system()
        .smaps_ksm(std::process::id())
        .unwrap()
        .unwrap();
    assert!(
        smaps.ksm_bytes >= 64 * page as u64,
        "smaps KSM lines: {smaps:?}"
    );
    // Globally: at least 16 kept copies and 48 sharers, and the rmap cost derived from
    // general_profit is a whole number of items.
    let counters = ksm.counters().unwrap();
    let savings = Savings::from_counters(&counters, page as u64);
    assert!(counters.pages_shared.unwrap() >= 16 && counters.pages_sharing.unwrap() >= 48);
    assert!(savings.saved_bytes >= 48 * page as u64);
    if let Some(rmap) = savings.rmap_bytes {
        assert_eq!(rmap % kfuse_mem::ksm::RMAP_ITEM_BYTES, 0, "{savings:?}");
    }
    region.set_mergeable(false).unwrap();
    // MADV_UNMERGEABLE breaks every merge at once (ksm_stat catches up on ksmd's next pass,
    // smaps does not wait).
    let after = Procfs::system()
        .smaps_ksm(std::process::id())
        .unwrap()
        .unwrap();
    assert_eq!(after.ksm_bytes, ksm_bytes_before);
    for i in 0..64 {
        assert_eq!(
            region.as_slice()[i * page..(i + 1) * page],
            page_of(1_000 + i as u64 % 16)
        );
    }
    guard.restore().unwrap();
    assert_eq!(
        ksm.settings().unwrap(),
        settings_before,
        "every knob is back"
    );
}

#[test]
fn the_guard_restores_the_real_knobs() {
    let Some((ksm, _lock)) = ksm_or_skip("the_guard_restores_the_real_knobs") else {
        return;
    };
    let before = ksm.settings().unwrap();
    {
        let mut guard = KnobGuard::new(&ksm);
        for (knob, value) in before.iter() {
            let changed = match knob {
                // These two refuse changes while KSM pages exist; the rest take any value.
                Knob::MaxPageSharing | Knob::MergeAcrossNodes | Knob::Run => continue,
                Knob::UseZeroPages | Knob::SmartScan | Knob::AdvisorMode => 1 - value.min(&1),
                _ => value + 1,
            };
            guard.set(*knob, changed).unwrap();
            assert_eq!(ksm.get(*knob).unwrap(), Some(changed), "{knob:?}");
        }
        assert_ne!(ksm.settings().unwrap(), before);
    }
    assert_eq!(ksm.settings().unwrap(), before);
}

#[test]
fn kernels_without_ksm_stat_still_report_merging_pages() {
    let dir = std::env::temp_dir().join(format!("kfuse-mem-oldproc-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("42")).unwrap();
    fs::write(dir.join("42/status"), "Name:\told\nUid:\t7\t7\t7\t7\n").unwrap();
    fs::write(dir.join("42/ksm_merging_pages"), "123\n").unwrap();
    let p = Procfs::at(&dir).ksm(42).unwrap().unwrap();
    assert_eq!((p.merging_pages, p.uid, p.name.as_str()), (123, 7, "old"));
    assert!(
        Procfs::at(&dir).ksm(43).unwrap().is_none(),
        "no such process"
    );
    let _ = fs::remove_dir_all(dir);
}

/// The fake directory's record of changed knobs, as text, if there is one.
fn record_text(ksm: &Ksm) -> Option<String> {
    fs::read_to_string(ksm.record_path()).ok()
}

#[test]
fn knobs_are_recorded_before_they_change_and_the_record_goes_with_the_restore() {
    use std::os::unix::fs::PermissionsExt;
    let (ksm, dir) = fake(
        "record",
        &[
            ("run", "0"),
            ("pages_to_scan", "100"),
            ("sleep_millisecs", "20"),
        ],
    );
    let mut guard = KnobGuard::new(&ksm);
    guard.set(Knob::PagesToScan, 5000).unwrap();
    guard.set(Knob::Run, 1).unwrap();
    let text = record_text(&ksm).expect("a record while knobs are changed");
    assert!(
        text.contains(&format!("\npid {} ", std::process::id())),
        "{text}"
    );
    assert!(text.ends_with("\npages_to_scan 100\nrun 0\n"), "{text}");
    let mode = fs::metadata(ksm.record_path())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    guard.restore().unwrap();
    assert_eq!(
        record_text(&ksm),
        None,
        "the record goes once the knobs are back"
    );
    assert_eq!(ksm.get(Knob::Run).unwrap(), Some(0));
    // Where the record cannot be written, the knob is not changed.
    fs::remove_dir_all(dir.join("ksm/.kfuse")).unwrap();
    fs::write(dir.join("ksm/.kfuse"), "not a directory").unwrap();
    let mut guard = KnobGuard::new(&ksm);
    assert!(guard.set(Knob::PagesToScan, 5000).is_err());
    assert_eq!(ksm.get(Knob::PagesToScan).unwrap(), Some(100));
    drop(guard);
    let _ = fs::remove_dir_all(dir);
}

/// Makes the record look written by a process that died: same pid, another start time, as
/// when the pid has been reused.
fn as_if_its_writer_died(ksm: &Ksm) {
    let text = record_text(ksm).unwrap();
    let owner = format!("pid {} ", std::process::id());
    let start = text.find(&owner).unwrap() + owner.len();
    let end = start + text[start..].find('\n').unwrap();
    fs::write(
        ksm.record_path(),
        format!("{}1{}", &text[..start], &text[end..]),
    )
    .unwrap();
}

#[test]
fn knobs_left_by_a_process_that_died_are_put_back() {
    let (ksm, dir) = fake(
        "recover",
        &[
            ("run", "0"),
            ("pages_to_scan", "100"),
            ("sleep_millisecs", "20"),
        ],
    );
    assert_eq!(ksm.recover().unwrap(), Recovery::Nothing);
    // A guard that never restores, as in a process killed by SIGKILL.
    let mut guard = KnobGuard::new(&ksm);
    guard.set(Knob::PagesToScan, 5000).unwrap();
    guard.set(Knob::Run, 1).unwrap();
    std::mem::forget(guard);
    // While its writer runs, the record is left to it.
    assert_eq!(
        ksm.recover().unwrap(),
        Recovery::WriterRunning(std::process::id())
    );
    assert_eq!(ksm.get(Knob::Run).unwrap(), Some(1));
    as_if_its_writer_died(&ksm);
    match ksm.recover().unwrap() {
        Recovery::Restored(record) => assert_eq!(
            record.knobs,
            vec![
                (Knob::PagesToScan, "100".to_string()),
                (Knob::Run, "0".to_string())
            ]
        ),
        other => panic!("nothing put back: {other:?}"),
    }
    assert_eq!(ksm.get(Knob::PagesToScan).unwrap(), Some(100));
    assert_eq!(ksm.get(Knob::Run).unwrap(), Some(0));
    assert_eq!(record_text(&ksm), None);
    // A guard that finds such a record puts its knobs back before taking its own originals.
    let mut guard = KnobGuard::new(&ksm);
    guard.set(Knob::PagesToScan, 5000).unwrap();
    std::mem::forget(guard);
    as_if_its_writer_died(&ksm);
    let mut guard = KnobGuard::new(&ksm);
    guard.set(Knob::PagesToScan, 300).unwrap();
    assert_eq!(
        guard.changed(),
        &[(Knob::PagesToScan, "100".to_string())][..]
    );
    drop(guard);
    assert_eq!(ksm.get(Knob::PagesToScan).unwrap(), Some(100));
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn a_record_that_is_a_link_open_to_others_or_garbled_is_not_trusted() {
    use std::os::unix::fs::PermissionsExt;
    let (ksm, dir) = fake("untrusted", &[("run", "0"), ("pages_to_scan", "100")]);
    let mut guard = KnobGuard::new(&ksm);
    guard.set(Knob::Run, 1).unwrap();
    std::mem::forget(guard);
    as_if_its_writer_died(&ksm);
    let path = ksm.record_path();
    let good = fs::read_to_string(&path).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    assert!(matches!(ksm.recover(), Err(MemError::Refused(_))));
    fs::remove_file(&path).unwrap();
    let elsewhere = dir.join("elsewhere");
    fs::write(&elsewhere, &good).unwrap();
    fs::set_permissions(&elsewhere, fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
    assert!(ksm.recover().is_err(), "a link is not followed");
    fs::remove_file(&path).unwrap();
    for garbled in [
        good.replace("run 0", "run 0; reboot"),
        good.replace("run 0", "no_such_knob 0"),
        good.replace("kfuse ksm knobs 1", "something else"),
    ] {
        fs::write(&path, &garbled).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(
            matches!(ksm.recover(), Err(MemError::Parse(..))),
            "{garbled}"
        );
    }
    assert_eq!(
        ksm.get(Knob::Run).unwrap(),
        Some(1),
        "nothing was written back"
    );
    let _ = fs::remove_dir_all(dir);
}
