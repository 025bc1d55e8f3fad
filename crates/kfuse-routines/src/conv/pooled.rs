//! A convolution and the pooling of its result in one pass: ResNet's stem (a 7×7 convolution at
//! stride 2 with its folded batchnorm's bias and a ReLU, then a 3×3 max pool at stride 2).
//!
//! Where the convolution runs on the direct kernel's phase planes (strided f32 NCHW on
//! AVX-512 onto rows of 28 or more), each task takes a band of pooled rows of one image: the
//! kernel computes the convolution rows their windows read into its stage, in cache, with the
//! epilogue, and the task pools them from there into the output. The convolution's output,
//! four times the pooled one at stride 2, is never stored. Bands recompute the convolution rows
//! their windows share with the band before (one row in 29 for the stem's bands of 14 pooled
//! rows).
//!
//! Elsewhere the convolution runs whole and the pooling after it, as two ops. Running the other
//! routines band by band on a copy of each band's input (so that the pooling read a cache-sized
//! tile) measured no faster than the two ops: the banded convolution lost what the pooling
//! saved (see `docs/structured-ops.md`).

use kfuse_ir::{Conv2dAttrs, DType, Layout, Pool2dAttrs, PoolKind, Storage};

use super::direct;
use super::route::{self, Isa};
use super::{output, Geometry, Post};
use crate::dense::{Out, Real, View};
use crate::epilogue::{epilogue, Epilogue};

/// `pool(conv(x, w) with epilogue)` into `out` (`out_dims`), the convolution's result having
/// `conv_dims`: in one pass where [`pools_in_one_pass`], else as the two ops. f32 and f64; the
/// epilogue takes no residual, and both ops share a layout.
#[allow(clippy::too_many_arguments)]
pub fn conv2d_pooled(
    x: View,
    w: View,
    attrs: &Conv2dAttrs,
    conv_dims: &[usize],
    epilogue: &Epilogue,
    pool: &Pool2dAttrs,
    out_dims: &[usize],
    out: &mut Storage,
) -> Result<(), String> {
    if epilogue.residual.is_some() {
        return Err("a pooled convolution takes no residual".into());
    }
    if pool.layout != attrs.layout {
        return Err(format!(
            "a pooled convolution keeps its layout: {:?}, then a {:?} pooling",
            attrs.layout, pool.layout
        ));
    }
    let dtype = x.storage.dtype();
    if pools_in_one_pass(x.dims, w.dims, attrs, conv_dims, dtype, pool) {
        if let (Some(xs), Some(ws)) = (f32::slice(x.storage), f32::slice(w.storage)) {
            let g = Geometry::new(x.dims, w.dims, attrs, conv_dims);
            let pooled = pooled_dims(g.y, pool);
            if pooled
                .map(|[ph, pw]| vec![g.y[0], g.y[1], ph, pw])
                .as_deref()
                != Some(out_dims)
            {
                return Err(format!(
                    "the pooling of a {conv_dims:?} convolution does not give {out_dims:?}"
                ));
            }
            let y = output::<f32>(out, out_dims)?;
            let post = Post::<f32>::new(epilogue, g.y[1], 0)?;
            if !y.is_empty() {
                one_pass(&g, xs, ws, post, pool, y);
            }
            return Ok(());
        }
    }
    if !matches!(dtype, DType::F32 | DType::F64) {
        return Err(format!(
            "a pooled convolution runs in f32 and f64, not {dtype}"
        ));
    }
    let mut conv = Storage::zeros(dtype, conv_dims.iter().product());
    super::conv2d(x, w, attrs, conv_dims, &mut conv, epilogue)?;
    let conv = View {
        storage: &conv,
        dims: conv_dims,
    };
    crate::pooling::pool2d(conv, pool, out_dims, out)
}

/// In words, what [`conv2d_pooled`] runs for these operands, for `kfuse explain`.
pub fn pooled_routine(
    x: &[usize],
    w: &[usize],
    attrs: &Conv2dAttrs,
    conv_dims: &[usize],
    dtype: DType,
    pool: &Pool2dAttrs,
) -> String {
    let conv = super::routine(x, w, attrs, conv_dims, dtype);
    if pools_in_one_pass(x, w, attrs, conv_dims, dtype, pool) {
        format!("{conv}, each band's rows pooled from the kernel's stage in cache (the convolution's output is never stored)")
    } else {
        format!("{conv}, then the pooling over its stored output (this routine has no stage to pool from in one pass)")
    }
}

/// Whether [`conv2d_pooled`] pools this convolution's result from its stage, in one pass: f32
/// NCHW on the direct kernel's phase planes, and a pooling whose every window reads a row of
/// the convolution's output.
pub fn pools_in_one_pass(
    x: &[usize],
    w: &[usize],
    attrs: &Conv2dAttrs,
    conv_dims: &[usize],
    dtype: DType,
    pool: &Pool2dAttrs,
) -> bool {
    if x.len() != 4 || w.len() != 4 || conv_dims.len() != 4 {
        return false;
    }
    let g = Geometry::new(x, w, attrs, conv_dims);
    let Some([pooled_rows, _]) = pooled_dims(g.y, pool) else {
        return false;
    };
    dtype == DType::F32
        && attrs.layout == Layout::Nchw
        && pool.layout == Layout::Nchw
        && g.y.iter().all(|&d| d > 0)
        && route::pools_from_stage(route::decide(&g, dtype, Isa::host()).route)
        && every_window_reads(
            pooled_rows,
            (
                pool.window[0],
                pool.stride[0],
                pool.dilation[0],
                pool.padding[0],
            ),
            g.y[2],
        )
}

/// The pooled rows and columns of an NCHW convolution output `y`, where there are some.
fn pooled_dims(y: [usize; 4], pool: &Pool2dAttrs) -> Option<[usize; 2]> {
    let along = |axis: usize| {
        let size = y[2 + axis] + pool.padding[2 * axis] + pool.padding[2 * axis + 1];
        let reach = (pool.window[axis].checked_sub(1)?) * pool.dilation[axis] + 1;
        let steps = size.checked_sub(reach)?;
        (pool.stride[axis] > 0).then(|| steps / pool.stride[axis] + 1)
    };
    Some([along(0)?, along(1)?])
}

/// The rows `[lo, hi)` of an axis of `size` that output rows `rows` read through windows of
/// `window` taps `dilation` apart, `stride` apart, the first one `pad` before the axis: those
/// inside it.
fn rows_read(
    rows: &std::ops::Range<usize>,
    (window, stride, dilation, pad): (usize, usize, usize, usize),
    size: usize,
) -> (usize, usize) {
    let lo = (rows.start * stride).saturating_sub(pad).min(size);
    let reach = (rows.end - 1) * stride + (window - 1) * dilation + 1;
    let hi = reach.saturating_sub(pad).min(size);
    (lo, hi.max(lo))
}

/// Whether every one of `out` output rows along this axis reads a row inside it (on one of
/// its window's taps), so that every band has convolution rows to pool.
fn every_window_reads(
    out: usize,
    (window, stride, dilation, pad): (usize, usize, usize, usize),
    size: usize,
) -> bool {
    (0..out).all(|r| {
        let (lo, hi) = rows_read(&(r..r + 1), (window, stride, dilation, pad), size);
        (lo..hi).any(|i| (i + pad - r * stride).is_multiple_of(dilation))
    })
}

/// The convolution `g` of `xs` by `ws` with `post`, pooled as `pool` says into `y`, band by
/// band from the direct kernel's stage.
fn one_pass(
    g: &Geometry,
    xs: &[f32],
    ws: &[f32],
    post: Post<f32>,
    pool: &Pool2dAttrs,
    y: &mut [f32],
) {
    let [n_images, c_out, ch, cw] = g.y;
    let [ph, pw] = pooled_dims(g.y, pool).expect("checked by the caller");
    let pool_axis = (
        pool.window[0],
        pool.stride[0],
        pool.dilation[0],
        pool.padding[0],
    );
    // Pooled rows per band: those whose convolution rows make a band of the size the kernel
    // picks for the convolution alone, the bands of equal height.
    let conv_rows = super::band_rows(n_images, ch, direct::phase_row_bytes(g));
    let rows = (conv_rows / pool.stride[0]).clamp(1, ph);
    let rows = ph.div_ceil(ph.div_ceil(rows));
    let bands = ph.div_ceil(rows);
    let pooled_band = |t: usize| {
        let b = t % bands;
        b * rows..((b + 1) * rows).min(ph)
    };
    let task = |t: usize| {
        let (lo, hi) = rows_read(&pooled_band(t), pool_axis, ch);
        (t / bands, lo..hi)
    };
    let (in_registers, rest) = direct::split(post, false);
    let og = g.out_channels_per_group();
    let grid_pw = direct::phase_grid_width(g);
    let out = Out(y.as_mut_ptr());
    let sink = |t: usize,
                n: usize,
                conv_band: &std::ops::Range<usize>,
                group: usize,
                stage: &[f32],
                q_blocks: usize| {
        let band = pooled_band(t);
        // The band's pooling: its windows over the band's convolution rows, the top padding
        // what remains of the image's above them.
        let band_pool = Pool2dAttrs {
            padding: [
                pool.padding[0] + conv_band.start - band.start * pool.stride[0],
                0,
                pool.padding[2],
                pool.padding[3],
            ],
            ..pool.clone()
        };
        let rows_in = conv_band.len();
        for co in 0..og {
            let channel = group * og + co;
            let at = co * q_blocks;
            let src = &stage[at..at + (rows_in - 1) * grid_pw + cw];
            let first = ((n * c_out + channel) * ph + band.start) * pw;
            // SAFETY: rows `band` of this channel of image n are this task's alone.
            let dst =
                unsafe { std::slice::from_raw_parts_mut(out.ptr().add(first), band.len() * pw) };
            if rest.is_empty() && pool.kind == PoolKind::Max && crate::dense::has_avx512() {
                #[cfg(target_arch = "x86_64")]
                if crate::pooling::max_plane_strided(
                    &band_pool,
                    [rows_in, cw],
                    src,
                    grid_pw,
                    [band.len(), pw],
                    dst,
                ) {
                    continue;
                }
            }
            // The rest of the epilogue (an activation without a form in registers), an
            // average, or a plane with a NaN (whose pooling keeps the reference's NaN): on a
            // dense copy of the channel's rows.
            DENSE.with(|dense| {
                let mut dense = dense.borrow_mut();
                dense.clear();
                for r in 0..rows_in {
                    dense.extend_from_slice(&src[r * grid_pw..][..cw]);
                }
                if !rest.is_empty() {
                    epilogue(&mut dense, rest.channel(channel, 0, rows_in * cw));
                }
                crate::pooling::pool_plane(
                    &band_pool,
                    [rows_in, cw],
                    &dense,
                    [band.len(), pw],
                    dst,
                );
            });
        }
    };
    direct::phase_planes(g, xs, ws, in_registers, n_images * bands, &task, &sink);
}

thread_local! {
    /// Each thread's dense copy of a channel's rows of the stage, where the pooling needs one.
    static DENSE: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}
