//! `Context::grad`: gradients as tensors of the same context.

use kfuse::{Array, Context, DType};

#[test]
fn grad_of_a_small_regression_loss() {
    let cx = Context::new();
    let x = cx.input("x", DType::F64, &[4, 3]);
    let w = cx.input("w", DType::F64, &[3, 2]);
    let b = cx.input("b", DType::F64, &[2]);
    let y = x.matmul(&w).add(&b);
    let loss = y.mul(&y).sum_all();
    let grads = cx.grad(&loss, &[&w, &b]).unwrap();
    let xs: Vec<f64> = (0..12).map(|i| i as f64 * 0.1 - 0.5).collect();
    let ws: Vec<f64> = (0..6).map(|i| 0.3 - i as f64 * 0.2).collect();
    let bs = vec![0.25f64, -0.5];
    let inputs = vec![
        ("x", Array::from_vec(vec![4, 3], xs.clone()).unwrap()),
        ("w", Array::from_vec(vec![3, 2], ws.clone()).unwrap()),
        ("b", Array::from_vec(vec![2], bs.clone()).unwrap()),
    ];
    let out = cx
        .run_reference(&[("gw", &grads[0]), ("gb", &grads[1])], inputs)
        .unwrap();
    // d/dW sum((xW + b)^2) = 2 x^T (xW + b); d/db = 2 sum_rows (xW + b).
    let mut residual = [[0.0f64; 2]; 4];
    for (r, row) in residual.iter_mut().enumerate() {
        for (c, v) in row.iter_mut().enumerate() {
            *v = bs[c] + (0..3).map(|k| xs[r * 3 + k] * ws[k * 2 + c]).sum::<f64>();
        }
    }
    for (kc, exact) in (0..6).map(|i| out[0].get_f64(i)).enumerate() {
        let (k, c) = (kc / 2, kc % 2);
        let want: f64 = residual
            .iter()
            .enumerate()
            .map(|(r, row)| 2.0 * xs[r * 3 + k] * row[c])
            .sum();
        assert!((exact - want).abs() < 1e-12);
    }
    for (c, exact) in (0..2).map(|i| out[1].get_f64(i)).enumerate() {
        let want: f64 = residual.iter().map(|row| 2.0 * row[c]).sum();
        assert!((exact - want).abs() < 1e-12);
    }
}

#[test]
fn grad_of_a_non_scalar_is_an_error_at_the_call() {
    let cx = Context::new();
    let x = cx.input("x", DType::F64, &[3]);
    let y = x.exp();
    let error = cx.grad(&y, &[&x]).unwrap_err().to_string();
    assert!(
        error.contains("tensor_grad.rs") && error.contains("scalar"),
        "{error}"
    );
}

#[test]
fn compiled_gradients_match_the_reference_interpreter() {
    // An MLP with log-softmax cross-entropy, plus movement ops, so that the backward half
    // exercises slices with steps, pads, flips, broadcasts, selects and reductions.
    let cx = Context::new();
    let x = cx.input("x", DType::F32, &[6, 8]);
    let w1 = cx.input("w1", DType::F32, &[8, 16]);
    let b1 = cx.input("b1", DType::F32, &[16]);
    let w2 = cx.input("w2", DType::F32, &[8, 5]);
    let labels = cx.input("labels", DType::F32, &[6, 5]);
    let h = x.matmul(&w1).add(&b1).relu();
    let h = h.slice(1, 0, 16, 2).flip(&[0]);
    let h = h.pad(&[(0, 0), (1, 1)], kfuse::PadMode::Constant, 0.0);
    let h = h.slice(1, 1, 9, 1).tanh();
    let logits = h.matmul(&w2);
    let picked = logits.log_softmax(-1).mul(&labels);
    let loss = -&picked.sum_all();
    let grads = cx.grad(&loss, &[&w1, &b1, &w2]).unwrap();
    let fill = |n: usize, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 37 % 23) as f32 / 23.0 - 0.5) * scale)
            .collect()
    };
    let mut one_hot = vec![0.0f32; 30];
    for row in 0..6 {
        one_hot[row * 5 + row % 5] = 1.0;
    }
    let inputs = || {
        vec![
            ("x", Array::from_vec(vec![6, 8], fill(48, 2.0)).unwrap()),
            ("w1", Array::from_vec(vec![8, 16], fill(128, 1.0)).unwrap()),
            ("b1", Array::from_vec(vec![16], fill(16, 0.5)).unwrap()),
            ("w2", Array::from_vec(vec![8, 5], fill(40, 1.0)).unwrap()),
            (
                "labels",
                Array::from_vec(vec![6, 5], one_hot.clone()).unwrap(),
            ),
        ]
    };
    let outputs = [("gw1", &grads[0]), ("gb1", &grads[1]), ("gw2", &grads[2])];
    let compiled = cx.run(&outputs, inputs()).unwrap();
    let reference = cx.run_reference(&outputs, inputs()).unwrap();
    for (got, want) in compiled.iter().zip(&reference) {
        assert_eq!(got.shape(), want.shape());
        let mut nonzero = 0;
        for i in 0..want.n_elems() {
            let (g, w) = (got.get_f64(i), want.get_f64(i));
            assert!(
                (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                "element {i}: {g} vs {w}"
            );
            nonzero += usize::from(w != 0.0);
        }
        assert!(nonzero > 0);
    }
}
