//! Skips show, and in CI a missing prerequisite CI promises is a failure, not a skip.

use kfuse_testkit::prerequisites::skip_fails;
use kfuse_testkit::Prerequisite;

#[test]
fn in_ci_a_promised_prerequisite_must_be_there_unless_skips_are_allowed() {
    let promised = [
        Prerequisite::Root,
        Prerequisite::Avx512,
        Prerequisite::CCompiler,
        Prerequisite::Ksm,
    ];
    for missing in promised {
        assert!(skip_fails(missing, Some("true"), None), "{missing:?}");
        assert!(skip_fails(missing, Some("1"), Some("0")), "{missing:?}");
        assert!(!skip_fails(missing, Some("true"), Some("1")), "{missing:?}");
        assert!(
            !skip_fails(missing, Some("true"), Some("true")),
            "{missing:?}"
        );
        for outside_ci in [None, Some(""), Some("0"), Some("false")] {
            assert!(
                !skip_fails(missing, outside_ci, None),
                "{missing:?} {outside_ci:?}"
            );
        }
    }
    assert!(!skip_fails(Prerequisite::Optional, Some("true"), None));
}
