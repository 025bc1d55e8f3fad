//! A convolution with bias and ReLU, then a max pool: ResNet's stem by default (8×3×224×224,
//! 7×7 at stride 2 to 64 channels, then 3×3 at stride 2), run pooled in one pass
//! (`conv::conv2d_pooled`) and as the two ops one after the other (`conv::conv2d`, then
//! `pooling::pool2d`), alternating in one process: the median time of each over 21 rounds,
//! the median of the rounds' ratios, and the largest difference between the two results.
//!
//! `cargo run --release -p kfuse-routines --example pooled_cost`
//!
//! `SHAPE="n,c,co,hw,k,s,pool_k,pool_s"` sets another convolution (padding `k / 2`) and pool
//! (padding `pool_k / 2` for odd windows, 0 for even ones): VGG's `8,64,64,224,3,1,2,2`.
//! `ROUNDS=` sets the rounds; `ONLY_FUSED=1` runs the one-pass form alone (under a profiler).

use kfuse_ir::{Conv2dAttrs, Layout, Pool2dAttrs, PoolKind, Storage};
use kfuse_routines::conv::{conv2d, conv2d_pooled, Epilogue, View};
use kfuse_routines::epilogue::Activation;
use std::time::Instant;

#[path = "common/values.rs"]
mod values;

#[path = "common/line_aligned.rs"]
mod line_aligned;

fn main() {
    let shape: Vec<usize> = std::env::var("SHAPE")
        .unwrap_or("8,3,64,224,7,2,3,2".into())
        .split(',')
        .map(|d| {
            d.trim()
                .parse()
                .expect("SHAPE: n,c,co,hw,k,s,pool_k,pool_s")
        })
        .collect();
    let [n, c, co, hw, k, s, pk, ps] = shape[..] else {
        panic!("SHAPE: n,c,co,hw,k,s,pool_k,pool_s")
    };
    let o = (hw + 2 * (k / 2) - k) / s + 1;
    let pp = if pk % 2 == 1 { pk / 2 } else { 0 };
    let po = (o + 2 * pp - pk) / ps + 1;
    let x = values::activations(n * c * hw * hw);
    let w = values::weights(co * c * k * k);
    let bias = Storage::F32((0..co).map(|i| (i % 5) as f32 * 0.01 - 0.02).collect());
    // Registered as the runner registers a program's weights.
    let _constant = kfuse_routines::constants::register([&w]);
    let attrs = Conv2dAttrs {
        layout: Layout::Nchw,
        stride: [s, s],
        padding: [k / 2; 4],
        dilation: [1, 1],
        groups: 1,
    };
    let pool = Pool2dAttrs {
        kind: PoolKind::Max,
        layout: Layout::Nchw,
        window: [pk, pk],
        stride: [ps, ps],
        padding: [pp; 4],
        dilation: [1, 1],
        count_include_pad: false,
    };
    let epilogue = Epilogue {
        bias: Some(&bias),
        activation: Some(Activation::Relu),
        ..Epilogue::default()
    };
    let (xd, wd, cd, pd) = (
        [n, c, hw, hw],
        [co, c, k, k],
        [n, co, o, o],
        [n, co, po, po],
    );
    let (xv, wv) = (
        View {
            storage: &x,
            dims: &xd,
        },
        View {
            storage: &w,
            dims: &wd,
        },
    );
    let mut conv = Storage::F32(vec![0.0; n * co * o * o]);
    let mut unfused = Storage::F32(vec![0.0; n * co * po * po]);
    let mut fused = Storage::F32(vec![0.0; n * co * po * po]);
    let (mut one_pass, mut two_ops, mut ratios) = (vec![], vec![], vec![]);
    let only_fused = std::env::var_os("ONLY_FUSED").is_some();
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(22)
        .max(2);
    for round in 0..rounds {
        let t = Instant::now();
        conv2d_pooled(xv, wv, &attrs, &cd, &epilogue, &pool, &pd, &mut fused).unwrap();
        let a = t.elapsed().as_secs_f64() * 1e3;
        if only_fused {
            if round > 0 {
                one_pass.push(a);
            }
            continue;
        }
        let t = Instant::now();
        conv2d(xv, wv, &attrs, &cd, &mut conv, &epilogue).unwrap();
        let cv = View {
            storage: &conv,
            dims: &cd,
        };
        kfuse_routines::pooling::pool2d(cv, &pool, &pd, &mut unfused).unwrap();
        let b = t.elapsed().as_secs_f64() * 1e3;
        // The first round faults the buffers in.
        if round > 0 {
            one_pass.push(a);
            two_ops.push(b);
            ratios.push(b / a);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    if only_fused {
        println!("pooled in one pass: {:.3} ms", median(&mut one_pass));
        return;
    }
    let diff = match (&fused, &unfused) {
        (Storage::F32(a), Storage::F32(b)) => a
            .iter()
            .zip(b)
            .map(|(p, q)| (p - q).abs())
            .fold(0.0f32, f32::max),
        _ => unreachable!(),
    };
    println!(
        "{n}x{c}x{hw}x{hw} -> {co}, {k}x{k} stride {s}, then {pk}x{pk} max pool stride {ps}: \
         pooled in one pass {:.3} ms, conv then pool {:.3} ms, paired ratio {:.3}; largest \
         difference {diff:e}",
        median(&mut one_pass),
        median(&mut two_ops),
        median(&mut ratios)
    );
}
