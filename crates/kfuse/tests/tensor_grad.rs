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
    for k in 0..3 {
        for c in 0..2 {
            let want: f64 = (0..4).map(|r| 2.0 * xs[r * 3 + k] * residual[r][c]).sum();
            assert!((out[0].get_f64(k * 2 + c) - want).abs() < 1e-12);
        }
    }
    for c in 0..2 {
        let want: f64 = (0..4).map(|r| 2.0 * residual[r][c]).sum();
        assert!((out[1].get_f64(c) - want).abs() < 1e-12);
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
