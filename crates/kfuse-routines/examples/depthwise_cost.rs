//! The depthwise half of W6a on one image (64 channels of 112×112, 3×3, padding 1, f32 NCHW),
//! run by `conv::conv2d` directly on one thread, 2000 times: the in-place kernel's time per
//! 16 outputs with its input and output in cache (3.2 MB each, in L3), without the memory
//! traffic of the whole batch. Run with `KFUSE_THREADS=1`:
//!
//! `KFUSE_THREADS=1 cargo run --release -p kfuse-routines --example depthwise_cost`
//!
//! `C`, `HW` and `N` set the channels, the image's side and the batch (MobileNetV2's last
//! stage: `C=960 HW=7`).

use kfuse_ir::{Conv2dAttrs, Layout, Storage};
use kfuse_routines::conv::{conv2d, Epilogue, View};
use std::time::Instant;

#[path = "common/values.rs"]
mod values;

#[path = "common/line_aligned.rs"]
mod line_aligned;

#[path = "common/settings.rs"]
mod settings;
use settings::setting;

fn main() {
    let (c, hw, n) = (setting("C", 64), setting("HW", 112), setting("N", 1));
    let x = values::activations(n * c * hw * hw);
    let w = values::weights(c * 9);
    let attrs = Conv2dAttrs {
        layout: Layout::Nchw,
        stride: [1, 1],
        padding: [1; 4],
        dilation: [1, 1],
        groups: c,
    };
    let d = [n, c, hw, hw];
    let mut y = Storage::F32(vec![0.0; n * c * hw * hw]);
    let mut run = || {
        let x = View {
            storage: &x,
            dims: &d,
        };
        let w = View {
            storage: &w,
            dims: &[c, 1, 3, 3],
        };
        conv2d(x, w, &attrs, &d, &mut y, &Epilogue::default()).unwrap();
    };
    run();
    let mut times = vec![];
    for _ in 0..20 {
        let t = Instant::now();
        for _ in 0..100 {
            run();
        }
        times.push(t.elapsed().as_secs_f64() / 100.0);
    }
    times.sort_by(f64::total_cmp);
    let outputs = (n * c * hw * hw) as f64;
    println!(
        "depthwise {n}x{c}x{hw}x{hw}, 3x3: median {:.1} us per call, {:.2} ns per 16 outputs",
        times[10] * 1e6,
        times[10] * 1e9 * 16.0 / outputs
    );
}
