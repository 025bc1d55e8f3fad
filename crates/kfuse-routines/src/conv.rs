//! Convolutions for fast numerics, on the routine the route table (`conv/route.rs`) picks as a
//! pure function of shape, dtype and machine: the direct depthwise kernel (`conv/depthwise.rs`),
//! 1×1 convolutions on the direct microkernel or as GEMMs on the activations in place,
//! Winograd F(2×2, 3×3) (`conv/winograd.rs`), the direct implicit-GEMM microkernel for f32
//! NCHW on AVX-512 (`conv/direct.rs`), one GEMM per tap for other stride-1 convolutions
//! (`conv/shifted.rs`), and im2col tiles fed to a GEMM for everything else.
//!
//! The fused depthwise-separable block produces its depthwise output tile by tile into a buffer
//! that stays in cache, and the pointwise product consumes it there; it is never written whole
//! to memory. An epilogue (per-channel bias, residual, activation) is applied to each output
//! tile while it is hot.
//!
//! Work is split over (image, band of output rows) tasks on the kernel pool. Each task works on
//! a band sized to keep its tiles within L2.
//! Like [`crate::matmul`], sums are blocked and use FMA, so results are not bit-identical to
//! the reference interpreter: strict numerics keep the reference convolution.

use kfuse_ir::{Conv2dAttrs, DType, Layout, Storage};

pub use crate::dense::View;
use crate::dense::{widen_half, widen_half_into, with_scratch, Out, Real};
pub use crate::epilogue::Epilogue;
use crate::epilogue::{epilogue, epilogue_operand, Activation, RowBias, Tail, Widened};
use crate::gemm::{gemm_into, Init};

use crate::gemm::avx512::{self as sgemm, Strided};
use crate::Pool;

mod depthwise;
mod direct;
mod pooled;
mod route;
mod shifted;
mod winograd;

pub use pooled::{conv2d_pooled, pooled_routine, pools_in_one_pass};
pub use route::{Decision, Direct, Isa, Plan, Pointwise, Route};

/// Bytes of the per-task tile (im2col columns or depthwise output) aimed for: the size of one
/// core's L2 on the machine kfuse is measured on (1 MiB measured faster than 256 KiB for W6b
/// and W7).
const TILE_BYTES: usize = 1024 << 10;

/// Whether the fast convolutions handle this dtype.
pub fn supported(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F64)
}

/// Whether [`conv2d`] (a convolution alone, not a separable block) handles this dtype: f32
/// and f64, and f16 and bf16 through f32 (each step rounded as the IR rounds it).
pub fn computes(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
}

/// Activation dims as `[n, c, h, w]` whatever the layout.
fn dims(shape: &[usize], layout: Layout) -> [usize; 4] {
    match layout {
        Layout::Nchw => [shape[0], shape[1], shape[2], shape[3]],
        Layout::Nhwc => [shape[0], shape[3], shape[1], shape[2]],
    }
}

/// A convolution's epilogue with its operands typed: a per-channel bias, a residual of the
/// output's shape, an activation, applied in that order.
#[derive(Clone, Copy)]
struct Post<'a, T> {
    bias: Option<&'a [T]>,
    residual: Option<&'a [T]>,
    act: Option<Activation>,
}

impl<'a, T: Real> Post<'a, T> {
    /// Checks the epilogue's operands against the output (`channels`, `elems`) and types them.
    fn new(epilogue: &Epilogue<'a>, channels: usize, elems: usize) -> Result<Self, String> {
        if epilogue.scale.is_some() {
            return Err("a scale epilogue is fused only after a matmul".to_string());
        }
        Ok(Post {
            bias: epilogue_operand(epilogue.bias, channels, "bias")?,
            residual: epilogue_operand(epilogue.residual, elems, "residual")?,
            act: epilogue.activation,
        })
    }

    fn is_empty(&self) -> bool {
        self.bias.is_none() && self.residual.is_none() && self.act.is_none()
    }

    /// The empty epilogue.
    fn none() -> Self {
        Post {
            bias: None,
            residual: None,
            act: None,
        }
    }

    /// The tail for `len` values of output channel `channel` that start at output element `at`
    /// (an NCHW run).
    fn channel(&self, channel: usize, at: usize, len: usize) -> Tail<'a, T> {
        Tail {
            bias: self
                .bias
                .map_or(RowBias::None, |b| RowBias::Same(b[channel])),
            scale: RowBias::None,
            residual: self.residual.map(|r| &r[at..][..len]),
            activation: self.act,
        }
    }

    /// The tail for output channels `channels` of one pixel, the first at output element `at`
    /// (an NHWC run).
    fn pixel(&self, channels: std::ops::Range<usize>, at: usize) -> Tail<'a, T> {
        Tail {
            bias: self
                .bias
                .map_or(RowBias::None, |b| RowBias::Each(&b[channels.clone()])),
            scale: RowBias::None,
            residual: self.residual.map(|r| &r[at..][..channels.len()]),
            activation: self.act,
        }
    }
}

/// Calls `task(n, r0..r1)` for bands of output rows of every image, spread over the kernel pool.
/// Bands hold as many rows as keep a tile of `bytes_per_row` bytes per row near [`TILE_BYTES`],
/// and there are enough of them to keep every thread busy.
fn for_each_band(
    images: usize,
    out_rows: usize,
    bytes_per_row: usize,
    task: &(dyn Fn(usize, std::ops::Range<usize>) + Sync),
) {
    for_each_band_fitted(images, out_rows, bytes_per_row, |rows| rows, task)
}

/// The rows of [`for_each_band`]'s bands: as many as keep a tile of `bytes_per_row` bytes per
/// row near [`TILE_BYTES`], few enough to give every thread four bands, all of equal height
/// (the last one as long as the others, so that no thread is left with a long band while the
/// others idle).
fn band_rows(images: usize, out_rows: usize, bytes_per_row: usize) -> usize {
    let by_cache = (TILE_BYTES / bytes_per_row.max(1)).max(1);
    let by_balance = (images * out_rows)
        .div_ceil(4 * Pool::global().threads())
        .max(1);
    let rows = by_cache.min(by_balance).min(out_rows).max(1);
    out_rows.div_ceil(out_rows.div_ceil(rows))
}

/// [`for_each_band`], with the band's row count passed through `fit` (which may lower or raise
/// it; it is then kept within 1 and the image's rows) after the cache and balance limits.
fn for_each_band_fitted(
    images: usize,
    out_rows: usize,
    bytes_per_row: usize,
    fit: impl Fn(usize) -> usize,
    task: &(dyn Fn(usize, std::ops::Range<usize>) + Sync),
) {
    let pool = Pool::global();
    let rows = fit(band_rows(images, out_rows, bytes_per_row)).clamp(1, out_rows.max(1));
    let bands = out_rows.div_ceil(rows);
    pool.run(images * bands, &|t| {
        let (n, band) = (t / bands, t % bands);
        task(n, band * rows..((band + 1) * rows).min(out_rows));
    });
}

/// Grouped, strided, dilated, zero-padded 2-D convolution with an epilogue, for f32 and f64,
/// written into `out` (which has the output's dtype and element count; its contents are
/// overwritten).
pub fn conv2d(
    x: View,
    w: View,
    attrs: &Conv2dAttrs,
    out_dims: &[usize],
    out: &mut Storage,
    epilogue: &Epilogue,
) -> Result<(), String> {
    match x.storage.dtype() {
        DType::F32 => conv2d_typed::<f32>(x, w, attrs, out_dims, out, epilogue),
        DType::F64 => conv2d_typed::<f64>(x, w, attrs, out_dims, out, epilogue),
        DType::F16 | DType::BF16 => conv2d_half(x, w, attrs, out_dims, out, epilogue),
        other => Err(format!(
            "fast conv2d supports f32, f64, f16 and bf16, not {other}"
        )),
    }
}

/// [`conv2d`] of f16 or bf16 operands, as the IR computes it: the operands widened to f32, the
/// product in f32 (in the f32 routine's summation order), each step's result then rounded to
/// the half dtype (the product, the bias, the residual, the activation and a compound
/// activation's inner steps, see [`crate::epilogue::epilogue_rounded`]), and the rounded values
/// written in the half dtype, exactly.
fn conv2d_half(
    x: View,
    w: View,
    attrs: &Conv2dAttrs,
    out_dims: &[usize],
    out: &mut Storage,
    epilogue: &Epilogue,
) -> Result<(), String> {
    let bf16 = x.storage.dtype() == DType::BF16;
    if out.dtype() != x.storage.dtype() {
        return Err("the output dtype differs from the convolution's".into());
    }
    thread_local! {
        /// The widened input and the f32 sum of the last call on this thread: fresh buffers
        /// page-faulted on every run.
        static KEPT: std::cell::RefCell<[Vec<f32>; 2]> = const {
            std::cell::RefCell::new([Vec::new(), Vec::new()])
        };
    }
    let [kept_x, mut kept_sum] = KEPT.with(|k| std::mem::take(&mut *k.borrow_mut()));
    let (wx, ww) = (widen_half_into(x.storage, kept_x)?, widen_half(w.storage)?);
    let wide = Widened::of(epilogue)?;
    let wide = wide.epilogue();
    // Overwritten whole by the convolution.
    kept_sum.resize(out.len(), 0.0);
    let mut sum = Storage::F32(kept_sum);
    conv2d_typed::<f32>(
        View {
            storage: &wx,
            dims: x.dims,
        },
        View {
            storage: &ww,
            dims: w.dims,
        },
        attrs,
        out_dims,
        &mut sum,
        &Epilogue::default(),
    )?;
    let channels = match attrs.layout {
        Layout::Nchw => out_dims[1],
        Layout::Nhwc => out_dims[3],
    };
    let bias = epilogue_operand::<f32>(wide.bias, channels, "bias")?;
    let residual = epilogue_operand::<f32>(wide.residual, out.len(), "residual")?;
    let values = f32::slice_mut(&mut sum).expect("an f32 sum");
    // Runs of one channel (an NCHW plane) or one pixel (NHWC channels).
    let run = match attrs.layout {
        Layout::Nchw => out_dims[2] * out_dims[3],
        Layout::Nhwc => channels,
    };
    if run == 0 {
        return Ok(());
    }
    /// The output, whichever half dtype it holds.
    #[derive(Clone, Copy)]
    enum Half {
        F16(Out<kfuse_ir::f16>),
        Bf16(Out<kfuse_ir::bf16>),
    }
    let src = Out(values.as_mut_ptr());
    let dst = match out {
        Storage::F16(o) => Half::F16(Out(o.as_mut_ptr())),
        Storage::BF16(o) => Half::Bf16(Out(o.as_mut_ptr())),
        _ => unreachable!("the output is the operands' half dtype, checked above"),
    };
    // Tasks of whole runs, each rounding its runs' steps and writing them converted: on the
    // calling thread alone, this pass and the operands' widening left the pool's other thread
    // idle for much of a half-precision block (`docs/structured-ops.md`, "Routines": f16 and
    // bf16 products).
    let runs = values.len() / run;
    let per_task = (1 << 16) / run + 1;
    Pool::global().run(runs.div_ceil(per_task), &|task| {
        let first = task * per_task;
        let count = per_task.min(runs - first);
        // SAFETY: runs first..first + count of the sum and of the output, this task's alone.
        let values =
            unsafe { std::slice::from_raw_parts_mut(src.ptr().add(first * run), count * run) };
        for (k, values) in values.chunks_mut(run).enumerate() {
            let i = first + k;
            let bias = match (bias, attrs.layout) {
                (None, _) => RowBias::None,
                (Some(b), Layout::Nchw) => RowBias::Same(b[i % channels]),
                (Some(b), Layout::Nhwc) => RowBias::Each(b),
            };
            let tail = Tail {
                bias,
                scale: RowBias::None,
                residual: residual.map(|r| &r[i * run..][..run]),
                activation: wide.activation,
            };
            crate::epilogue::epilogue_rounded(values, tail, bf16);
        }
        // SAFETY: as above.
        unsafe {
            match dst {
                Half::F16(o) => crate::simd::f16_from_f32_slice(
                    values,
                    std::slice::from_raw_parts_mut(o.ptr().add(first * run), count * run),
                ),
                Half::Bf16(o) => crate::simd::bf16_from_f32_slice(
                    values,
                    std::slice::from_raw_parts_mut(o.ptr().add(first * run), count * run),
                ),
            }
        }
    });
    if let (Storage::F32(x), Storage::F32(sum)) = (wx, sum) {
        KEPT.with(|k| *k.borrow_mut() = [x, sum]);
    }
    Ok(())
}

/// The typed output slice, checked against the expected element count.
fn output<'a, T: Real>(out: &'a mut Storage, dims: &[usize]) -> Result<&'a mut [T], String> {
    let n: usize = dims.iter().product();
    let slice = T::slice_mut(out).ok_or("the output dtype differs from the convolution's")?;
    if slice.len() != n {
        return Err(format!(
            "the output holds {} elements, not {n}",
            slice.len()
        ));
    }
    Ok(slice)
}

/// The geometry of one convolution.
#[derive(Clone, Copy)]
struct Geometry {
    layout: Layout,
    x: [usize; 4],
    y: [usize; 4],
    kh: usize,
    kw: usize,
    stride: [usize; 2],
    pad: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
}

impl Geometry {
    fn new(x: &[usize], w: &[usize], attrs: &Conv2dAttrs, y: &[usize]) -> Geometry {
        Geometry {
            layout: attrs.layout,
            x: dims(x, attrs.layout),
            y: dims(y, attrs.layout),
            kh: w[2],
            kw: w[3],
            stride: attrs.stride,
            pad: [attrs.padding[0], attrs.padding[2]],
            dilation: attrs.dilation,
            groups: attrs.groups,
        }
    }

    fn in_channels_per_group(&self) -> usize {
        self.x[1] / self.groups
    }

    fn out_channels_per_group(&self) -> usize {
        self.y[1] / self.groups
    }

    /// Whether the convolution is a plain product over channels.
    fn is_pointwise(&self) -> bool {
        self.kh == 1
            && self.kw == 1
            && self.stride == [1, 1]
            && self.pad == [0, 0]
            && self.x[2] == self.y[2]
            && self.x[3] == self.y[3]
    }

    /// Input index along an axis for output position `o` and tap `t`, if inside.
    fn tap(&self, axis: usize, o: usize, t: usize) -> Option<usize> {
        let pos = (o * self.stride[axis] + t * self.dilation[axis]).checked_sub(self.pad[axis])?;
        (pos < self.x[2 + axis]).then_some(pos)
    }

    /// Elements between horizontally adjacent input pixels.
    fn column_stride(&self) -> usize {
        match self.layout {
            Layout::Nchw => 1,
            Layout::Nhwc => self.x[1],
        }
    }

    /// For kernel column `j`: the output columns `lo..hi` whose tap lies inside the input row,
    /// and the input column read by output column `lo`.
    fn valid_columns(&self, j: usize) -> (usize, usize, usize) {
        let (s, pl, shift) = (self.stride[1], self.pad[1], j * self.dilation[1]);
        let lo = pl.saturating_sub(shift).div_ceil(s);
        let hi = (self.x[3] + pl)
            .saturating_sub(shift)
            .div_ceil(s)
            .min(self.y[3]);
        if lo >= hi {
            return (0, 0, 0);
        }
        (lo, hi, lo * s + shift - pl)
    }

    /// Channels `chans` of image `n` of an NCHW depthwise convolution, as a convolution of
    /// their own (one image): its geometry, input, weights and epilogue (the bias sliced;
    /// `post` must have no residual).
    fn depthwise_channels<'a, T: Real>(
        &self,
        n: usize,
        chans: std::ops::Range<usize>,
        xs: &'a [T],
        ws: &'a [T],
        post: Post<'a, T>,
    ) -> (Geometry, &'a [T], &'a [T], Post<'a, T>) {
        debug_assert!(self.layout == Layout::Nchw && post.residual.is_none());
        let (cc, taps, [_, _, h, w]) = (chans.len(), self.kh * self.kw, self.x);
        let sub = Geometry {
            x: [1, cc, h, w],
            y: [1, cc, self.y[2], self.y[3]],
            groups: cc,
            ..*self
        };
        let post = Post {
            bias: post.bias.map(|b| &b[chans.clone()]),
            ..post
        };
        let xs = &xs[self.x_offset(n, chans.start, 0, 0)..][..cc * h * w];
        (sub, xs, &ws[chans.start * taps..][..cc * taps], post)
    }

    /// The input rows `lo..hi`, inside the image, that output rows `band` read.
    fn rows_read(&self, band: &std::ops::Range<usize>) -> (usize, usize) {
        let in_h = self.x[2] as isize;
        let first = (band.start * self.stride[0]) as isize - self.pad[0] as isize;
        let reach = ((band.end - 1) * self.stride[0]) as isize - self.pad[0] as isize
            + ((self.kh - 1) * self.dilation[0] + 1) as isize;
        let lo = first.clamp(0, in_h) as usize;
        (lo, (reach.clamp(0, in_h) as usize).max(lo))
    }

    fn x_offset(&self, n: usize, c: usize, h: usize, w: usize) -> usize {
        let [_, cs, hs, ws] = self.x;
        match self.layout {
            Layout::Nchw => ((n * cs + c) * hs + h) * ws + w,
            Layout::Nhwc => ((n * hs + h) * ws + w) * cs + c,
        }
    }
}

fn conv2d_typed<T: Real>(
    x: View,
    w: View,
    attrs: &Conv2dAttrs,
    out_dims: &[usize],
    out: &mut Storage,
    epilogue: &Epilogue,
) -> Result<(), String> {
    let xs = T::slice(x.storage).ok_or("conv2d input dtype")?;
    let ws = T::slice(w.storage).ok_or("conv2d operands must share a dtype")?;
    let g = Geometry::new(x.dims, w.dims, attrs, out_dims);
    let y = output::<T>(out, out_dims)?;
    let post = Post::<T>::new(epilogue, g.y[1], y.len())?;
    if y.is_empty() {
        return Ok(());
    }
    convolve(&g, xs, ws, y, post);
    Ok(())
}

/// The convolution `g` of `xs` by `ws` into `y`, with `post`, on the routine the route table
/// picks ([`route::decide`]).
fn convolve<T: Real>(g: &Geometry, xs: &[T], ws: &[T], y: &mut [T], post: Post<T>) {
    let g = *g;
    let dtype = if T::f32s(xs).is_some() {
        DType::F32
    } else {
        DType::F64
    };
    match route::decide(&g, dtype, Isa::host()).route {
        Route::Depthwise => depthwise(&g, xs, ws, y, post),
        Route::Shifted => shifted::conv(&g, xs, ws, y, post),
        Route::Im2col => im2col_gemm(&g, xs, ws, y, post),
        f32_route => {
            // The f32 routes are taken only for f32 operands.
            let (Some((xs, ws, post)), Some(y)) = (f32_operands(xs, ws, post), T::f32s_mut(y))
            else {
                unreachable!("an f32 route for {}", std::any::type_name::<T>())
            };
            match f32_route {
                Route::Pointwise(_) => direct::pointwise(&g, xs, ws, y, post),
                Route::Winograd(_) => winograd::conv(&g, xs, ws, y, post),
                _ => direct::conv(&g, xs, ws, y, post),
            }
        }
    }
}

/// In words, the routine [`conv2d`] runs for these operands (`x` and `y` in `attrs.layout`,
/// `w` as `[out, in / groups, kh, kw]`), for `kfuse explain`. f16 and bf16 name their f32
/// routine.
pub fn routine(x: &[usize], w: &[usize], attrs: &Conv2dAttrs, y: &[usize], dtype: DType) -> String {
    routine_on(x, w, attrs, y, dtype, Isa::host())
}

/// [`routine`] on the machine `isa` describes.
pub fn routine_on(
    x: &[usize],
    w: &[usize],
    attrs: &Conv2dAttrs,
    y: &[usize],
    dtype: DType,
    isa: Isa,
) -> String {
    let g = Geometry::new(x, w, attrs, y);
    let f32 = matches!(dtype, DType::F32 | DType::F16 | DType::BF16);
    let route = route::decide(&g, dtype, isa).route;
    let mut what = route.describe(&g);
    // The GEMM routes name their GEMM, and where the epilogue runs.
    if matches!(route, Route::Shifted | Route::Im2col) {
        what += match (f32 && isa.avx512, g.layout, route) {
            (true, Layout::Nchw, Route::Im2col) => {
                " on kfuse's f32 GEMM, a bias, residual and ReLU applied in its registers"
            }
            (true, ..) => " on kfuse's f32 GEMM",
            (false, ..) => " on the `gemm` crate",
        };
    }
    if matches!(dtype, DType::F16 | DType::BF16) {
        format!("{what}, on the operands widened to f32, each step rounded to {dtype}")
    } else {
        what
    }
}

/// The route table's decision for these operands on `isa`: the route taken and why each one
/// before it declined (see `conv::route`).
pub fn decide(
    x: &[usize],
    w: &[usize],
    attrs: &Conv2dAttrs,
    y: &[usize],
    dtype: DType,
    isa: Isa,
) -> Decision {
    route::decide(&Geometry::new(x, w, attrs, y), dtype, isa)
}

/// The operands as f32, if `T` is f32.
fn f32_operands<'a, T: Real>(
    xs: &'a [T],
    ws: &'a [T],
    post: Post<'a, T>,
) -> Option<(&'a [f32], &'a [f32], Post<'a, f32>)> {
    Some((T::f32s(xs)?, T::f32s(ws)?, f32_post(post)?))
}

/// The epilogue's operands as f32, if `T` is f32.
fn f32_post<'a, T: Real>(post: Post<'a, T>) -> Option<Post<'a, f32>> {
    let typed = |v: Option<&'a [T]>| match v {
        None => Some(None),
        Some(v) => T::f32s(v).map(Some),
    };
    Some(Post {
        bias: typed(post.bias)?,
        residual: typed(post.residual)?,
        act: post.act,
    })
}

/// General convolution: per task, the im2col columns of a band of output rows, one GEMM per
/// group, then the epilogue on the band.
fn im2col_gemm<T: Real>(g: &Geometry, xs: &[T], ws: &[T], y: &mut [T], post: Post<T>) {
    let [n_images, c_out, oh, ow] = g.y;
    let (cg, og) = (g.in_channels_per_group(), g.out_channels_per_group());
    let k = cg * g.kh * g.kw;
    let out = Out(y.as_mut_ptr());
    let pointwise = g.is_pointwise();
    // f32 NCHW on kfuse's own GEMM, with no activation or ReLU: the bias, the residual and the
    // activation join the sums as they are stored, with no pass over the band.
    let in_registers = match (g.layout, f32_operands(xs, ws, post)) {
        (Layout::Nchw, Some((_, _, post))) if matches!(post.act, None | Some(Activation::Relu)) => {
            Some(post)
        }
        _ => None,
    };
    // An output too large to stay in the last-level cache for its consumer goes out with
    // non-temporal stores from the GEMM's whole tiles, which skip reading each line for
    // ownership, and their consumers read them no slower (ResNet-50's 64 → 256 layers at
    // 56×56: `docs/structured-ops.md`, "Routines": the per-task GEMM).
    let stream = std::mem::size_of_val(y) >= crate::STREAM_MIN_BYTES;
    let job = |n: usize, band: std::ops::Range<usize>| {
        let (r0, r1) = (band.start, band.end);
        let p = (r1 - r0) * ow;
        let finished = in_registers.is_some() && sgemm::applies(og, p, k);
        // Every element of the columns is written before the GEMM reads it.
        with_scratch(if pointwise { 0 } else { k * p }, |col: &mut [T]| {
            for group in 0..g.groups {
                // Columns (NCHW: K x P) or rows (NHWC: P x K) of the patches, k = (c, i, j).
                let (cols, cols_rs, cols_cs): (*const T, usize, usize) = if pointwise {
                    match g.layout {
                        Layout::Nchw => (
                            xs[g.x_offset(n, group * cg, r0, 0)..].as_ptr(),
                            g.x[2] * g.x[3],
                            1,
                        ),
                        Layout::Nhwc => {
                            (xs[g.x_offset(n, group * cg, r0, 0)..].as_ptr(), 1, g.x[1])
                        }
                    }
                } else {
                    fill_columns(g, xs, n, group, r0..r1, col, p);
                    (col.as_ptr(), p, 1)
                };
                let w_group = ws[group * og * k..].as_ptr();
                // SAFETY: every pointer addresses a matrix of the stated shape and strides inside
                // its buffer; this task alone writes rows r0..r1 of image n.
                unsafe {
                    match g.layout {
                        Layout::Nchw if finished => {
                            let post = in_registers.expect("checked above");
                            let at = ((n * c_out + group * og) * oh + r0) * ow;
                            let finish = sgemm::Finish {
                                row_bias: post.bias.map(|b| b[group * og..].as_ptr()),
                                col_bias: None,
                                residual: post.residual.map(|r| r[at..].as_ptr()),
                                activation: post.act,
                                stream,
                            };
                            let operand = |ptr: *const T, rs, cs| Strided {
                                ptr: ptr.cast::<f32>(),
                                rs,
                                cs,
                            };
                            sgemm::sgemm(
                                [og, p, k],
                                operand(w_group, k, 1),
                                operand(cols, cols_rs, cols_cs),
                                (out.ptr().add(at).cast::<f32>(), oh * ow),
                                false,
                                &finish,
                            );
                        }
                        Layout::Nchw => {
                            let dst = out.ptr().add(((n * c_out + group * og) * oh + r0) * ow);
                            gemm_into(
                                og,
                                p,
                                k,
                                dst,
                                oh * ow,
                                1,
                                w_group,
                                k,
                                1,
                                cols,
                                cols_rs,
                                cols_cs,
                                Init::Zero,
                            );
                        }
                        Layout::Nhwc => {
                            let dst = out.ptr().add((n * oh + r0) * ow * c_out + group * og);
                            // Patches as rows: P x K with k contiguous (or channel-strided).
                            let (lhs_rs, lhs_cs) = (cols_cs, cols_rs);
                            gemm_into(
                                p,
                                og,
                                k,
                                dst,
                                c_out,
                                1,
                                cols,
                                lhs_rs,
                                lhs_cs,
                                w_group,
                                1,
                                k,
                                Init::Zero,
                            );
                        }
                    }
                }
            }
        });
        if !finished {
            // SAFETY: as above, this band belongs to this task.
            unsafe { finish_band(g, out.ptr(), n, r0, r1, post) };
        }
    };
    // A pointwise product in NCHW reads its input rows in place (or packs them block by block
    // inside the GEMM): no copy of the band's columns has to fit in cache, so its bands are
    // sized for balance alone, and start on a cache line of the plane (see [`aligned_rows`]).
    let pointwise_nchw = pointwise && g.layout == Layout::Nchw;
    let bytes_per_row = if pointwise_nchw {
        0
    } else {
        k * ow * std::mem::size_of::<T>()
    };
    let line = 64 / std::mem::size_of::<T>();
    let fit = |rows: usize| {
        if pointwise_nchw {
            aligned_rows(rows, oh, ow, line)
        } else {
            rows
        }
    };
    for_each_band_fitted(n_images, oh, bytes_per_row, fit, &job);
}

/// The rows of each band of an `oh × ow` output whose bands `rows` high would have started
/// off a cache line (of `line` elements) within the plane: as many bands, made a whole number
/// of lines long. A band of a 28-wide image then starts every 4 rows, and at 14 every 8: the
/// GEMM's right operand, the band's input rows read in place, keeps each vector load on one
/// line, and its columns fill whole vectors, with no last columns as dot products. Measured
/// in `docs/structured-ops.md` ("Routines": `conv::conv2d`, and "Measurements behind design
/// choices").
fn aligned_rows(rows: usize, oh: usize, ow: usize, line: usize) -> usize {
    let align = line / gcd(ow.max(1), line);
    let bands = oh.div_ceil(rows.max(1)).max(1);
    oh.div_ceil(bands).div_ceil(align) * align
}

/// The greatest common divisor of `a` and `b`.
fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The im2col columns of output rows `rows` of image `n`, group `group`: row `kk = (c, i, j)`
/// of the patches (channel, filter row, filter column) at `col[kk * stride..]`, one position
/// per output pixel of the rows, zero where the tap falls in the padding.
fn fill_columns<T: Real>(
    g: &Geometry,
    xs: &[T],
    n: usize,
    group: usize,
    rows: std::ops::Range<usize>,
    col: &mut [T],
    stride: usize,
) {
    let (cg, ow) = (g.in_channels_per_group(), g.y[3]);
    for c in 0..cg {
        for i in 0..g.kh {
            for j in 0..g.kw {
                let kk = (c * g.kh + i) * g.kw + j;
                for r in rows.clone() {
                    let dst = &mut col[kk * stride + (r - rows.start) * ow..][..ow];
                    let Some(h) = g.tap(0, r, i) else {
                        dst.fill(T::ZERO);
                        continue;
                    };
                    // Output columns whose tap lands inside the row; zeros outside.
                    let (lo, hi, first) = g.valid_columns(j);
                    dst[..lo].fill(T::ZERO);
                    dst[hi..].fill(T::ZERO);
                    if lo < hi {
                        let base = g.x_offset(n, group * cg + c, h, first);
                        let step = g.stride[1] * g.column_stride();
                        if step == 1 {
                            dst[lo..hi].copy_from_slice(&xs[base..base + hi - lo]);
                        } else {
                            for (d, x) in
                                dst[lo..hi].iter_mut().zip(xs[base..].iter().step_by(step))
                            {
                                *d = *x;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Applies the epilogue to output rows `r0..r1` of image `n`.
///
/// # Safety
/// No other thread may access those rows during the call.
unsafe fn finish_band<T: Real>(
    g: &Geometry,
    y: *mut T,
    n: usize,
    r0: usize,
    r1: usize,
    post: Post<T>,
) {
    if post.is_empty() {
        return;
    }
    let [_, c_out, oh, ow] = g.y;
    match g.layout {
        Layout::Nchw => {
            for c in 0..c_out {
                let (at, len) = (((n * c_out + c) * oh + r0) * ow, (r1 - r0) * ow);
                // SAFETY: rows r0..r1 of channel c of image n lie inside `y`.
                let rows = unsafe { std::slice::from_raw_parts_mut(y.add(at), len) };
                epilogue(rows, post.channel(c, at, len));
            }
        }
        Layout::Nhwc => {
            let first = (n * oh + r0) * ow * c_out;
            // SAFETY: as above; NHWC rows r0..r1 are contiguous.
            let band =
                unsafe { std::slice::from_raw_parts_mut(y.add(first), (r1 - r0) * ow * c_out) };
            for (p, pixel) in band.chunks_mut(c_out).enumerate() {
                epilogue(pixel, post.pixel(0..c_out, first + p * c_out));
            }
        }
    }
}

/// Depthwise convolution (one filter per channel) over (image, band) tasks.
fn depthwise<T: Real>(g: &Geometry, xs: &[T], ws: &[T], y: &mut [T], post: Post<T>) {
    let [n_images, c, oh, ow] = g.y;
    let row_bytes = c * ow * std::mem::size_of::<T>();
    if g.layout == Layout::Nchw && band_rows(n_images, oh, row_bytes) < THIN_BAND {
        return depthwise_by_channels(g, xs, ws, y, post);
    }
    let out = Out(y.as_mut_ptr());
    for_each_band(n_images, oh, row_bytes, &|n, band| {
        let (r0, r1) = (band.start, band.end);
        let (at, channel_stride) = match g.layout {
            Layout::Nhwc => ((n * oh + r0) * ow * c, 0),
            Layout::Nchw => ((n * c * oh + r0) * ow, oh * ow),
        };
        // A bias and an activation are applied by the kernel, to each channel's rows as they
        // are computed; a residual (and what follows it) in a pass over the band.
        let (inside, after) = if post.residual.is_none() {
            (post, Post::none())
        } else {
            (Post::none(), post)
        };
        // SAFETY: rows r0..r1 of image n (every channel) lie inside `y` and belong to this
        // task alone.
        unsafe {
            depthwise::band(
                g,
                xs,
                ws,
                n,
                band.clone(),
                Out(out.ptr().add(at)),
                channel_stride,
                inside,
            )
        };
        // SAFETY: as above.
        unsafe { finish_band(g, out.ptr(), n, r0, r1, after) };
    });
}

/// Bands of fewer rows than this leave the NCHW depthwise kernels too little work per channel
/// (each channel's weights, masks and row pointers are set up once per band): the tasks split
/// the channels instead, whole planes each.
const THIN_BAND: usize = 4;

/// The NCHW depthwise convolution in tasks of whole planes, a run of channels of one image
/// each, spread over the kernel pool: for small images (MobileNet's 14×14 and 7×7 stages),
/// where bands of rows would be a row or two and measured slower (`docs/structured-ops.md`,
/// "Measurements behind design choices").
fn depthwise_by_channels<T: Real>(g: &Geometry, xs: &[T], ws: &[T], y: &mut [T], post: Post<T>) {
    let [n_images, c, oh, ow] = g.y;
    let pool = Pool::global();
    // Four tasks per thread, as bands of rows would be, of at least one channel.
    let per_image = (4 * pool.threads()).div_ceil(n_images).min(c).max(1);
    let chunk = c.div_ceil(per_image);
    let chunks = c.div_ceil(chunk);
    let out = Out(y.as_mut_ptr());
    pool.run(n_images * chunks, &|t| {
        let (n, c0) = (t / chunks, t % chunks * chunk);
        let cc = chunk.min(c - c0);
        let (inside, after) = if post.residual.is_none() {
            (post, Post::none())
        } else {
            (Post::none(), post)
        };
        let (sub, xs, ws, inside) = g.depthwise_channels(n, c0..c0 + cc, xs, ws, inside);
        let at = (n * c + c0) * oh * ow;
        // SAFETY: the planes of channels c0..c0 + cc of image n lie inside `y` and belong to
        // this task alone.
        unsafe {
            depthwise::band(
                &sub,
                xs,
                ws,
                0,
                0..oh,
                Out(out.ptr().add(at)),
                oh * ow,
                inside,
            )
        };
        if !after.is_empty() {
            for ch in c0..c0 + cc {
                let at = (n * c + ch) * oh * ow;
                // SAFETY: as above.
                let plane = unsafe { std::slice::from_raw_parts_mut(out.ptr().add(at), oh * ow) };
                epilogue(plane, after.channel(ch, at, oh * ow));
            }
        }
    });
}

/// Whether `depthwise` then `pointwise` form a depthwise-separable block this module fuses:
/// one filter per channel, then a 1×1, stride-1, unpadded, ungrouped convolution, same layout.
pub fn is_separable_block(
    depthwise_attrs: &Conv2dAttrs,
    depthwise_weight: &[usize],
    depthwise_input: &[usize],
    pointwise_attrs: &Conv2dAttrs,
    pointwise_weight: &[usize],
) -> bool {
    let channels = dims(depthwise_input, depthwise_attrs.layout)[1];
    depthwise_attrs.groups == channels
        && depthwise_weight[0] == channels
        && depthwise_weight[1] == 1
        && pointwise_attrs.layout == depthwise_attrs.layout
        && pointwise_attrs.groups == 1
        && pointwise_weight[2] == 1
        && pointwise_weight[3] == 1
        && pointwise_attrs.stride == [1, 1]
        && pointwise_attrs.padding == [0; 4]
}

/// A depthwise convolution followed by a pointwise (1×1) one, fused: each task computes the
/// depthwise output of a band of rows into a cache-sized tile, applies the depthwise half's
/// own epilogue there (`middle`: a per-channel bias, then an activation; no residual), and
/// multiplies it by the pointwise weights straight into the output.
#[allow(clippy::too_many_arguments)]
pub fn separable(
    x: View,
    depthwise_weight: View,
    depthwise_attrs: &Conv2dAttrs,
    middle_dims: &[usize],
    middle: &Epilogue,
    pointwise_weight: View,
    out_dims: &[usize],
    out: &mut Storage,
    epilogue: &Epilogue,
) -> Result<(), String> {
    if middle.residual.is_some() {
        return Err("the depthwise half of a separable block takes no residual".into());
    }
    let args = (
        x,
        depthwise_weight,
        depthwise_attrs,
        middle_dims,
        middle,
        pointwise_weight,
        out_dims,
    );
    match x.storage.dtype() {
        DType::F32 => separable_typed::<f32>(args, out, epilogue),
        DType::F64 => separable_typed::<f64>(args, out, epilogue),
        other => Err(format!("fast conv2d supports f32 and f64, not {other}")),
    }
}

/// One convolution of a block: its weights, attributes, output dims and own epilogue.
pub type Stage<'a> = (View<'a>, &'a Conv2dAttrs, &'a [usize], &'a Epilogue<'a>);

/// MobileNetV2's inverted residual: a 1×1 expansion of `x` (`expand`, with its own bias and
/// activation), a depthwise convolution of its result (`depthwise`, likewise), and a pointwise
/// projection by `pointwise_weight` with the epilogue, into `out`. For f32 NCHW on AVX-512 the
/// expanded tensor is never stored: each band of output rows expands the input rows it reads
/// into a tile. Elsewhere the expansion is computed whole, then the separable block.
#[allow(clippy::too_many_arguments)]
pub fn inverted_residual(
    x: View,
    (expand_weight, expand_attrs, expand_dims, expand_epilogue): Stage,
    (depthwise_weight, depthwise_attrs, middle_dims, middle): Stage,
    pointwise_weight: View,
    out_dims: &[usize],
    out: &mut Storage,
    epilogue: &Epilogue,
) -> Result<(), String> {
    if expand_epilogue.residual.is_some() || middle.residual.is_some() {
        return Err("the first two convolutions of an inverted residual take no residual".into());
    }
    let ge = Geometry::new(x.dims, expand_weight.dims, expand_attrs, expand_dims);
    if !ge.is_pointwise() || ge.groups != 1 {
        return Err("the expansion of an inverted residual is a plain 1×1 convolution".into());
    }
    let gd = Geometry::new(
        expand_dims,
        depthwise_weight.dims,
        depthwise_attrs,
        middle_dims,
    );
    let fused = ge.layout == Layout::Nchw
        && gd.layout == Layout::Nchw
        && crate::dense::has_avx512()
        && x.storage.dtype() == DType::F32;
    if fused {
        let dtype = "the operands of an inverted residual share one dtype";
        let (xs, we, wd, wp) = (
            f32::slice(x.storage).ok_or(dtype)?,
            f32::slice(expand_weight.storage).ok_or(dtype)?,
            f32::slice(depthwise_weight.storage).ok_or(dtype)?,
            f32::slice(pointwise_weight.storage).ok_or(dtype)?,
        );
        let y = output::<f32>(out, out_dims)?;
        let c_out = pointwise_weight.dims[0];
        let post = Post::<f32>::new(epilogue, c_out, y.len())?;
        let expand = Post::<f32>::new(expand_epilogue, ge.y[1], 0)?;
        let middle = Post::<f32>::new(middle, gd.y[1], 0)?;
        if !y.is_empty() {
            direct::inverted_residual(&ge, xs, we, expand, &gd, wd, middle, wp, c_out, y, post);
        }
        return Ok(());
    }
    let n: usize = expand_dims.iter().product();
    let mut expanded = match x.storage.dtype() {
        DType::F32 => Storage::F32(vec![0.0; n]),
        DType::F64 => Storage::F64(vec![0.0; n]),
        other => return Err(format!("fast conv2d supports f32 and f64, not {other}")),
    };
    conv2d(
        x,
        expand_weight,
        expand_attrs,
        expand_dims,
        &mut expanded,
        expand_epilogue,
    )?;
    let expanded = View {
        storage: &expanded,
        dims: expand_dims,
    };
    separable(
        expanded,
        depthwise_weight,
        depthwise_attrs,
        middle_dims,
        middle,
        pointwise_weight,
        out_dims,
        out,
        epilogue,
    )
}

type SeparableArgs<'a> = (
    View<'a>,
    View<'a>,
    &'a Conv2dAttrs,
    &'a [usize],
    &'a Epilogue<'a>,
    View<'a>,
    &'a [usize],
);

fn separable_typed<T: Real>(
    (x, depthwise_weight, depthwise_attrs, middle_dims, middle, pointwise_weight, out_dims): SeparableArgs,
    out: &mut Storage,
    epilogue: &Epilogue,
) -> Result<(), String> {
    let xs = T::slice(x.storage).ok_or("conv2d input dtype")?;
    let wd = T::slice(depthwise_weight.storage).ok_or("conv2d operands must share a dtype")?;
    let wp = T::slice(pointwise_weight.storage).ok_or("conv2d operands must share a dtype")?;
    let g = Geometry::new(x.dims, depthwise_weight.dims, depthwise_attrs, middle_dims);
    let [n_images, c, oh, ow] = g.y;
    let c_out = pointwise_weight.dims[0];
    let out_geometry = Geometry {
        x: g.y,
        y: [n_images, c_out, oh, ow],
        kh: 1,
        kw: 1,
        stride: [1, 1],
        pad: [0, 0],
        dilation: [1, 1],
        groups: 1,
        layout: g.layout,
    };
    let y = output::<T>(out, out_dims)?;
    let post = Post::<T>::new(epilogue, c_out, y.len())?;
    let middle = Post::<T>::new(middle, c, 0)?;
    if y.is_empty() {
        return Ok(());
    }
    if g.layout == Layout::Nchw && crate::dense::has_avx512() {
        if let (Some((xs, wd, post)), Some(wp), Some(middle), Some(y)) = (
            f32_operands(xs, wd, post),
            T::f32s(wp),
            f32_post(middle),
            T::f32s_mut(y),
        ) {
            direct::separable(&g, xs, wd, middle, wp, c_out, y, post);
            return Ok(());
        }
    }
    let dst = Out(y.as_mut_ptr());
    for_each_band(
        n_images,
        oh,
        c * ow * std::mem::size_of::<T>(),
        &|n, band| {
            let (r0, r1) = (band.start, band.end);
            let p = (r1 - r0) * ow;
            // The depthwise kernel writes every element of the tile.
            with_scratch(c * p, |tile: &mut [T]| {
                // NCHW: [channel][row][col]; NHWC: [row][col][channel].
                // SAFETY: the tile holds every channel's rows, and is this task's.
                unsafe {
                    depthwise::band(
                        &g,
                        xs,
                        wd,
                        n,
                        band.clone(),
                        Out(tile.as_mut_ptr()),
                        p,
                        middle,
                    )
                };
                // SAFETY: the tile is C x P (NCHW) or P x C (NHWC); the destination band belongs to
                // this task alone.
                unsafe {
                    match g.layout {
                        Layout::Nchw => {
                            let at = dst.ptr().add((n * c_out * oh + r0) * ow);
                            gemm_into(
                                c_out,
                                p,
                                c,
                                at,
                                oh * ow,
                                1,
                                wp.as_ptr(),
                                c,
                                1,
                                tile.as_ptr(),
                                p,
                                1,
                                Init::Zero,
                            );
                        }
                        Layout::Nhwc => {
                            let at = dst.ptr().add((n * oh + r0) * ow * c_out);
                            gemm_into(
                                p,
                                c_out,
                                c,
                                at,
                                c_out,
                                1,
                                tile.as_ptr(),
                                c,
                                1,
                                wp.as_ptr(),
                                1,
                                c,
                                Init::Zero,
                            );
                        }
                    }
                    finish_band(&out_geometry, dst.ptr(), n, r0, r1, post);
                }
            });
        },
    );
    Ok(())
}

/// What the kernels' tests compare against.
#[cfg(test)]
mod reference {
    use super::Geometry;

    /// Per output of the NCHW convolution `g`: the sum in f64 of its in-image products, and the
    /// sum of their magnitudes (what a reordered f32 sum may be off by a few units of).
    pub(super) fn sums(g: &Geometry, xs: &[f32], ws: &[f32]) -> Vec<(f64, f64)> {
        let ([n, co, oh, ow], [_, ci, h, w]) = (g.y, g.x);
        let (cg, og) = (g.in_channels_per_group(), g.out_channels_per_group());
        let mut out = Vec::with_capacity(n * co * oh * ow);
        for b in 0..n {
            for o in 0..co {
                let group = o / og;
                for r in 0..oh {
                    for c in 0..ow {
                        let (mut sum, mut size) = (0.0f64, 0.0f64);
                        for k in 0..cg {
                            for i in 0..g.kh {
                                for j in 0..g.kw {
                                    let (Some(y), Some(x)) = (g.tap(0, r, i), g.tap(1, c, j))
                                    else {
                                        continue;
                                    };
                                    let p = ws[((o * cg + k) * g.kh + i) * g.kw + j] as f64
                                        * xs[((b * ci + group * cg + k) * h + y) * w + x] as f64;
                                    sum += p;
                                    size += p.abs();
                                }
                            }
                        }
                        out.push((sum, size));
                    }
                }
            }
        }
        out
    }

    /// Checks each output `got[i]` of an NCHW convolution (`channels` of `plane` pixels) within
    /// `1e-6` of its products' magnitudes of `want[i]`'s sum, after `post` (its bias, residual,
    /// and ReLU, a clamp or tanh) in f64.
    pub(super) fn assert_within(
        got: &[f32],
        want: &[(f64, f64)],
        post: &super::Post<f32>,
        (channels, plane): (usize, usize),
        what: &str,
    ) {
        use crate::epilogue::Activation;
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (&y, &(sum, size))) in got.iter().zip(want).enumerate() {
            let channel = i / plane % channels;
            let v = sum
                + post.bias.map_or(0.0, |b| b[channel] as f64)
                + post.residual.map_or(0.0, |r| r[i] as f64);
            let v = match post.act {
                Some(Activation::Relu) => v.max(0.0),
                Some(Activation::Clamp(b)) => v.clamp(b.lo(), b.hi()),
                Some(Activation::Tanh) => v.tanh(),
                None => v,
                Some(other) => panic!("{what}: no reference for {other:?}"),
            };
            let bound = 1e-6 * (size + 4.0) + 1e-30;
            assert!(
                (y as f64 - v).abs() <= bound,
                "{what}: output {i} is {y}, want {v} (bound {bound})"
            );
        }
    }

    /// Normal values (`seed`), every `edge`th one (if any) taken from `specials` in turn.
    pub(super) fn values(len: usize, seed: u64, edge: usize, specials: &[f32]) -> Vec<f32> {
        (0..len)
            .map(|i| {
                if edge > 0 && i % edge == edge / 2 {
                    specials[i / edge % specials.len()]
                } else {
                    kfuse_math::normal_f32(seed, i as u64)
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod routes {
    use super::route::{self, Isa, Plan};
    use super::{routine, Geometry, Route};
    use kfuse_ir::{Conv2dAttrs, DType, Layout};

    /// The kind of routine, whatever its layout or plan.
    #[derive(Debug, PartialEq)]
    enum Kind {
        Pointwise,
        Winograd,
        Direct,
        Im2col,
        Other,
    }

    fn route(n: usize, c: usize, co: usize, hw: usize, k: usize, s: usize) -> Kind {
        let g = geometry(n, c, co, hw, k, s);
        match route::decide(&g, DType::F32, Isa::host()).route {
            Route::Pointwise(_) => Kind::Pointwise,
            Route::Winograd(_) => Kind::Winograd,
            Route::Direct(_) => Kind::Direct,
            Route::Im2col => Kind::Im2col,
            _ => Kind::Other,
        }
    }

    /// A square NCHW convolution, `k` wide with "same" padding, at stride `s`.
    fn geometry(n: usize, c: usize, co: usize, hw: usize, k: usize, s: usize) -> Geometry {
        let p = k / 2;
        let o = (hw + 2 * p - k) / s + 1;
        let attrs = Conv2dAttrs {
            layout: Layout::Nchw,
            stride: [s, s],
            padding: [p; 4],
            dilation: [1, 1],
            groups: 1,
        };
        Geometry::new(&[n, c, hw, hw], &[co, c, k, k], &attrs, &[n, co, o, o])
    }

    /// ResNet-18's convolutions take the routines measured fastest for them (see
    /// `route::TAP_PLANES_BELOW` and the Winograd conditions in `route`): strided ones onto
    /// 28×28 and larger outputs on the phase planes, onto 14×14 and 7×7 on tap planes; stride-1
    /// 3×3 ones on Winograd but for small images at a small batch.
    #[test]
    fn resnet_convolutions_take_their_routines() {
        if !crate::dense::has_avx512() {
            kfuse_testkit::skip(
                "resnet_convolutions_take_their_routines",
                kfuse_testkit::Prerequisite::Avx512,
                "the direct and Winograd kernels need AVX-512, which this CPU lacks",
            );
            return;
        }
        assert_eq!(route(8, 3, 64, 224, 7, 2), Kind::Direct);
        assert_eq!(route(8, 64, 64, 56, 3, 1), Kind::Winograd);
        assert_eq!(route(8, 64, 128, 56, 3, 2), Kind::Direct);
        // Onto 28-wide rows, with positions broadcast; onto narrower ones, tap planes.
        assert!(route::broadcasts_positions(&geometry(8, 64, 128, 56, 3, 2)));
        assert!(!route::broadcasts_positions(&geometry(
            8, 128, 256, 28, 3, 2
        )));
        assert!(!route::broadcasts_positions(&geometry(8, 3, 64, 224, 7, 2)));
        assert_eq!(route(8, 128, 256, 28, 3, 2), Kind::Direct);
        // 14×14 outputs go to Winograd at a batch of four images per thread or more.
        let batch_per_thread = 8 / crate::Pool::global().threads();
        let narrow = if batch_per_thread >= 4 {
            Kind::Winograd
        } else {
            Kind::Direct
        };
        assert_eq!(route(8, 256, 256, 14, 3, 1), narrow);
        assert_eq!(route(1, 256, 256, 14, 3, 1), Kind::Direct);
        assert_eq!(route(8, 256, 512, 14, 3, 2), Kind::Direct);
        assert_eq!(route(1, 256, 512, 14, 3, 2), Kind::Direct);
        // 7×7 outputs: Winograd with the images' tiles side by side from three images up
        // (48 tiles), the direct kernel below.
        assert_eq!(route(8, 512, 512, 7, 3, 1), Kind::Winograd);
        assert_eq!(route(3, 512, 512, 7, 3, 1), Kind::Winograd);
        // How Winograd lays out their tiles: 7×7 at batch 8 all at once, 14×14 in tasks of
        // tiles, 56×56 in bands; and `explain` says which.
        let plan = route::winograd_plan;
        assert_eq!(plan(&geometry(8, 512, 512, 7, 3, 1)), Plan::AllAtOnce);
        assert_eq!(plan(&geometry(32, 512, 512, 7, 3, 1)), Plan::Tasks);
        assert_eq!(plan(&geometry(8, 256, 256, 14, 3, 1)), Plan::Tasks);
        assert_eq!(plan(&geometry(8, 64, 64, 56, 3, 1)), Plan::Bands);
        let described = Route::Winograd(Plan::AllAtOnce).describe(&geometry(8, 512, 512, 7, 3, 1));
        assert!(described.contains("side by side at once"), "{described}");
        assert_eq!(route(2, 512, 512, 7, 3, 1), Kind::Direct);
        assert_eq!(route(1, 512, 512, 7, 3, 1), Kind::Direct);
        assert_eq!(route(8, 256, 512, 14, 1, 2), Kind::Direct);
        // Few channels: a strided 1×1 convolution stays on im2col.
        assert_eq!(route(8, 32, 64, 14, 1, 2), Kind::Im2col);
    }

    /// 1×1 convolutions run on the direct microkernel where it was measured faster than the
    /// `gemm` crate (see `Pointwise` and `Direct::NarrowPointwise` in `route`), and
    /// on `gemm` elsewhere: stride-1 ones onto images of 14×14 and more among them.
    #[test]
    fn pointwise_convolutions_take_their_routines() {
        if !crate::dense::has_avx512() {
            kfuse_testkit::skip(
                "pointwise_convolutions_take_their_routines",
                kfuse_testkit::Prerequisite::Avx512,
                "the direct microkernel needs AVX-512, which this CPU lacks",
            );
            return;
        }
        assert_eq!(route(8, 64, 128, 112, 1, 1), Kind::Im2col);
        assert_eq!(route(8, 256, 64, 56, 1, 1), Kind::Im2col);
        assert_eq!(route(8, 1024, 256, 14, 1, 1), Kind::Im2col);
        assert_eq!(route(8, 512, 2048, 7, 1, 1), Kind::Direct);
        assert_eq!(route(8, 2048, 512, 7, 1, 1), Kind::Direct);
        assert_eq!(route(1, 2048, 512, 7, 1, 1), Kind::Pointwise);
        assert_eq!(route(8, 960, 160, 7, 1, 1), Kind::Im2col);
        assert_eq!(route(8, 144, 24, 56, 1, 1), Kind::Im2col);
        assert_eq!(route(8, 24, 144, 56, 1, 1), Kind::Im2col);
        // Down-sampling shortcuts onto 14×14 and larger outputs; onto 7×7, the direct
        // kernel's tap planes.
        assert_eq!(route(8, 64, 128, 56, 1, 2), Kind::Pointwise);
        assert_eq!(route(8, 512, 1024, 28, 1, 2), Kind::Pointwise);
        assert_eq!(route(8, 1024, 2048, 14, 1, 2), Kind::Direct);
    }

    /// Pointwise bands start on a cache line of the plane and fill whole vectors, as many as
    /// the balance asked for where the rows allow it, and never more rows than the image.
    #[test]
    fn pointwise_bands_start_on_cache_lines() {
        // (rows asked for, rows of the image, its width, f32 or f64 line) -> rows per band.
        let cases: [(usize, usize, usize, usize, usize); 10] = [
            (14, 28, 28, 16, 16),
            (28, 28, 28, 16, 28),
            (4, 14, 14, 16, 8),
            (2, 14, 14, 16, 8),
            (14, 14, 14, 16, 14),
            (18, 56, 56, 16, 14),
            (5, 20, 32, 16, 5),
            (3, 9, 9, 16, 9),
            (4, 14, 14, 8, 4),
            (1, 1, 7, 16, 1),
        ];
        for (rows, oh, ow, line, want) in cases {
            let got = super::aligned_rows(rows, oh, ow, line).min(oh);
            assert_eq!(got, want, "{rows} of {oh} rows of {ow}, {line} per line");
            // Every band but the last starts on a line and holds whole vectors.
            assert!(got == oh || (got * ow).is_multiple_of(line), "{got} x {ow}");
            // As many bands as asked for, or fewer.
            assert!(oh.div_ceil(got) <= oh.div_ceil(rows));
        }
    }

    /// `kfuse explain` names the GEMM a GEMM route runs on, and where its epilogue runs: in
    /// the registers of kfuse's f32 GEMM for NCHW im2col (and 1×1) convolutions on AVX-512,
    /// on the `gemm` crate for f64.
    #[test]
    fn gemm_routes_name_their_gemm() {
        let attrs = Conv2dAttrs {
            layout: Layout::Nchw,
            stride: [1, 1],
            padding: [0; 4],
            dilation: [1, 1],
            groups: 1,
        };
        let (x, w, y) = ([8, 64, 16, 16], [128, 64, 1, 1], [8, 128, 16, 16]);
        let f64_route = routine(&x, &w, &attrs, &y, DType::F64);
        assert!(f64_route.ends_with("on the `gemm` crate"), "{f64_route}");
        let f32_route = routine(&x, &w, &attrs, &y, DType::F32);
        if crate::dense::has_avx512() {
            assert!(
                f32_route.ends_with(
                    "on kfuse's f32 GEMM, a bias, residual and ReLU applied in its registers"
                ),
                "{f32_route}"
            );
        } else {
            assert!(f32_route.ends_with("on the `gemm` crate"), "{f32_route}");
        }
    }
}
