//! `KFUSE_BLESS` rewrites expected outputs only when it says so: `KFUSE_BLESS=0` once blessed
//! like `1`, because only the variable's presence was checked.

use kfuse_testkit::bless_requested;

#[test]
fn only_one_and_true_bless_and_other_values_are_errors() {
    assert_eq!(bless_requested(None), Ok(false));
    for off in ["", "0", "false", " 0 "] {
        assert_eq!(bless_requested(Some(off)), Ok(false), "{off:?}");
    }
    for on in ["1", "true"] {
        assert_eq!(bless_requested(Some(on)), Ok(true), "{on:?}");
    }
    for unclear in ["yes", "2", "no", "TRUE"] {
        let err = bless_requested(Some(unclear)).unwrap_err();
        assert!(err.contains(&format!("{unclear:?}")), "{err}");
    }
}
