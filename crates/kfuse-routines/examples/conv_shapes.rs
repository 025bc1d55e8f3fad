//! `conv::conv2d` alone on ResNet- and MobileNet-style shapes (f32 NCHW, batch 8 unless noted,
//! no epilogue, weights registered as constants), with the routine each runs on: the median of
//! 20 runs, in ms and GFLOP/s.
//!
//! `cargo run --release -p kfuse-routines --example conv_shapes`
//!
//! `SHAPES="8,256,64,56,1,1;8,64,256,56,1,1"` (batch, channels in, out, image side, kernel
//! side, stride; shapes separated by `;`) measures those shapes instead; `EPI=1` adds a bias
//! and ReLU to each convolution, `EPI=2` a bias, a residual and ReLU; `COLD=1` writes 256 MB
//! before each run, so that every operand comes from memory, and `COLD=2` then reads the
//! activations (input, residual, output) back, so that only the weights come from memory, as
//! inside a network.

use kfuse_ir::{Conv2dAttrs, DType, Layout, Storage};
use kfuse_routines::conv::{conv2d, routine, Epilogue, View};
use std::time::Instant;

#[path = "common/values.rs"]
mod values;

#[path = "common/line_aligned.rs"]
mod line_aligned;

fn main() {
    // (n, c_in, c_out, h = w, k, stride)
    let shapes = [
        (8, 64, 64, 56, 3, 1),
        (8, 64, 128, 112, 3, 1),
        (8, 64, 128, 56, 3, 2),
        (8, 128, 256, 28, 3, 2),
        (8, 256, 256, 14, 3, 2),
        (8, 32, 32, 112, 3, 2),
        (8, 16, 16, 56, 5, 2),
        (8, 3, 64, 224, 7, 2),
        (1, 64, 128, 56, 3, 2),
        (8, 64, 128, 56, 1, 2),
        (8, 64, 64, 14, 3, 1),
        (8, 512, 512, 14, 3, 2),
        (8, 1024, 2048, 14, 1, 2),
    ];
    let chosen: Vec<(usize, usize, usize, usize, usize, usize)> = match std::env::var("SHAPES") {
        Ok(list) => list
            .split(';')
            .map(|shape| {
                let v: Vec<usize> = shape
                    .split(',')
                    .map(|d| d.trim().parse().expect("SHAPES: n,c,co,hw,k,s;..."))
                    .collect();
                assert!(v.len() == 6, "SHAPES: n,c,co,hw,k,s;...");
                (v[0], v[1], v[2], v[3], v[4], v[5])
            })
            .collect(),
        Err(_) => shapes.to_vec(),
    };
    let cold_mode: usize = std::env::var("COLD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let cold = cold_mode > 0;
    let mut flush = vec![0.0f32; if cold { 64 << 20 } else { 0 }];
    for (n, c, co, hw, k, s) in chosen {
        let p = k / 2;
        let o = (hw + 2 * p - k) / s + 1;
        let x = values::activations(n * c * hw * hw);
        let w = values::weights(co * c * k * k);
        let attrs = Conv2dAttrs {
            layout: Layout::Nchw,
            stride: [s, s],
            padding: [p; 4],
            dilation: [1, 1],
            groups: 1,
        };
        // Registered as constant, as the runner registers a program's weights: the direct
        // kernels keep their packed copy from call to call.
        let _constant = kfuse_routines::constants::register([&w]);
        let (xd, wd, yd) = ([n, c, hw, hw], [co, c, k, k], [n, co, o, o]);
        let mut y = Storage::F32(vec![0.0; n * co * o * o]);
        let epi_kind: usize = std::env::var("EPI")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let bias = Storage::F32((0..co).map(|i| (i % 5) as f32 * 0.01).collect());
        let residual = Storage::F32(
            (0..n * co * o * o)
                .map(|i| (i % 11) as f32 * 0.01)
                .collect(),
        );
        let epilogue = Epilogue {
            bias: (epi_kind > 0).then_some(&bias),
            residual: (epi_kind > 1).then_some(&residual),
            activation: (epi_kind > 0).then_some(kfuse_routines::epilogue::Activation::Relu),
            ..Epilogue::default()
        };
        let mut times: Vec<f64> = (0..21)
            .map(|_| {
                if cold {
                    // Every operand out of cache, as inside a network whose weights and
                    // activations pass through memory between layers.
                    flush.iter_mut().for_each(|v| *v += 1.0);
                    std::hint::black_box(&flush);
                    if cold_mode == 2 {
                        // The activations back in cache: only the weights come from memory.
                        let touch = |s: &Storage| match s {
                            Storage::F32(v) => v.iter().sum::<f32>(),
                            _ => 0.0,
                        };
                        std::hint::black_box(touch(&x) + touch(&residual) + touch(&y));
                    }
                }
                let t = Instant::now();
                let (x, w) = (
                    View {
                        storage: &x,
                        dims: &xd,
                    },
                    View {
                        storage: &w,
                        dims: &wd,
                    },
                );
                conv2d(x, w, &attrs, &yd, &mut y, &epilogue).unwrap();
                t.elapsed().as_secs_f64() * 1e3
            })
            .skip(1)
            .collect();
        times.sort_by(f64::total_cmp);
        let ms = times[10];
        let flops = 2.0 * (n * co * o * o * c * k * k) as f64;
        println!(
            "{n}x{c}x{hw}x{hw} -> {co}, {k}x{k} stride {s}: {ms:.3} ms, {:.0} GFLOP/s ({})",
            flops / ms / 1e6,
            routine(&xd, &wd, &attrs, &yd, DType::F32)
        );
    }
}
