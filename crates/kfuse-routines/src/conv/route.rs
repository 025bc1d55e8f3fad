//! The route table: which routine runs a convolution, decided in this one place as a pure
//! function of its geometry, its element type and the machine ([`Isa`]).
//!
//! The candidates are tried in a fixed order, each with the conditions under which it was
//! measured to lead; the first that takes the convolution runs it, and every one before it
//! says why it declined. Im2col takes everything, so a route is always found. The thresholds
//! are the named constants below; the measurements behind them are in
//! `docs/structured-ops.md` ("Convolution routes"), and `tests/routes` pins the route of every
//! convolution shape the tests, the W5-W7 workloads and the ResNet and MobileNet networks use.
//!
//! One choice is made from data rather than shape: a Winograd convolution whose transformed
//! weights or results are not finite is computed again on the direct kernel (see `winograd`),
//! which gives the reference's NaNs and infinities.

use kfuse_ir::{DType, Layout};

use super::Geometry;

/// What the table knows of the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Isa {
    /// AVX-512 F and DQ with FMA: the hand-written kernels' instruction set.
    pub avx512: bool,
    /// Threads of the pool the routines run on.
    pub threads: usize,
}

impl Isa {
    /// This machine, as the routines will run on it.
    pub fn host() -> Isa {
        Isa {
            avx512: crate::dense::has_avx512(),
            threads: crate::Pool::global().threads(),
        }
    }
}

/// The routine a convolution runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The direct depthwise kernel (one filter per channel).
    Depthwise,
    /// A 1×1 convolution on the direct 8×48 microkernel.
    Pointwise(Pointwise),
    /// Winograd F(2×2, 3×3) with its tiles laid out by the plan.
    Winograd(Plan),
    /// The direct 8×48 (or 7×32) microkernel on one of its input layouts.
    Direct(Direct),
    /// One GEMM per tap over a zero-bordered copy of each band's input.
    Shifted,
    /// Im2col columns per band of output rows, one GEMM per group.
    Im2col,
}

/// How the microkernel runs a 1×1 convolution ([`Route::Pointwise`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pointwise {
    /// Each small image as one band, in two phases over the threads.
    SmallImages,
    /// Strided: on a copy of every stride-th pixel of each band's input rows.
    StridedCopy,
}

/// How a Winograd convolution lays out its tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Bands of whole tile rows, each a task.
    Bands,
    /// Tasks of 48 tiles numbered across the images.
    Tasks,
    /// Every image's tiles side by side, in three passes.
    AllAtOnce,
}

/// Where the direct microkernel reads its input from ([`Route::Direct`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direct {
    /// A stride-1 1×1 convolution onto a small image with many channels, on each band's input
    /// rows in place, a band's last few positions on the tail kernel.
    NarrowPointwise,
    /// Stride 1, output rows as wide as the input's: the taps read the band's input rows
    /// through lane masks.
    SameWidth,
    /// Strided, 7 output positions broadcast against vectors of 32 output channels.
    BroadcastPositions,
    /// Strided onto narrow rows: one plane per row phase and tap column.
    TapPlanes,
    /// Strided: one plane per stride phase, every tap a fixed offset.
    PhasePlanes,
    /// Stride 1 onto rows of another width: a zero-bordered copy of each band's input.
    Bordered,
}

/// The route a convolution takes, and why each route before it declined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub route: Route,
    /// `(route, reason)` for every route tried before the one taken, in order.
    pub declined: Vec<(&'static str, String)>,
}

/// Positions per block of the direct microkernel (`direct::QB`).
pub(super) const MICROKERNEL_POSITIONS: usize = 48;

/// The most pixels a small image has for [`Pointwise::SmallImages`] (10×10): beyond it the GEMM's
/// bands of one or two rows are large enough to keep its tiles busy.
const SMALL_IMAGE: usize = 100;

/// The fewest output pixels a strided 1×1 convolution has for [`Pointwise::StridedCopy`] (14×14):
/// onto smaller outputs it runs on tap planes, which lead there.
const STRIDED_COPY_MIN_PIXELS: usize = 14 * 14;

/// The fewest input and output channels of a strided 1×1 convolution on the microkernel: with
/// fewer, im2col's one GEMM per band keeps the lead.
const STRIDED_POINTWISE_MIN_CHANNELS: usize = 64;

/// Stride-1 1×1 convolutions onto images of fewer pixels than this (14×14) with at least
/// [`NARROW_POINTWISE_MIN_CHANNELS`] channels each way run on the direct kernel in place: the
/// `gemm` path's bands are too short there.
const NARROW_POINTWISE_MAX_PIXELS: usize = 14 * 14;

/// See [`NARROW_POINTWISE_MAX_PIXELS`]: with fewer channels the two run alike or `gemm` leads.
const NARROW_POINTWISE_MIN_CHANNELS: usize = 256;

/// Strided convolutions onto output rows narrower than this run on tap planes rather than
/// phase planes: tap planes compute no padding column and store straight to the output.
const TAP_PLANES_BELOW: usize = 28;

/// The fewest input channels of a [`Direct::BroadcastPositions`] convolution: with fewer (the
/// stem's 3) each block's products are too short beside its stores.
const BROADCAST_MIN_CHANNELS: usize = 16;

/// Output channels of [`Direct::BroadcastPositions`] come in whole vectors of this many.
const BROADCAST_CHANNEL_BLOCK: usize = 32;

/// The fewest input and output channels per group of a Winograd convolution: with fewer, the
/// transforms cost more than the multiplications they save.
const WINOGRAD_MIN_CHANNELS: usize = 16;

/// The narrowest Winograd output in general: sixteen tiles side by side are one vector of the
/// transforms, and narrower rows leave lanes empty.
pub(super) const WINOGRAD_MIN_WIDTH: usize = 24;

/// Narrower Winograd outputs, down to this width, are taken with at least
/// [`WINOGRAD_WIDE_CHANNELS`] channels each way and four images per thread: there the products
/// outweigh the empty lanes.
pub(super) const WINOGRAD_MIN_NARROW_WIDTH: usize = 10;

/// See [`WINOGRAD_MIN_NARROW_WIDTH`]; also the channels a small-image Winograd needs.
const WINOGRAD_WIDE_CHANNELS: usize = 128;

/// The most 2×2 tiles (8×8 pixels) an image of a small-image Winograd convolution has.
const WINOGRAD_SMALL_TILES: usize = 16;

/// Transformed weights of at least this many bytes make a small-image Winograd run all its
/// images at once: tasks of tiles would each read them again.
const ALL_AT_ONCE_MIN_WEIGHT_BYTES: usize = 8 << 20;

/// The most bytes an all-at-once Winograd's transformed input and products take.
const ALL_AT_ONCE_MAX_PLANE_BYTES: usize = 32 << 20;

/// Input channels per group below which im2col's one deep GEMM beats a shifted GEMM per tap.
const SHIFTED_MIN_CHANNELS: usize = 16;

/// The route of convolution `g` with operands of `dtype` (f16 and bf16 run on their f32
/// routines, widened) on `isa`.
pub(super) fn decide(g: &Geometry, dtype: DType, isa: Isa) -> Decision {
    let f32 = matches!(dtype, DType::F32 | DType::F16 | DType::BF16);
    let mut declined = Vec::new();
    let mut take = |name: &'static str, tried: Result<Route, String>| match tried {
        Ok(route) => Some(route),
        Err(why) => {
            declined.push((name, why));
            None
        }
    };
    let route = take("depthwise", depthwise(g))
        .or_else(|| take("pointwise", pointwise(g, f32, isa)))
        .or_else(|| take("winograd", winograd(g, f32, isa)))
        .or_else(|| take("direct", direct(g, f32, isa)))
        .or_else(|| take("shifted", shifted(g)))
        .unwrap_or(Route::Im2col);
    Decision { route, declined }
}

/// `Ok(())` where `holds`, else the reason.
fn need(holds: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if holds {
        Ok(())
    } else {
        Err(why())
    }
}

/// The microkernels' common conditions: f32 operands on AVX-512, in NCHW.
fn microkernel(g: &Geometry, f32: bool, isa: Isa) -> Result<(), String> {
    need(f32, || "its kernels take f32 operands".into())?;
    need(isa.avx512, || "its kernels need AVX-512".into())?;
    need(g.layout == Layout::Nchw, || "its kernels read NCHW".into())
}

fn depthwise(g: &Geometry) -> Result<Route, String> {
    need(g.groups == g.x[1] && g.y[1] == g.x[1], || {
        format!(
            "{} channels onto {} in {} group(s) are not one filter per channel",
            g.x[1], g.y[1], g.groups
        )
    })?;
    Ok(Route::Depthwise)
}

fn pointwise(g: &Geometry, f32: bool, isa: Isa) -> Result<Route, String> {
    microkernel(g, f32, isa)?;
    need(g.kh == 1 && g.kw == 1, || {
        format!("the filter is {}×{}, not 1×1", g.kh, g.kw)
    })?;
    need(g.groups == 1, || format!("{} groups", g.groups))?;
    let pixels = g.y[2] * g.y[3];
    if g.stride == [1, 1] {
        need(g.is_pointwise(), || "the 1×1 convolution is padded".into())?;
        need(pixels <= SMALL_IMAGE, || {
            format!("{pixels} output pixels are more than {SMALL_IMAGE}: kfuse's GEMM runs them in bands")
        })?;
        need(g.y[0] < isa.threads, || {
            format!(
                "{} images are no fewer than the {} threads: kfuse's GEMM runs an image per thread",
                g.y[0], isa.threads
            )
        })?;
        return Ok(Route::Pointwise(Pointwise::SmallImages));
    }
    let every_stride_th =
        |axis: usize| g.y[2 + axis] == (g.x[2 + axis].max(1) - 1) / g.stride[axis] + 1;
    need(
        g.pad == [0, 0] && every_stride_th(0) && every_stride_th(1),
        || "the strided output is not every stride-th input pixel".into(),
    )?;
    need(
        g.x[1] >= STRIDED_POINTWISE_MIN_CHANNELS && g.y[1] >= STRIDED_POINTWISE_MIN_CHANNELS,
        || {
            format!(
                "{} channels onto {}: fewer than {STRIDED_POINTWISE_MIN_CHANNELS} each way",
                g.x[1], g.y[1]
            )
        },
    )?;
    need(pixels >= STRIDED_COPY_MIN_PIXELS, || {
        format!("{pixels} output pixels are fewer than {STRIDED_COPY_MIN_PIXELS}")
    })?;
    Ok(Route::Pointwise(Pointwise::StridedCopy))
}

pub(super) fn winograd(g: &Geometry, f32: bool, isa: Isa) -> Result<Route, String> {
    microkernel(g, f32, isa)?;
    need(
        g.kh == 3 && g.kw == 3 && g.stride == [1, 1] && g.dilation == [1, 1],
        || "it takes 3×3 filters at stride 1 without dilation".into(),
    )?;
    let (cg, og) = (g.in_channels_per_group(), g.out_channels_per_group());
    need(
        cg >= WINOGRAD_MIN_CHANNELS && og >= WINOGRAD_MIN_CHANNELS,
        || {
            format!(
                "{cg} channels per group onto {og}: fewer than {WINOGRAD_MIN_CHANNELS} each way"
            )
        },
    )?;
    need(g.y[2] >= 2, || "the output is one row high".into())?;
    let narrow = g.y[3] >= WINOGRAD_MIN_NARROW_WIDTH
        && cg >= WINOGRAD_WIDE_CHANNELS
        && og >= WINOGRAD_WIDE_CHANNELS
        && g.y[0] >= 4 * isa.threads;
    need(
        g.y[3] >= WINOGRAD_MIN_WIDTH || narrow || winograd_small(g),
        || {
            format!(
            "rows {} wide leave the transforms' lanes empty (with fewer than {} images or {} channels)",
            g.y[3],
            4 * isa.threads,
            WINOGRAD_WIDE_CHANNELS
        )
        },
    )?;
    Ok(Route::Winograd(winograd_plan(g)))
}

/// A Winograd convolution of small images: one group of at least
/// [`WINOGRAD_WIDE_CHANNELS`] channels each way, outputs narrower than
/// [`WINOGRAD_MIN_NARROW_WIDTH`] of at most [`WINOGRAD_SMALL_TILES`] tiles, and enough images
/// for the microkernel's blocks of tiles.
pub(super) fn winograd_small(g: &Geometry) -> bool {
    let tiles = g.y[2].div_ceil(2) * g.y[3].div_ceil(2);
    g.groups == 1
        && g.x[1] >= WINOGRAD_WIDE_CHANNELS
        && g.y[1] >= WINOGRAD_WIDE_CHANNELS
        && g.y[3] < WINOGRAD_MIN_NARROW_WIDTH
        && tiles <= WINOGRAD_SMALL_TILES
        && g.y[0] * tiles >= MICROKERNEL_POSITIONS
}

/// The plan of a Winograd convolution `g` (one the table routes there).
pub(super) fn winograd_plan(g: &Geometry) -> Plan {
    let tiles = g.y[0] * g.y[2].div_ceil(2) * g.y[3].div_ceil(2);
    let f32s = std::mem::size_of::<f32>();
    let all_at_once = 16 * g.x[1] * g.y[1] * f32s >= ALL_AT_ONCE_MIN_WEIGHT_BYTES
        && tiles <= 4 * MICROKERNEL_POSITIONS
        && 16 * tiles * (g.x[1] + g.y[1]) * f32s <= ALL_AT_ONCE_MAX_PLANE_BYTES;
    if winograd_small(g) && all_at_once {
        Plan::AllAtOnce
    } else if g.y[3] < WINOGRAD_MIN_WIDTH && g.groups == 1 {
        Plan::Tasks
    } else {
        Plan::Bands
    }
}

fn direct(g: &Geometry, f32: bool, isa: Isa) -> Result<Route, String> {
    direct_takes(g, f32, isa)?;
    // Strided outputs of fewer than two blocks of positions on phase planes pay more for the
    // extra column and the last block's empty lanes than im2col's copy.
    need(
        g.stride == [1, 1] || g.y[2] * g.y[3] >= 2 * MICROKERNEL_POSITIONS || on_tap_planes(g),
        || "a strided output of fewer than two blocks of positions".into(),
    )?;
    Ok(Route::Direct(direct_layout(g)))
}

/// Whether the direct kernel can run `g` at all (whether it leads is [`direct`]'s further
/// question).
pub(super) fn direct_takes(g: &Geometry, f32: bool, isa: Isa) -> Result<(), String> {
    microkernel(g, f32, isa)?;
    let channels = |min: usize| g.x[1] >= min && g.y[1] >= min;
    let strided_pointwise = on_tap_planes(g) && channels(STRIDED_POINTWISE_MIN_CHANNELS);
    need(
        g.kh * g.kw > 1 || strided_pointwise || narrow_pointwise(g),
        || {
            "a 1×1 convolution runs on a GEMM unless strided onto narrow rows or onto a small image with many channels".into()
        },
    )
}

/// Where the direct kernel reads the input of `g` from; a pure function of the geometry, also
/// for the Winograd kernel's fallback.
pub(super) fn direct_layout(g: &Geometry) -> Direct {
    if g.stride == [1, 1] && g.y[3] == g.x[3] {
        if narrow_pointwise(g) {
            Direct::NarrowPointwise
        } else {
            Direct::SameWidth
        }
    } else if broadcasts_positions(g) {
        Direct::BroadcastPositions
    } else if on_tap_planes(g) {
        Direct::TapPlanes
    } else if g.stride != [1, 1] {
        Direct::PhasePlanes
    } else {
        Direct::Bordered
    }
}

/// A stride-1 1×1 convolution onto a small image with many channels: see
/// [`NARROW_POINTWISE_MAX_PIXELS`].
pub(super) fn narrow_pointwise(g: &Geometry) -> bool {
    g.is_pointwise()
        && g.y[2] * g.y[3] < NARROW_POINTWISE_MAX_PIXELS
        && g.x[1] >= NARROW_POINTWISE_MIN_CHANNELS
        && g.y[1] >= NARROW_POINTWISE_MIN_CHANNELS
}

/// Whether strided `g` runs on tap planes: see [`TAP_PLANES_BELOW`].
pub(super) fn on_tap_planes(g: &Geometry) -> bool {
    g.stride != [1, 1] && g.y[3] < TAP_PLANES_BELOW
}

/// Whether strided `g` broadcasts output positions: a column stride of 2 without dilation, one
/// group, output channels in whole blocks, enough input channels, rows too wide for tap planes
/// (onto narrower rows a block's weights would be read again for every seven positions), and
/// 32-bit offsets.
pub(super) fn broadcasts_positions(g: &Geometry) -> bool {
    g.stride[1] == 2
        && g.y[2] * g.y[3] * 16 <= i32::MAX as usize
        && g.dilation == [1, 1]
        && g.groups == 1
        && g.y[1].is_multiple_of(BROADCAST_CHANNEL_BLOCK)
        && g.x[1] >= BROADCAST_MIN_CHANNELS
        && !on_tap_planes(g)
        && g.layout == Layout::Nchw
}

fn shifted(g: &Geometry) -> Result<Route, String> {
    need(g.stride == [1, 1] && g.kh * g.kw > 1, || {
        "it takes filters larger than 1×1 at stride 1".into()
    })?;
    let cg = g.in_channels_per_group();
    need(cg >= SHIFTED_MIN_CHANNELS, || {
        format!("{cg} input channels per group are fewer than {SHIFTED_MIN_CHANNELS}")
    })?;
    need(
        g.layout == Layout::Nhwc || g.out_channels_per_group() <= cg,
        || "in NCHW, more output channels than input channels".into(),
    )?;
    Ok(Route::Shifted)
}

/// Whether a convolution on `route` pools its result from the kernel's stage in one pass: the
/// direct kernel on a copy of each band's input (phase planes, or a bordered copy).
/// Broadcast-position geometry runs on phase planes there too.
pub(super) fn pools_from_stage(route: Route) -> bool {
    matches!(
        route,
        Route::Direct(Direct::PhasePlanes | Direct::BroadcastPositions | Direct::Bordered)
    )
}

impl Route {
    /// The routine in words, for `kfuse explain`.
    pub(super) fn describe(self, g: &Geometry) -> String {
        match self {
            Route::Depthwise => "the direct depthwise kernel".into(),
            Route::Pointwise(Pointwise::SmallImages) => {
                "the direct 8×48 microkernel as a 1×1 convolution, each small image in two phases over the threads".into()
            }
            Route::Pointwise(Pointwise::StridedCopy) => format!(
                "the direct 8×48 microkernel as a 1×1 convolution, on a copy of every {}×{} pixel of each band's input rows",
                g.stride[0], g.stride[1]
            ),
            Route::Winograd(plan) => {
                let tiles = match plan {
                    Plan::AllAtOnce => ", every image's tiles side by side at once",
                    Plan::Tasks => ", in tasks of 48 tiles across the images",
                    Plan::Bands => "",
                };
                format!("Winograd F(2×2, 3×3){tiles}: input and output transforms around 16 GEMMs on the direct 8×48 microkernel (16 multiplications per 2×2 outputs where direct takes 36)")
            }
            Route::Direct(Direct::NarrowPointwise) => {
                "the direct 8×48 microkernel as a 1×1 convolution on each band's input rows, a band's last few positions on the tail kernel".into()
            }
            Route::Direct(Direct::BroadcastPositions) => format!(
                "a direct 7×32 microkernel broadcasting output positions (read at column stride {} from a padded copy of each band's rows) against vectors of output channels, its results scattered to the output",
                g.stride[1]
            ),
            Route::Direct(Direct::TapPlanes) => format!(
                "the direct 8×48 microkernel over tap planes of each band's input (one per row phase and tap column, as wide as the output rows; stride {}×{})",
                g.stride[0], g.stride[1]
            ),
            Route::Direct(Direct::PhasePlanes) => format!(
                "the direct 8×48 microkernel over {}×{} phase planes of each band's input (every tap a fixed offset)",
                g.stride[0], g.stride[1]
            ),
            Route::Direct(Direct::SameWidth) => {
                "the direct 8×48 microkernel, its taps reading the band's input rows through lane masks".into()
            }
            Route::Direct(Direct::Bordered) => {
                "the direct 8×48 microkernel over a zero-bordered copy of each band's input".into()
            }
            Route::Shifted => {
                "one GEMM per tap over a zero-bordered copy of each band's input".into()
            }
            Route::Im2col => "im2col columns per band of output rows, one GEMM per group".into(),
        }
    }
}
