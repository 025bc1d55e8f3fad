//! W6a's fused depthwise-separable block alone (8×64×112×112 → 128, f32 NCHW, 3×3 depthwise
//! with padding 1, then 1×1), run by `conv::separable` on the kernel pool: the median of
//! `RUNS` (default 41) runs and the fastest, in ms, and the median's GFLOP/s.
//!
//! `cargo run --release -p kfuse-routines --example separable_cost`
//!
//! `N`, `C`, `CO` and `HW` set the batch, the channels in and out, and the image's side;
//! `RUNS` the timed runs.

use kfuse_ir::{Conv2dAttrs, Layout, Storage};
use kfuse_routines::conv::{separable, Epilogue, View};
use std::time::Instant;

#[path = "common/values.rs"]
mod values;

#[path = "common/line_aligned.rs"]
mod line_aligned;

#[path = "common/settings.rs"]
mod settings;
use settings::setting;

fn main() {
    let (n, c, co, hw) = (
        setting("N", 8),
        setting("C", 64),
        setting("CO", 128),
        setting("HW", 112),
    );
    let runs = setting("RUNS", 41);
    let x = values::activations(n * c * hw * hw);
    let wd = values::weights(c * 9);
    let wp = values::weights(co * c);
    let _constant = kfuse_routines::constants::register([&wd, &wp]);
    let depthwise = Conv2dAttrs {
        layout: Layout::Nchw,
        stride: [1, 1],
        padding: [1; 4],
        dilation: [1, 1],
        groups: c,
    };
    let (xd, wdd, md, wpd, yd) = (
        [n, c, hw, hw],
        [c, 1, 3, 3],
        [n, c, hw, hw],
        [co, c, 1, 1],
        [n, co, hw, hw],
    );
    let mut y = Storage::F32(vec![0.0; n * co * hw * hw]);
    let none = Epilogue::default();
    let view = |storage, dims| View { storage, dims };
    let mut times: Vec<f64> = (0..runs + 1)
        .map(|_| {
            let t = Instant::now();
            separable(
                view(&x, &xd),
                view(&wd, &wdd),
                &depthwise,
                &md,
                &none,
                view(&wp, &wpd),
                &yd,
                &mut y,
                &none,
            )
            .unwrap();
            t.elapsed().as_secs_f64() * 1e3
        })
        .skip(1)
        .collect();
    times.sort_by(f64::total_cmp);
    let ms = times[runs / 2];
    let flops = 2.0 * (n * hw * hw) as f64 * (c * 9 + c * co) as f64;
    println!(
        "separable {n}x{c}x{hw}x{hw} -> {co}: median {ms:.3} ms (min {:.3}), {:.0} GFLOP/s",
        times[0],
        flops / ms / 1e6
    );
}
