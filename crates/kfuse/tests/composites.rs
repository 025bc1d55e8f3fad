//! The composite building blocks of the Tensor API (stack, split, one_hot, tril/triu, cumsum,
//! isnan/isinf, silu, leaky_relu, batch_norm, einsum, conv_transpose2d) against hand-computed
//! and numpy-style values, on edge shapes (size 0 and 1) and edge values, on the reference
//! interpreter and compiled.

use kfuse::{einsum, stack, Array, Context, ConvTranspose2dAttrs, DType, Layout, Tensor};

/// The tensor's values on the reference interpreter and compiled (default options), which
/// must agree exactly: these programs are integer or exactly representable.
fn both<T: kfuse::Element + PartialEq + std::fmt::Debug>(t: &Tensor) -> Vec<T> {
    let reference = t.to_vec::<T>().unwrap();
    let no_inputs = std::iter::empty::<(&str, Array)>();
    let compiled = t.context().run(&[("out", t)], no_inputs).unwrap();
    assert_eq!(
        compiled[0].as_slice::<T>().unwrap(),
        &reference[..],
        "compiled"
    );
    reference
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

fn error_of(t: &Tensor) -> String {
    t.ty().unwrap_err().to_string()
}

#[test]
fn stack_joins_along_a_new_axis() {
    let cx = Context::new();
    let a = cx.tensor(&[1i32, 2], &[2]);
    let b = cx.tensor(&[3i32, 4], &[2]);
    let rows = stack(&[&a, &b], 0);
    assert_eq!(rows.shape().unwrap(), vec![2, 2]);
    assert_eq!(both::<i32>(&rows), vec![1, 2, 3, 4]);
    assert_eq!(both::<i32>(&stack(&[&a, &b], -1)), vec![1, 3, 2, 4]);
    assert_eq!(stack(&[&a], 0).shape().unwrap(), vec![1, 2]);
    let empty = cx.zeros(DType::F32, &[0]);
    assert_eq!(
        stack(&[&empty, &empty, &empty], 0).shape().unwrap(),
        vec![3, 0]
    );
    let scalar = cx.scalar(5i64);
    assert_eq!(both::<i64>(&stack(&[&scalar, &scalar], 0)), vec![5, 5]);
    let c = cx.tensor(&[1i32, 2, 3], &[3]);
    assert!(error_of(&stack(&[&a, &c], 0)).ends_with("stack: tensor 1 has shape [3], tensor 0 [2]"));
    assert!(error_of(&stack(&[&a, &b], 3)).ends_with("stack: axis 3 is out of range for rank 2"));
    assert!(error_of(&stack(&[], 0)).ends_with("stack: no tensors given"));
}

#[test]
fn split_cuts_consecutive_pieces() {
    let cx = Context::new();
    let x = cx.arange(7, DType::I64);
    let parts = x.split(&[3, 4], 0);
    assert_eq!(both::<i64>(&parts[0]), vec![0, 1, 2]);
    assert_eq!(both::<i64>(&parts[1]), vec![3, 4, 5, 6]);
    let m = cx.arange(6, DType::I32).reshape(&[2, 3]);
    let columns = m.split(&[1, 0, 2], -1);
    assert_eq!(columns.len(), 3);
    assert_eq!(both::<i32>(&columns[0]), vec![0, 3]);
    assert_eq!(columns[1].shape().unwrap(), vec![2, 0]);
    assert_eq!(both::<i32>(&columns[2]), vec![1, 2, 4, 5]);
    let empty = cx.zeros(DType::F32, &[0, 2]);
    assert_eq!(empty.split(&[0, 0], 0).len(), 2);
    assert!(empty.split(&[], 0).is_empty());
    let bad = x.split(&[3, 3], 0);
    assert_eq!(bad.len(), 2);
    for piece in &bad {
        assert!(error_of(piece).ends_with("split: sizes [3, 3] do not add up to axis 0's length 7"));
    }
    assert!(error_of(&x.split(&[7], 1)[0]).ends_with("split: axis 1 is out of range for rank 1"));
}

#[test]
fn one_hot_marks_each_index_and_zeroes_the_rest() {
    let cx = Context::new();
    let labels = cx.tensor(&[2i64, 0, -1, 3, 1], &[5]);
    let hot = labels.one_hot(3, DType::F32);
    assert_eq!(hot.shape().unwrap(), vec![5, 3]);
    #[rustfmt::skip]
    let want = vec![
        0.0, 0.0, 1.0,
        1.0, 0.0, 0.0,
        0.0, 0.0, 0.0, // -1: outside 0..3, a row of zeros
        0.0, 0.0, 0.0, // 3: likewise
        0.0, 1.0, 0.0,
    ];
    assert_eq!(both::<f32>(&hot), want);
    let grid = cx.tensor(&[1i32, 0, 0, 1], &[2, 2]).one_hot(2, DType::Bool);
    assert_eq!(grid.shape().unwrap(), vec![2, 2, 2]);
    assert_eq!(
        both::<bool>(&grid),
        vec![false, true, true, false, true, false, false, true]
    );
    let bytes = cx.tensor(&[200u8], &[1]).one_hot(300, DType::I64);
    assert_eq!(
        both::<i64>(&bytes)[200],
        1,
        "u8 indices compare without wrapping"
    );
    assert_eq!(labels.one_hot(0, DType::F32).shape().unwrap(), vec![5, 0]);
    let none = cx.zeros(DType::I64, &[0]).one_hot(4, DType::I32);
    assert_eq!(none.shape().unwrap(), vec![0, 4]);
    assert_eq!(
        both::<i32>(&cx.tensor(&[0i64], &[1]).one_hot(1, DType::I32)),
        vec![1]
    );
    let floats = cx.tensor(&[1.0f32], &[1]);
    assert!(error_of(&floats.one_hot(2, DType::F32))
        .ends_with("one_hot: the indices must be integers, found f32"));
}

#[test]
fn tril_and_triu_keep_triangles() {
    let cx = Context::new();
    let x = cx.arange(12, DType::I32).reshape(&[3, 4]) + 1;
    #[rustfmt::skip]
    let cases: [(isize, Vec<i32>, Vec<i32>); 4] = [
        (0,
         vec![1, 0, 0, 0, 5, 6, 0, 0, 9, 10, 11, 0],
         vec![1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12]),
        (1,
         vec![1, 2, 0, 0, 5, 6, 7, 0, 9, 10, 11, 12],
         vec![0, 2, 3, 4, 0, 0, 7, 8, 0, 0, 0, 12]),
        (-1,
         vec![0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0],
         vec![1, 2, 3, 4, 5, 6, 7, 8, 0, 10, 11, 12]),
        (5,
         (1..=12).collect(),
         vec![0; 12]),
    ];
    for (k, lower, upper) in cases {
        assert_eq!(both::<i32>(&x.tril(k)), lower, "tril({k})");
        assert_eq!(both::<i32>(&x.triu(k)), upper, "triu({k})");
    }
    // The mask selects, so NaN and infinities outside the triangle become 0.
    let special = cx.tensor(&[1.0f32, f32::NAN, f32::INFINITY, 2.0], &[2, 2]);
    assert_eq!(
        bits(&both::<f32>(&special.tril(0))),
        bits(&[1.0, 0.0, f32::INFINITY, 2.0])
    );
    let batch = cx.ones(DType::I64, &[2, 2, 2]);
    assert_eq!(both::<i64>(&batch.triu(0)), vec![1, 1, 0, 1, 1, 1, 0, 1]);
    assert_eq!(both::<i32>(&cx.tensor(&[7i32], &[1, 1]).tril(-1)), vec![0]);
    assert_eq!(
        cx.zeros(DType::F32, &[0, 3]).triu(0).shape().unwrap(),
        vec![0, 3]
    );
    let vector = cx.ones(DType::F32, &[3]);
    assert!(error_of(&vector.tril(0)).ends_with("tril: expects at least 2 axes, found rank 1"));
}

#[test]
fn cumsum_adds_prefixes() {
    let cx = Context::new();
    assert_eq!(
        both::<i32>(&cx.tensor(&[1i32, 2, 3, 4, 5], &[5]).cumsum(0)),
        vec![1, 3, 6, 10, 15]
    );
    let m = cx.arange(6, DType::F64).reshape(&[2, 3]);
    assert_eq!(
        both::<f64>(&m.cumsum(1)),
        vec![0.0, 1.0, 3.0, 3.0, 7.0, 12.0]
    );
    assert_eq!(
        both::<f64>(&m.cumsum(-2)),
        vec![0.0, 1.0, 2.0, 3.0, 5.0, 7.0]
    );
    // Lengths around powers of two, checked against a running sum (exact in integers).
    for n in [1usize, 2, 3, 7, 8, 9, 1000] {
        let data: Vec<i64> = (0..n as i64).map(|i| (i * 37) % 11 - 5).collect();
        let want: Vec<i64> = data
            .iter()
            .scan(0, |sum, v| {
                *sum += v;
                Some(*sum)
            })
            .collect();
        let x = cx.tensor(&data, &[1, n]);
        assert_eq!(both::<i64>(&x.cumsum(1)), want, "n = {n}");
    }
    assert_eq!(
        cx.zeros(DType::F32, &[0]).cumsum(0).shape().unwrap(),
        vec![0]
    );
    assert_eq!(
        cx.zeros(DType::F32, &[2, 0]).cumsum(1).shape().unwrap(),
        vec![2, 0]
    );
    // Only the elements of each prefix reach it: an infinity or NaN leaves earlier sums alone.
    let special = cx.tensor(&[1.0f32, f32::INFINITY, 2.0, f32::NEG_INFINITY, 1.0], &[5]);
    let got = special.cumsum(0).to_vec::<f32>().unwrap();
    assert_eq!(&got[..3], &[1.0, f32::INFINITY, f32::INFINITY]);
    assert!(got[3].is_nan() && got[4].is_nan(), "{got:?}");
    let nan = cx.tensor(&[1.0f32, 2.0, f32::NAN, 3.0], &[4]);
    let got = nan.cumsum(0).to_vec::<f32>().unwrap();
    assert_eq!(&got[..2], &[1.0, 3.0]);
    assert!(got[2].is_nan() && got[3].is_nan());
    // -0 is the identity shifted in, so negative zeros stay negative.
    let zeros = cx.tensor(&[-0.0f32, -0.0, 0.0], &[3]).cumsum(0);
    assert_eq!(
        bits(&zeros.to_vec::<f32>().unwrap()),
        bits(&[-0.0, -0.0, 0.0])
    );
    assert!(error_of(&cx.ones(DType::Bool, &[2]).cumsum(0))
        .ends_with("cumsum: expects a numeric dtype, found bool"));
    assert!(error_of(&m.cumsum(2)).ends_with("cumsum: axis 2 is out of range for rank 2"));
}

#[test]
fn cumsum_compiles_on_long_rows() {
    let cx = Context::new();
    let x = cx.input("x", DType::I64, &[3, 5000]);
    let f = cx.compile(&[("sums", &x.cumsum(-1))]).unwrap();
    let data: Vec<i64> = (0..15_000).map(|i| (i * 7919) % 1001 - 500).collect();
    let out = f
        .run([("x", Array::from_vec(vec![3, 5000], data.clone()).unwrap())])
        .unwrap();
    let got = out[0].as_slice::<i64>().unwrap();
    for row in 0..3 {
        let mut sum = 0;
        for col in 0..5000 {
            sum += data[row * 5000 + col];
            assert_eq!(got[row * 5000 + col], sum, "[{row}, {col}]");
        }
    }
}

#[test]
fn isnan_and_isinf_classify_values() {
    let cx = Context::new();
    let values = [
        1.0f64,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.0,
        f64::MAX,
        5e-324,
    ];
    let x = cx.tensor(&values, &[7]);
    assert_eq!(
        both::<bool>(&x.isnan()),
        vec![false, true, false, false, false, false, false]
    );
    assert_eq!(
        both::<bool>(&x.isinf()),
        vec![false, false, true, true, false, false, false]
    );
    let half = x.cast(DType::F32).isinf();
    assert!(both::<bool>(&half)[5], "f64::MAX rounds to inf in f32");
    let ints = cx.tensor(&[i32::MIN, 0, i32::MAX], &[3]);
    assert_eq!(both::<bool>(&ints.isnan()), vec![false; 3]);
    assert_eq!(both::<bool>(&ints.isinf()), vec![false; 3]);
    assert_eq!(
        cx.zeros(DType::F32, &[0, 2]).isnan().shape().unwrap(),
        vec![0, 2]
    );
}

#[test]
fn activations_match_their_definitions() {
    let cx = Context::new();
    let x = cx.tensor(&[-3.0f64, -0.5, 0.0, 2.0], &[4]);
    let silu = x.silu().to_vec::<f64>().unwrap();
    for (got, v) in silu.iter().zip([-3.0f64, -0.5, 0.0, 2.0]) {
        assert!(
            (got - v / (1.0 + (-v).exp())).abs() < 1e-15,
            "silu({v}) = {got}"
        );
    }
    let y = cx.tensor(
        &[-2.0f32, -0.0, 0.0, 3.0, f32::NAN, f32::NEG_INFINITY],
        &[6],
    );
    let leaky = y.leaky_relu(0.125).to_vec::<f32>().unwrap();
    assert_eq!(bits(&leaky[..4]), bits(&[-0.25, -0.0, 0.0, 3.0]));
    assert!(leaky[4].is_nan());
    assert_eq!(leaky[5], f32::NEG_INFINITY);
}

#[test]
fn batch_norm_normalizes_each_channel() {
    let cx = Context::new();
    // [N=1, C=2, H=1, W=2]
    let x = cx.tensor(&[1.0f32, 3.0, 10.0, 20.0], &[1, 2, 1, 2]);
    let mean = cx.tensor(&[2.0f32, 10.0], &[2]);
    let var = cx.tensor(&[1.0f32, 100.0], &[2]);
    let gamma = cx.tensor(&[2.0f32, -1.0], &[2]);
    let beta = cx.tensor(&[0.5f32, 0.0], &[2]);
    let y = x.batch_norm(&mean, &var, Some(&gamma), Some(&beta), 0.0);
    assert_eq!(both::<f32>(&y), vec![-1.5, 2.5, -0.0, -1.0]);
    let plain = x.batch_norm(&mean, &var, None, None, 0.0);
    assert_eq!(both::<f32>(&plain), vec![-1.0, 1.0, 0.0, 1.0]);
    // [N, C] features; eps is added to the variance.
    let features = cx.tensor(&[4.0f64, 1.0], &[1, 2]);
    let ones = cx.ones(DType::F64, &[2]);
    let zeros = cx.zeros(DType::F64, &[2]);
    let y = features.batch_norm(&zeros, &zeros, None, None, 4.0);
    assert_eq!(both::<f64>(&y), vec![2.0, 0.5]);
    let y = features.batch_norm(&ones, &ones, None, None, 0.0);
    assert_eq!(both::<f64>(&y), vec![3.0, 0.0]);
    assert!(
        error_of(&features.batch_norm(&cx.ones(DType::F64, &[3]), &ones, None, None, 0.0))
            .ends_with("batch_norm: mean has shape [3], expected [2] (one per channel)")
    );
    assert!(error_of(&ones.batch_norm(&ones, &ones, None, None, 0.0))
        .ends_with("batch_norm: expects at least 2 axes ([N, C, ...]), found rank 1"));
}

/// A batchnorm after a convolution with constant weights folds into it: one kernel.
#[test]
fn batch_norm_after_a_convolution_folds_into_it() {
    let cx = Context::new();
    let x = cx.input("x", DType::F32, &[1, 3, 8, 8]);
    let w = cx.from_vec((0..27).map(|i| i as f32 / 27.0).collect(), &[1, 3, 3, 3]);
    let stat = |v: f32| cx.tensor(&[v], &[1]);
    let (mean, var, gamma, beta) = (stat(0.5), stat(4.0), stat(3.0), stat(-1.0));
    let y = x
        .conv2d(&w, kfuse::Conv2dAttrs::default())
        .batch_norm(&mean, &var, Some(&gamma), Some(&beta), 0.0)
        .relu();
    let f = cx.compile(&[("y", &y)]).unwrap();
    assert_eq!(f.kernel_count(), 1, "{}", f.explain());
    assert!(f.explain().contains("fold-affine"), "{}", f.explain());
    let data: Vec<f32> = (0..192)
        .map(|i| ((i * 13) % 17) as f32 / 8.0 - 1.0)
        .collect();
    let inputs = [("x", Array::from_vec(vec![1, 3, 8, 8], data).unwrap())];
    let got = f.run(&inputs).unwrap();
    let want = cx.run_reference(&[("y", &y)], &inputs).unwrap();
    let (got, want) = (
        got[0].as_slice::<f32>().unwrap(),
        want[0].as_slice::<f32>().unwrap(),
    );
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{g} vs {w}");
    }
}

#[test]
fn einsum_covers_the_common_contractions() {
    let cx = Context::new();
    let a = cx.tensor(&[1i64, 2, 3, 4, 5, 6], &[2, 3]);
    let b = cx.tensor(&[1i64, 0, -1, 2, 3, 1], &[3, 2]);
    let v = cx.tensor(&[1i64, 2, 3], &[3]);
    let sq = cx.tensor(&[1i64, 2, 3, 4], &[2, 2]);
    // (equation, operands, result shape, result values)
    type Case<'a> = (&'a str, Vec<&'a Tensor>, Vec<usize>, Vec<i64>);
    let cases: Vec<Case> = vec![
        ("ij,jk->ik", vec![&a, &b], vec![2, 2], vec![8, 7, 17, 16]),
        ("ij,jk", vec![&a, &b], vec![2, 2], vec![8, 7, 17, 16]),
        ("ij,jk->ki", vec![&a, &b], vec![2, 2], vec![8, 17, 7, 16]),
        ("ij->ji", vec![&a], vec![3, 2], vec![1, 4, 2, 5, 3, 6]),
        ("ba", vec![&a], vec![3, 2], vec![1, 4, 2, 5, 3, 6]),
        ("ij->", vec![&a], vec![], vec![21]),
        ("ij->i", vec![&a], vec![2], vec![6, 15]),
        ("ij->j", vec![&a], vec![3], vec![5, 7, 9]),
        ("ii->", vec![&sq], vec![], vec![5]),
        ("ii->i", vec![&sq], vec![2], vec![1, 4]),
        ("i,i->", vec![&v, &v], vec![], vec![14]),
        (
            "i,j->ij",
            vec![&v, &v],
            vec![3, 3],
            vec![1, 2, 3, 2, 4, 6, 3, 6, 9],
        ),
        ("ij,j->i", vec![&a, &v], vec![2], vec![14, 32]),
        ("ij,k->i", vec![&a, &v], vec![2], vec![36, 90]),
        (
            "ij,ij->ij",
            vec![&a, &a],
            vec![2, 3],
            vec![1, 4, 9, 16, 25, 36],
        ),
        (
            "ij,jk,kl->il",
            vec![&a, &b, &sq],
            vec![2, 2],
            vec![29, 44, 65, 98],
        ),
    ];
    for (equation, operands, shape, want) in cases {
        let got = einsum(equation, &operands);
        assert_eq!(got.shape().unwrap(), shape, "{equation}");
        assert_eq!(both::<i64>(&got), want, "{equation}");
    }
}

#[test]
fn einsum_batched_products_match_matmul() {
    let cx = Context::new();
    let q = cx.arange(2 * 3 * 4 * 5, DType::I64).reshape(&[2, 3, 4, 5]) % 7 - 3;
    let k = cx.arange(2 * 3 * 6 * 5, DType::I64).reshape(&[2, 3, 6, 5]) % 5 - 2;
    let scores = einsum("bhqd,bhkd->bhqk", &[&q, &k]);
    let want = q.matmul(&k.transpose(-1, -2));
    assert_eq!(scores.shape().unwrap(), vec![2, 3, 4, 6]);
    assert_eq!(both::<i64>(&scores), want.to_vec::<i64>().unwrap());
    let batched = einsum(
        "bij,bjk->bik",
        &[&q.reshape(&[6, 4, 5]), &k.reshape(&[6, 6, 5]).t()],
    );
    assert_eq!(both::<i64>(&batched), want.to_vec::<i64>().unwrap());
    // Size 0 along the contracted axis: sums of nothing.
    let empty_a = cx.zeros(DType::F32, &[2, 0]);
    let empty_b = cx.zeros(DType::F32, &[0, 3]);
    let zeros = einsum("ij,jk->ik", &[&empty_a, &empty_b]);
    assert_eq!(both::<f32>(&zeros), vec![0.0; 6]);
    // Size 1 everywhere.
    let one = cx.tensor(&[3i64], &[1, 1]);
    assert_eq!(both::<i64>(&einsum("ij,jk->ik", &[&one, &one])), vec![9]);
}

#[test]
fn einsum_errors_name_the_equation() {
    let cx = Context::new();
    let a = cx.ones(DType::F32, &[2, 3]);
    let b = cx.ones(DType::F32, &[4, 2]);
    let cases: Vec<(&str, Vec<&Tensor>, &str)> = vec![
        (
            "...ij->ij",
            vec![&a],
            "'...' (broadcast axes) is not supported",
        ),
        (
            "ijk->i",
            vec![&a],
            "operand 0 has rank 2 but is given 3 letter(s)",
        ),
        (
            "ij,jk->ik",
            vec![&a, &b],
            "'j' is 3 long in one place and 4 in operand 1",
        ),
        ("ij,jk->ik", vec![&a], "names 2 operand(s), 1 given"),
        ("ij->l", vec![&a], "the output's 'l' names no axis"),
    ];
    for (equation, operands, want) in cases {
        let err = error_of(&einsum(equation, &operands));
        assert!(
            err.contains("einsum: ") && err.contains(want),
            "{equation}: {err}"
        );
    }
    assert!(error_of(&einsum("i", &[])).ends_with("einsum: no operands given"));
}

/// Transposed convolution by its definition: each input element scatters the weights times
/// itself into the output. NCHW data, `[C_in, C_out / groups, KH, KW]` weights.
fn conv_transpose_reference(
    x: &[f64],
    x_dims: [usize; 4],
    w: &[f64],
    w_dims: [usize; 4],
    attrs: &ConvTranspose2dAttrs,
) -> (Vec<usize>, Vec<f64>) {
    let [n, c_in, h, wid] = x_dims;
    let [_, per_out, kh, kw] = w_dims;
    let per_in = c_in / attrs.groups;
    let out_size = |i: usize, len: usize, k: usize| {
        (len - 1) * attrs.stride[i] + attrs.dilation[i] * (k - 1) + attrs.output_padding[i] + 1
            - 2 * attrs.padding[i]
    };
    let (oh, ow) = (out_size(0, h, kh), out_size(1, wid, kw));
    let c_out = per_out * attrs.groups;
    let mut out = vec![0.0; n * c_out * oh * ow];
    for b in 0..n {
        for ci in 0..c_in {
            let g = ci / per_in;
            for co in 0..per_out {
                for y in 0..h {
                    for xx in 0..wid {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let oy = (y * attrs.stride[0] + ky * attrs.dilation[0]) as isize
                                    - attrs.padding[0] as isize;
                                let ox = (xx * attrs.stride[1] + kx * attrs.dilation[1]) as isize
                                    - attrs.padding[1] as isize;
                                if oy < 0 || ox < 0 || oy >= oh as isize || ox >= ow as isize {
                                    continue;
                                }
                                let o = ((b * c_out + g * per_out + co) * oh + oy as usize) * ow
                                    + ox as usize;
                                out[o] += x[((b * c_in + ci) * h + y) * wid + xx]
                                    * w[((ci * per_out + co) * kh + ky) * kw + kx];
                            }
                        }
                    }
                }
            }
        }
    }
    (vec![n, c_out, oh, ow], out)
}

#[test]
fn conv_transpose2d_scatters_its_weights() {
    let cx = Context::new();
    let x = cx.tensor(&[1.0f32, 2.0, 3.0, 4.0], &[1, 1, 2, 2]);
    let w = cx.ones(DType::F32, &[1, 1, 2, 2]);
    let y = x.conv_transpose2d(&w, &ConvTranspose2dAttrs::default());
    assert_eq!(y.shape().unwrap(), vec![1, 1, 3, 3]);
    assert_eq!(
        both::<f32>(&y),
        vec![1.0, 3.0, 2.0, 4.0, 10.0, 6.0, 3.0, 7.0, 4.0]
    );
    // Every combination below against the scatter definition, in both layouts. The values are
    // small integers, so every sum is exact.
    let configs = [
        // (x dims, C_out per group, kernel, stride, padding, output padding, dilation, groups)
        ([1, 1, 1, 1], 1, [1, 1], [1, 1], [0, 0], [0, 0], [1, 1], 1),
        ([2, 2, 3, 4], 3, [3, 2], [2, 3], [1, 0], [1, 2], [1, 1], 1),
        ([1, 4, 3, 3], 1, [3, 3], [1, 1], [2, 1], [0, 0], [2, 1], 2),
        ([1, 2, 4, 2], 2, [2, 3], [3, 1], [1, 2], [2, 0], [1, 2], 2),
        ([1, 3, 2, 2], 2, [4, 4], [2, 2], [3, 2], [1, 0], [1, 1], 3),
        // Padding beyond the kernel's reach crops the spread input, on one side or both.
        ([1, 1, 3, 3], 2, [1, 2], [2, 2], [1, 1], [1, 0], [1, 1], 1),
        ([1, 1, 4, 3], 1, [1, 1], [3, 2], [1, 1], [0, 0], [1, 1], 1),
    ];
    for (k, (x_dims, per_out, kernel, stride, padding, output_padding, dilation, groups)) in
        configs.into_iter().enumerate()
    {
        let attrs = ConvTranspose2dAttrs {
            layout: Layout::Nchw,
            stride,
            padding,
            output_padding,
            dilation,
            groups,
        };
        let w_dims = [x_dims[1], per_out, kernel[0], kernel[1]];
        let x_data: Vec<f64> = (0..x_dims.iter().product::<usize>())
            .map(|i| ((i * 7 + k) % 9) as f64 - 4.0)
            .collect();
        let w_data: Vec<f64> = (0..w_dims.iter().product::<usize>())
            .map(|i| ((i * 5 + 2 * k) % 7) as f64 - 3.0)
            .collect();
        let (shape, want) = conv_transpose_reference(&x_data, x_dims, &w_data, w_dims, &attrs);
        let x = cx.from_vec(x_data, &x_dims);
        let w = cx.from_vec(w_data, &w_dims);
        let y = x.conv_transpose2d(&w, &attrs);
        assert_eq!(y.shape().unwrap(), shape, "config {k}");
        assert_eq!(both::<f64>(&y), want, "config {k}, NCHW");
        let nhwc = ConvTranspose2dAttrs {
            layout: Layout::Nhwc,
            ..attrs
        };
        let y = x
            .permute(&[0, 2, 3, 1])
            .conv_transpose2d(&w, &nhwc)
            .permute(&[0, 3, 1, 2]);
        assert_eq!(both::<f64>(&y), want, "config {k}, NHWC");
    }
}

#[test]
fn conv_transpose2d_rejects_what_it_cannot_express() {
    let cx = Context::new();
    let x = cx.ones(DType::F32, &[1, 2, 3, 3]);
    let w = cx.ones(DType::F32, &[2, 1, 3, 3]);
    let with = |attrs: ConvTranspose2dAttrs, w: &Tensor| error_of(&x.conv_transpose2d(w, &attrs));
    let cases = [
        (
            with(
                ConvTranspose2dAttrs {
                    output_padding: [1, 0],
                    ..Default::default()
                },
                &w,
            ),
            "output_padding [1, 0] must be below the stride or the dilation",
        ),
        (
            with(
                ConvTranspose2dAttrs {
                    groups: 3,
                    ..Default::default()
                },
                &w,
            ),
            "2 input channels do not split into 3 groups",
        ),
        (
            with(Default::default(), &cx.ones(DType::F32, &[3, 1, 3, 3])),
            "the weight [3, 1, 3, 3] is [C_in, C_out / groups, KH, KW] with C_in = 2",
        ),
        (
            with(
                ConvTranspose2dAttrs {
                    padding: [3, 0],
                    ..Default::default()
                },
                &w,
            ),
            "the output would have -1 rows or columns along axis 2",
        ),
        (
            with(
                ConvTranspose2dAttrs {
                    stride: [0, 1],
                    ..Default::default()
                },
                &w,
            ),
            "must be at least 1",
        ),
        (
            error_of(
                &cx.ones(DType::F32, &[2, 3])
                    .conv_transpose2d(&w, &Default::default()),
            ),
            "expects a rank-4 input and weight",
        ),
        (
            error_of(
                &cx.ones(DType::F32, &[1, 2, 0, 3])
                    .conv_transpose2d(&w, &Default::default()),
            ),
            "spatial axes of size 0 are not supported",
        ),
    ];
    for (err, want) in cases {
        assert!(
            err.contains("conv_transpose2d: ") && err.contains(want),
            "{err}"
        );
    }
    // Batches of size 0 are fine.
    let none = cx
        .ones(DType::F32, &[0, 2, 3, 3])
        .conv_transpose2d(&w, &Default::default());
    assert_eq!(none.shape().unwrap(), vec![0, 1, 5, 5]);
}
