//! The fast routines check their epilogue operands (bias, scale, residual) and say what is wrong,
//! instead of reading out of bounds or misreading another dtype.

use kfuse_ir::{Conv2dAttrs, Layout, Storage};
use kfuse_routines::dense::View;
use kfuse_routines::epilogue::{Activation, Epilogue};

/// A fast routine run with the given epilogue.
type Routine = fn(&Epilogue) -> Result<(), String>;

fn matmul(epilogue: &Epilogue) -> Result<(), String> {
    let (x, w) = (Storage::F32(vec![1.0; 6]), Storage::F32(vec![1.0; 12]));
    let mut out = Storage::F32(vec![0.0; 8]);
    kfuse_routines::matmul::matmul(
        View {
            storage: &x,
            dims: &[2, 3],
        },
        View {
            storage: &w,
            dims: &[3, 4],
        },
        [false, false],
        &[2, 4],
        &mut out,
        epilogue,
        2,
    )
}

fn conv(epilogue: &Epilogue) -> Result<(), String> {
    let (x, w) = (
        Storage::F32(vec![1.0; 2 * 5 * 5]),
        Storage::F32(vec![1.0; 3 * 2 * 9]),
    );
    let mut out = Storage::F32(vec![0.0; 3 * 5 * 5]);
    let attrs = Conv2dAttrs {
        layout: Layout::Nchw,
        stride: [1, 1],
        padding: [1; 4],
        dilation: [1, 1],
        groups: 1,
    };
    kfuse_routines::conv::conv2d(
        View {
            storage: &x,
            dims: &[1, 2, 5, 5],
        },
        View {
            storage: &w,
            dims: &[3, 2, 3, 3],
        },
        &attrs,
        &[1, 3, 5, 5],
        &mut out,
        epilogue,
    )
}

#[test]
fn good_operands_are_accepted() {
    let (bias, residual) = (Storage::F32(vec![0.5; 4]), Storage::F32(vec![1.0; 8]));
    let epilogue = Epilogue {
        bias: Some(&bias),
        scale: None,
        residual: Some(&residual),
        activation: Some(Activation::Relu),
    };
    matmul(&epilogue).unwrap();
    // A scale: one factor per column, or one for all.
    for factors in [Storage::F32(vec![2.0; 4]), Storage::F32(vec![2.0])] {
        let epilogue = Epilogue {
            bias: Some(&bias),
            scale: Some(&factors),
            ..Epilogue::default()
        };
        matmul(&epilogue).unwrap();
    }
    let (bias, residual) = (Storage::F32(vec![0.5; 3]), Storage::F32(vec![1.0; 75]));
    let epilogue = Epilogue {
        bias: Some(&bias),
        scale: None,
        residual: Some(&residual),
        activation: Some(Activation::GeluTanh),
    };
    conv(&epilogue).unwrap();
}

#[test]
fn wrong_operands_are_errors_that_name_them() {
    let short = Storage::F32(vec![0.0; 2]);
    let wrong_dtype = Storage::F64(vec![0.0; 8]);
    let three = Storage::F32(vec![0.0; 3]);
    let cases: [(Routine, Epilogue, &str); 6] = [
        (
            matmul,
            Epilogue {
                bias: Some(&short),
                ..Epilogue::default()
            },
            "the bias has 2 values where 4",
        ),
        (
            matmul,
            Epilogue {
                residual: Some(&wrong_dtype),
                ..Epilogue::default()
            },
            "the residual dtype",
        ),
        (
            conv,
            Epilogue {
                bias: Some(&short),
                ..Epilogue::default()
            },
            "the bias has 2 values where 3",
        ),
        (
            conv,
            Epilogue {
                residual: Some(&short),
                ..Epilogue::default()
            },
            "the residual has 2 values where 75",
        ),
        (
            matmul,
            Epilogue {
                scale: Some(&three),
                ..Epilogue::default()
            },
            "the scale has 3 values where 4",
        ),
        (
            conv,
            Epilogue {
                scale: Some(&three),
                ..Epilogue::default()
            },
            "a scale epilogue is fused only after a matmul",
        ),
    ];
    for (run, epilogue, want) in cases {
        let err = run(&epilogue).unwrap_err();
        assert!(err.contains(want), "{err:?} should say {want:?}");
    }
}
