//! Max and average pooling of ResNet's stem output (8×64×112×112, 3×3 windows, stride 2,
//! padding 1), run by `pooling::pool2d` directly: the median and minimum of 20 calls each.
//!
//! `cargo run --release -p kfuse-routines --example pool_cost`
//!
//! `N`, `C`, `HW` set the input, `K`, `S`, `P` the window, stride and padding, and `NHWC=1`
//! the layout.

use kfuse_ir::{Layout, Pool2dAttrs, PoolKind, Storage};
use kfuse_routines::conv::View;
use std::time::Instant;

#[path = "common/values.rs"]
mod values;

fn main() {
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (n, c, hw) = (env("N", 8), env("C", 64), env("HW", 112));
    let (k, s, p) = (env("K", 3), env("S", 2), env("P", 1));
    let nhwc = env("NHWC", 0) == 1;
    let out = (hw + 2 * p - k) / s + 1;
    let x = values::activations(n * c * hw * hw);
    let (x_dims, y_dims) = if nhwc {
        ([n, hw, hw, c], [n, out, out, c])
    } else {
        ([n, c, hw, hw], [n, c, out, out])
    };
    for kind in [PoolKind::Max, PoolKind::Avg] {
        let attrs = Pool2dAttrs {
            kind,
            layout: if nhwc { Layout::Nhwc } else { Layout::Nchw },
            window: [k, k],
            stride: [s, s],
            padding: [p; 4],
            dilation: [1, 1],
            count_include_pad: false,
        };
        let mut y = Storage::F32(vec![0.0; n * c * out * out]);
        let mut times = vec![];
        for _ in 0..20 {
            let start = Instant::now();
            let x = View {
                storage: &x,
                dims: &x_dims,
            };
            kfuse_routines::pooling::pool2d(x, &attrs, &y_dims, &mut y).unwrap();
            times.push(start.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        println!(
            "{kind:?} pool {}: median {:.3} ms, min {:.3} ms",
            if nhwc { "NHWC" } else { "NCHW" },
            times[times.len() / 2],
            times[0]
        );
    }
}
