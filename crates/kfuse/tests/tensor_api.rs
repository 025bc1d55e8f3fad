//! The lazy tensor API: numpy/PyTorch-shaped methods build the same graphs as the text form,
//! composites compute what they claim, and bad calls become errors that name the call site.

use kfuse::{cat, where_, Array, Context, DType, PadMode};

fn close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs().max(1.0),
            "{got:?} vs {want:?}"
        );
    }
}

#[test]
fn arithmetic_broadcasting_and_scalars() {
    let cx = Context::new();
    let a = cx.tensor(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let col = cx.tensor(&[10.0f32, 20.0], &[2, 1]);
    let y = (&a + &col) * 2.0 - 1.0;
    assert_eq!(
        y.to_vec::<f32>().unwrap(),
        vec![21.0, 23.0, 25.0, 47.0, 49.0, 51.0]
    );
    assert_eq!(
        (1.0 - &a).to_vec::<f32>().unwrap(),
        vec![0.0, -1.0, -2.0, -3.0, -4.0, -5.0]
    );
    assert_eq!((-&a).max_all().to_vec::<f32>().unwrap(), vec![-1.0]);
    let r = &a % 4.0;
    assert_eq!(
        r.to_vec::<f32>().unwrap(),
        vec![1.0, 2.0, 3.0, 0.0, 1.0, 2.0]
    );
    let i = cx.tensor(&[7i64, -7], &[2]);
    assert_eq!((&i / 2).to_vec::<i64>().unwrap(), vec![3, -4]);
    let mask = a.gt(3.0);
    assert_eq!(
        mask.to_vec::<bool>().unwrap(),
        vec![false, false, false, true, true, true]
    );
    assert_eq!(
        (!&mask).to_vec::<bool>().unwrap(),
        vec![true, true, true, false, false, false]
    );
    let picked = where_(&mask, &a, 0.0);
    assert_eq!(
        picked.to_vec::<f32>().unwrap(),
        vec![0.0, 0.0, 0.0, 4.0, 5.0, 6.0]
    );
    assert_eq!(
        a.clamp(2.0, 5.0).sum_all().to_vec::<f32>().unwrap(),
        vec![2.0 + 2.0 + 3.0 + 4.0 + 5.0 + 5.0]
    );
    assert_eq!(
        a.cast(DType::I32).to_vec::<i32>().unwrap(),
        vec![1, 2, 3, 4, 5, 6]
    );
}

#[test]
fn reductions_and_shapes() {
    let cx = Context::new();
    let a = cx.arange(24, DType::F32).reshape(&[2, 3, 4]);
    assert_eq!(a.shape().unwrap(), vec![2, 3, 4]);
    assert_eq!(a.sum(&[-1], false).shape().unwrap(), vec![2, 3]);
    assert_eq!(
        a.mean(&[0, 2], true).to_vec::<f32>().unwrap(),
        vec![7.5, 11.5, 15.5]
    );
    assert_eq!(
        a.argmax(1, false).to_vec::<i64>().unwrap(),
        vec![2, 2, 2, 2, 2, 2, 2, 2]
    );
    assert_eq!(a.reshape(&[-1, 6]).shape().unwrap(), vec![4, 6]);
    assert_eq!(a.permute(&[2, 0, 1]).shape().unwrap(), vec![4, 2, 3]);
    assert_eq!(a.t().shape().unwrap(), vec![2, 4, 3]);
    assert_eq!(a.unsqueeze(0).shape().unwrap(), vec![1, 2, 3, 4]);
    assert_eq!(a.unsqueeze(-1).shape().unwrap(), vec![2, 3, 4, 1]);
    assert_eq!(a.sum(&[1], true).squeeze(1).shape().unwrap(), vec![2, 4]);
    let row = cx.arange(5, DType::I64);
    assert_eq!(row.slice(0, 1, -1, 2).to_vec::<i64>().unwrap(), vec![1, 3]);
    assert_eq!(
        row.slice(0, -2, 100, 1).to_vec::<i64>().unwrap(),
        vec![3, 4]
    );
    assert_eq!(row.narrow(0, 1, 2).to_vec::<i64>().unwrap(), vec![1, 2]);
    assert_eq!(row.flip(&[0]).to_vec::<i64>().unwrap(), vec![4, 3, 2, 1, 0]);
    assert_eq!(
        row.pad(&[(2, 1)], PadMode::Reflect, 0.0)
            .to_vec::<i64>()
            .unwrap(),
        vec![2, 1, 0, 1, 2, 3, 4, 3]
    );
    assert_eq!(
        cat(&[&row, &row.narrow(0, 0, 1)], 0)
            .to_vec::<i64>()
            .unwrap(),
        vec![0, 1, 2, 3, 4, 0]
    );
    assert_eq!(
        cx.zeros(DType::U8, &[2, 2]).to_vec::<u8>().unwrap(),
        vec![0; 4]
    );
    assert_eq!(
        cx.ones(DType::F64, &[3]).sum_all().to_vec::<f64>().unwrap(),
        vec![3.0]
    );
    assert_eq!(
        cx.full(2.5, DType::F32, &[2]).to_vec::<f32>().unwrap(),
        vec![2.5, 2.5]
    );
}

#[test]
fn matmul_follows_numpy_for_vectors_and_batches() {
    let cx = Context::new();
    let m = cx.tensor(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    let v = cx.tensor(&[1.0f32, 1.0], &[2]);
    assert_eq!(m.matmul(&v).to_vec::<f32>().unwrap(), vec![3.0, 7.0]);
    assert_eq!(v.matmul(&m).to_vec::<f32>().unwrap(), vec![4.0, 6.0]);
    assert_eq!(v.matmul(&v).shape().unwrap(), Vec::<usize>::new());
    let batch = cx.ones(DType::F32, &[3, 2, 2]);
    assert_eq!(batch.matmul(&m).shape().unwrap(), vec![3, 2, 2]);
    let w = cx.tensor(&[1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], &[2, 3]);
    let b = cx.tensor(&[0.5f32, 0.5, 0.5], &[3]);
    assert_eq!(
        m.linear(&w, Some(&b)).to_vec::<f32>().unwrap(),
        vec![3.5, 2.5, 2.5, 7.5, 4.5, 4.5]
    );
}

#[test]
fn composites_compute_what_they_claim() {
    let cx = Context::new();
    let x = cx.tensor(&[1.0f32, 2.0, 3.0, -1.0, 0.0, 1.0], &[2, 3]);
    let s = x.softmax(-1).to_vec::<f32>().unwrap();
    let e: Vec<f32> = [1.0f32, 2.0, 3.0].iter().map(|v| (v - 3.0).exp()).collect();
    let z: f32 = e.iter().sum();
    close(&s[..3], &e.iter().map(|v| v / z).collect::<Vec<_>>());
    let ls = x.log_softmax(-1).to_vec::<f32>().unwrap();
    close(&ls, &s.iter().map(|v| v.ln()).collect::<Vec<_>>());
    let gamma = cx.tensor(&[1.0f32, 2.0, 3.0], &[3]);
    let beta = cx.tensor(&[0.0f32, 1.0, 0.0], &[3]);
    let ln = x.layer_norm(&gamma, &beta, 0.0).to_vec::<f32>().unwrap();
    let k = (1.5f32).sqrt();
    close(&ln, &[-k, 1.0, k * 3.0, -k, 1.0, k * 3.0]);
    let rms = x.rms_norm(&gamma, 0.0).to_vec::<f32>().unwrap();
    let r0 = (14.0f32 / 3.0).sqrt();
    close(&rms[..3], &[1.0 / r0, 4.0 / r0, 9.0 / r0]);
    let labels = cx.tensor(&[2i64, 0], &[2]);
    let ce = x.cross_entropy(&labels).to_vec::<f32>().unwrap();
    close(&ce, &[-(ls[2] + ls[3]) / 2.0]);
}

#[test]
fn sorting_indexing_and_random() {
    let cx = Context::new();
    let x = cx.tensor(&[3.0f32, 1.0, 2.0], &[3]);
    let (v, i) = x.sort(0, false);
    assert_eq!(v.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![1, 2, 0]);
    let (tv, ti) = x.topk(1, -1, true);
    assert_eq!(
        (tv.to_vec::<f32>().unwrap(), ti.to_vec::<i64>().unwrap()),
        (vec![3.0], vec![0])
    );
    assert_eq!(x.argsort(0, true).to_vec::<i64>().unwrap(), vec![0, 2, 1]);
    let idx = cx.tensor(&[2i64, 2, 0], &[3]);
    assert_eq!(
        x.gather(0, &idx).to_vec::<f32>().unwrap(),
        vec![2.0, 2.0, 3.0]
    );
    let acc = cx.zeros(DType::F32, &[3]).scatter_add(0, &idx, &x);
    assert_eq!(acc.to_vec::<f32>().unwrap(), vec![2.0, 0.0, 4.0]);
    cx.set_seed(5);
    let u = cx.rand(DType::F32, &[1000]);
    let mean = u.mean_all().to_vec::<f32>().unwrap()[0];
    assert!((mean - 0.5).abs() < 0.05, "{mean}");
    let n = cx.randn(DType::F64, &[4]);
    assert_ne!(
        n.to_vec::<f64>().unwrap(),
        cx.randn(DType::F64, &[4]).to_vec::<f64>().unwrap(),
        "each rng op draws a new seed"
    );
}

#[test]
fn convolution_and_pooling_methods() {
    let cx = Context::new();
    let x = cx.arange(16, DType::F32).reshape(&[1, 1, 4, 4]);
    let w = cx.ones(DType::F32, &[1, 1, 2, 2]);
    let y = x.conv2d(
        &w,
        kfuse::Conv2dAttrs {
            stride: [2, 2],
            ..Default::default()
        },
    );
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![10.0, 18.0, 42.0, 50.0]);
    assert_eq!(
        x.max_pool2d(2, 2, 0).to_vec::<f32>().unwrap(),
        vec![5.0, 7.0, 13.0, 15.0]
    );
    assert_eq!(
        x.avg_pool2d(2, 2, 0).to_vec::<f32>().unwrap(),
        vec![2.5, 4.5, 10.5, 12.5]
    );
}

#[test]
fn inputs_custom_ops_and_graphs() {
    let cx = Context::new();
    let x = cx.input("x", DType::F32, &[3]);
    let unused = cx.input("unused", DType::F32, &[1]);
    let _ = &unused;
    cx.register_custom("double", |args| {
        let v: Vec<f32> = args[0]
            .as_slice::<f32>()
            .ok_or("f32 only")?
            .iter()
            .map(|v| v * 2.0)
            .collect();
        Ok(vec![
            Array::from_vec(vec![v.len()], v).map_err(|e| e.to_string())?
        ])
    });
    let d = cx
        .custom("double", &[&x], &[kfuse::TensorType::new(DType::F32, [3])])
        .remove(0);
    let y = d.exp().log();
    let input = Array::from_vec(vec![3], vec![1.0f32, 2.0, 3.0]).unwrap();
    let out = cx.run(&[("y", &y)], &[("x", input.clone())]).unwrap();
    close(out[0].as_slice::<f32>().unwrap(), &[2.0, 4.0, 6.0]);
    // The extracted graph holds only what `y` needs, and prints in the text form.
    let g = cx.graph(&[("y", &y)]).unwrap();
    let text = kfuse::print_graph(&g);
    assert!(
        text.contains("custom(%0) fn=\"double\"") && !text.contains("unused"),
        "{text}"
    );
    assert!(kfuse::parse(&text).unwrap() == g);
    let err = cx
        .run(&[("y", &y)], &[("x", input.clone()), ("typo", input)])
        .unwrap_err();
    assert!(
        err.to_string().contains("\"typo\" is not an input"),
        "{err}"
    );
}

#[test]
fn bad_calls_are_errors_naming_the_call_site() {
    let cx = Context::new();
    let a = cx.tensor(&[1.0f32, 2.0, 3.0], &[3]);
    let b = cx.tensor(&[1.0f32, 2.0], &[2]);
    let line = line!() + 1;
    let bad = &a + &b;
    let err = bad.to_vec::<f32>().unwrap_err().to_string();
    assert!(err.contains(&format!("tensor_api.rs:{line}:")), "{err}");
    assert!(
        err.ends_with("add: operand 1: expected a shape that broadcasts with [3], found f32[2]"),
        "{err}"
    );
    // Errors travel through later operations unchanged.
    let later = bad.exp().sum_all();
    assert_eq!(later.to_vec::<f32>().unwrap_err().to_string(), err);
    let err = a.sum(&[3], false).ty().unwrap_err().to_string();
    assert!(err.contains("axis 3 is out of range for rank 1"), "{err}");
    assert!(a
        .reshape(&[2, -1])
        .ty()
        .unwrap_err()
        .to_string()
        .contains("cannot reshape [3] to [2, -1]"));
    let ints = cx.tensor(&[1i32], &[1]);
    assert!(ints
        .exp()
        .ty()
        .unwrap_err()
        .to_string()
        .contains("exp: operand 0: expected a float dtype, found i32[1]"));
    assert!(a
        .to_vec::<i64>()
        .unwrap_err()
        .to_string()
        .contains("the tensor is f32, not i64"));
    assert!(cx
        .tensor(&[1.0f32, 2.0], &[3])
        .ty()
        .unwrap_err()
        .to_string()
        .contains("2 values do not fill shape [3]"));
    let other = Context::new().tensor(&[1.0f32], &[1]);
    assert!((&a + &other)
        .ty()
        .unwrap_err()
        .to_string()
        .contains("another Context"));
    let needs_input = cx.input("z", DType::F32, &[1]).exp();
    assert!(needs_input
        .to_vec::<f32>()
        .unwrap_err()
        .to_string()
        .contains("missing input \"z\""));
    assert!(cat(&[], 0).ty().is_err());
}

#[test]
fn scalars_take_the_tensor_dtype() {
    let cx = Context::new();
    let x = cx.tensor(&[0.04f32, 0.05, 0.06], &[3]);
    // 0.05 becomes the f32 nearest 0.05, so the middle element compares equal.
    let want = vec![false, true, true];
    assert_eq!(x.ge(0.05).to_vec::<bool>().unwrap(), want);
    assert_eq!(x.ge(0.05f32).to_vec::<bool>().unwrap(), want);
    assert_eq!(x.ge(cx.scalar(0.05f32)).to_vec::<bool>().unwrap(), want);
    let h = x.cast(DType::F16);
    assert_eq!(h.ge(0.05).to_vec::<bool>().unwrap(), want);
    let i = cx.tensor(&[1i64, 5, 9], &[3]);
    assert_eq!(i.lt(5).to_vec::<bool>().unwrap(), vec![true, false, false]);
    assert_eq!(
        i.eq(5i64).to_vec::<bool>().unwrap(),
        vec![false, true, false]
    );
    assert_eq!(i.ne(9.0).to_vec::<bool>().unwrap(), vec![true, true, false]);
    assert_eq!(i.maximum(4).to_vec::<i64>().unwrap(), vec![4, 5, 9]);
    assert_eq!((&i * 2i32 + 1.0).to_vec::<i64>().unwrap(), vec![3, 11, 19]);
    assert_eq!((10 - &i).to_vec::<i64>().unwrap(), vec![9, 5, 1]);
    assert_eq!(
        (x.exp() + 1.0f32).log().shape().unwrap(),
        vec![3],
        "a method applies to an operator's result without annotations"
    );
    // Integers and bools take only the scalars they hold exactly: no silent truncation.
    let line = line!() + 1;
    let err = i.lt(0.5).ty().unwrap_err().to_string();
    assert!(err.contains(&format!("tensor_api.rs:{line}:")), "{err}");
    assert!(
        err.ends_with("lt: the scalar 0.5 is not exactly representable as i64"),
        "{err}"
    );
    let bytes = cx.tensor(&[1u8], &[1]);
    assert!((&bytes + 300)
        .ty()
        .unwrap_err()
        .to_string()
        .ends_with("add: the scalar 300 is not exactly representable as u8"));
    assert!(i
        .cast(DType::I32)
        .add(i64::MAX)
        .ty()
        .unwrap_err()
        .to_string()
        .contains("not exactly representable as i32"));
    let flags = cx.tensor(&[true, false], &[2]);
    assert_eq!(
        flags.eq(1).to_vec::<bool>().unwrap(),
        vec![true, false],
        "1 is true"
    );
    assert!(flags.eq(2).ty().is_err());
    // where_ takes a scalar on either side, in the other's dtype.
    let y = where_(&i.gt(4), &i, -1);
    assert_eq!(y.to_vec::<i64>().unwrap(), vec![-1, 5, 9]);
    let y = where_(&x.gt(0.05), 1.0, &x);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.04, 0.05, 1.0]);
    assert!(where_(&flags, 1.0, 2.0)
        .ty()
        .unwrap_err()
        .to_string()
        .ends_with("where: a and b are both scalars; one must be a tensor to give the dtype"));
}

#[test]
fn axis_errors_name_the_operation() {
    let cx = Context::new();
    let x = cx.ones(DType::F32, &[2, 3]);
    let i = cx.tensor(&[0i64], &[1, 1]);
    let cases = [
        (x.softmax(5), "softmax: axis 5 is out of range for rank 2"),
        (
            x.log_softmax(-3),
            "log_softmax: axis -3 is out of range for rank 2",
        ),
        (x.sum(&[2], false), "sum: axis 2 is out of range for rank 2"),
        (x.mean(&[0, 0], true), "mean: axes [0, 0] repeat an axis"),
        (
            x.argmax(7, false),
            "argmax: axis 7 is out of range for rank 2",
        ),
        (x.squeeze(4), "squeeze: axis 4 is out of range for rank 2"),
        (
            x.unsqueeze(4),
            "unsqueeze: axis 4 is out of range for rank 3",
        ),
        (
            x.transpose(0, 2),
            "transpose: axis 2 is out of range for rank 2",
        ),
        (
            x.permute(&[0, 9]),
            "permute: axis 9 is out of range for rank 2",
        ),
        (x.flip(&[3]), "flip: axis 3 is out of range for rank 2"),
        (
            x.slice(2, 0, 1, 1),
            "slice: axis 2 is out of range for rank 2",
        ),
        (
            x.narrow(-4, 0, 1),
            "narrow: axis -4 is out of range for rank 2",
        ),
        (x.gather(2, &i), "gather: axis 2 is out of range for rank 2"),
        (
            x.sort(2, false).0,
            "sort: axis 2 is out of range for rank 2",
        ),
        (
            x.topk(1, 2, true).1,
            "topk: axis 2 is out of range for rank 2",
        ),
        (cat(&[&x, &x], 2), "cat: axis 2 is out of range for rank 2"),
        (
            cx.ones(DType::F32, &[]).layer_norm(&x, &x, 1e-5),
            "layer_norm: axis -1 is out of range for rank 0",
        ),
    ];
    for (k, (tensor, want)) in cases.iter().enumerate() {
        let err = tensor.ty().unwrap_err().to_string();
        assert!(err.ends_with(want), "case {k}: {err}");
    }
}

#[test]
fn evaluation_errors_name_the_caller() {
    let cx = Context::new();
    let z = cx.input("z", DType::F32, &[1]).exp();
    let line = line!() + 1;
    let err = z.to_vec::<f32>().unwrap_err();
    assert!(matches!(err, kfuse::Error::Evaluate { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(&format!("tensor_api.rs:{line}:")), "{text}");
    assert!(text.contains("missing input \"z\""), "{text}");
    let ones = cx.ones(DType::F32, &[1]);
    let line = line!() + 1;
    let err = ones.to_vec::<i64>().unwrap_err().to_string();
    assert!(err.contains(&format!("tensor_api.rs:{line}:")), "{err}");
    assert!(err.ends_with("to_vec: the tensor is f32, not i64"), "{err}");
    let line = line!() + 1;
    let err = z.to_array().unwrap_err().to_string();
    assert!(err.contains(&format!("tensor_api.rs:{line}:")), "{err}");
}
