//! W7's convolution (8×64×56×56, 3×3, padding 1, f32 NCHW) run by `conv::conv2d` directly, bare
//! and with a per-channel bias and ReLU in its epilogue, on the same input, alternating, 40
//! times each: what the fused epilogue costs, outside the runtime and its per-case inputs.
//!
//! `cargo run --release -p kfuse-routines --example conv_epilogue_cost`

use kfuse_ir::{Conv2dAttrs, Layout, Storage};
use kfuse_routines::conv::{conv2d, Epilogue, View};
use kfuse_routines::epilogue::Activation;
use std::time::Instant;

#[path = "common/values.rs"]
mod values;
fn main() {
    let (n, c, hw) = (8usize, 64usize, 56usize);
    let x = values::activations(n * c * hw * hw);
    let w = values::weights(c * c * 9);
    let b = Storage::F32((0..c).map(|i| i as f32 * 0.01 - 0.3).collect());
    let attrs = Conv2dAttrs {
        layout: Layout::Nchw,
        stride: [1, 1],
        padding: [1; 4],
        dilation: [1, 1],
        groups: 1,
    };
    let d = [n, c, hw, hw];
    let mut y1 = Storage::F32(vec![0.0; n * c * hw * hw]);
    let mut y2 = Storage::F32(vec![0.0; n * c * hw * hw]);
    let ep = Epilogue {
        bias: Some(&b),
        scale: None,
        residual: None,
        activation: Some(Activation::Relu),
    };
    let run = |y: &mut Storage, epilogue: &Epilogue| {
        let t = Instant::now();
        let (x, w) = (
            View {
                storage: &x,
                dims: &d,
            },
            View {
                storage: &w,
                dims: &[c, c, 3, 3],
            },
        );
        conv2d(x, w, &attrs, &d, y, epilogue).unwrap();
        t.elapsed().as_secs_f64() * 1e3
    };
    let (mut t1, mut t2) = (vec![], vec![]);
    for _ in 0..40 {
        t1.push(run(&mut y1, &Epilogue::default()));
        t2.push(run(&mut y2, &ep));
    }
    t1.sort_by(f64::total_cmp);
    t2.sort_by(f64::total_cmp);
    println!(
        "bare {:.3} / {:.3}, bias+relu {:.3} / {:.3} (min / median), ratio {:.3}",
        t1[0],
        t1[20],
        t2[0],
        t2[20],
        t2[20] / t1[20]
    );
}
