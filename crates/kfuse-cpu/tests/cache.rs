//! The compile cache is trusted only as far as it can be: a private directory, and objects
//! loaded only where their keyed tag vouches for them. Planted, swapped, truncated and untagged
//! objects are rebuilt, never loaded; a shared or linked directory is refused; concurrent
//! compilations of one kernel all succeed.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use kfuse_cpu::{CacheOutcome, Compiler, Numerics};

/// A kernel source with the entry point the cache loads; `n` makes each one different.
fn kernel(n: u32) -> String {
    format!(
        "#include <stdint.h>\nint kfuse_marker_{n} = {n};\n\
         void kfuse_kernel(void **args, int64_t o_lo, int64_t o_hi, int64_t j_lo, int64_t j_hi) {{\n\
         (void)args; (void)o_lo; (void)o_hi; (void)j_lo; (void)j_hi; }}\n"
    )
}

/// A fresh, empty directory path for test `name` (not created).
fn fresh(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kfuse-cache-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The compiler on a fresh cache, or `None` (with the reason printed) where there is none.
fn compiler(name: &str) -> Option<(Compiler, PathBuf)> {
    let dir = fresh(name);
    match Compiler::detect(dir.clone()) {
        Ok(cc) => Some((cc, dir)),
        Err(e) => {
            kfuse_testkit::skip(name, kfuse_testkit::Prerequisite::CCompiler, &e);
            None
        }
    }
}

#[test]
fn the_cache_directory_and_secret_are_private() {
    let Some((_, dir)) = compiler("private") else {
        return;
    };
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("secret")), 0o600);
    // A directory of ours that others may write is closed to them.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    Compiler::detect(dir.clone()).unwrap();
    assert_eq!(mode(&dir), 0o700);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_linked_or_foreign_cache_directory_is_refused() {
    let Some((_, target)) = compiler("link-target") else {
        return;
    };
    let link = fresh("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let err = Compiler::detect(link.clone()).unwrap_err();
    assert!(
        err.contains("symbolic link") && err.contains("KFUSE_CACHE_DIR"),
        "{err}"
    );
    std::fs::remove_file(&link).unwrap();
    // Another user's directory (only root can make one to test with).
    // SAFETY: `geteuid` has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let foreign = fresh("foreign");
        std::fs::create_dir(&foreign).unwrap();
        std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).unwrap();
        let err = Compiler::detect(foreign.clone()).unwrap_err();
        assert!(err.contains("belongs to user 65534"), "{err}");
        std::fs::remove_dir_all(&foreign).unwrap();
    } else {
        kfuse_testkit::skip(
            "a_linked_or_foreign_cache_directory_is_refused",
            kfuse_testkit::Prerequisite::Root,
            "making another user's directory needs root",
        );
    }
    std::fs::remove_dir_all(&target).unwrap();
}

#[test]
fn objects_without_a_valid_tag_are_rebuilt_not_loaded() {
    let Some((cc, dir)) = compiler("tags") else {
        return;
    };
    let (a, b) = (kernel(1), kernel(2));
    let (_, first) = cc.compile(&a, Numerics::Fast).unwrap();
    assert_eq!(first, CacheOutcome::Miss);
    assert_eq!(cc.compile(&a, Numerics::Fast).unwrap().1, CacheOutcome::Hit);
    cc.compile(&b, Numerics::Fast).unwrap();
    let (path_a, path_b) = (
        cc.object_path(&a, Numerics::Fast),
        cc.object_path(&b, Numerics::Fast),
    );
    let tampered: [(&str, Box<dyn Fn()>); 4] = [
        // Another kernel's object under this kernel's name.
        (
            "swapped",
            Box::new(|| {
                std::fs::copy(&path_b, &path_a).unwrap();
            }),
        ),
        // A truncated object (a crash while writing, a full disk).
        (
            "truncated",
            Box::new(|| {
                let bytes = std::fs::read(&path_a).unwrap();
                std::fs::write(&path_a, &bytes[..64]).unwrap();
            }),
        ),
        // An object planted with no tag.
        (
            "untagged",
            Box::new(|| {
                std::fs::remove_file(path_a.with_extension("tag")).unwrap();
            }),
        ),
        // A tag copied from another kernel.
        (
            "retagged",
            Box::new(|| {
                std::fs::copy(path_b.with_extension("tag"), path_a.with_extension("tag")).unwrap();
            }),
        ),
    ];
    for (what, tamper) in &tampered {
        tamper();
        let (kernel, outcome) = cc.compile(&a, Numerics::Fast).unwrap();
        assert_eq!(
            outcome,
            CacheOutcome::Miss,
            "{what}: the object was not rebuilt"
        );
        assert_ne!(
            std::fs::read(&kernel.path).unwrap(),
            std::fs::read(&path_b).unwrap(),
            "{what}: another kernel's object is in place"
        );
        assert_eq!(
            cc.compile(&a, Numerics::Fast).unwrap().1,
            CacheOutcome::Hit,
            "{what}"
        );
    }
    // Nothing but objects, their tags and the secret is left behind.
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(
            name == "secret" || name.ends_with(".so") || name.ends_with(".tag"),
            "left behind: {name}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn concurrent_compilations_of_one_kernel_all_succeed() {
    let Some((cc, dir)) = compiler("concurrent") else {
        return;
    };
    let source = kernel(3);
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| scope.spawn(|| cc.compile(&source, Numerics::Strict).map(|(_, o)| o)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for result in &results {
        assert!(result.is_ok(), "{result:?}");
    }
    assert_eq!(
        cc.compile(&source, Numerics::Strict).unwrap().1,
        CacheOutcome::Hit
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
