//! f32 matrix products on AVX-512: a packed GEMM whose microkernel keeps a 6 × 64 block of the
//! product in 24 vector registers, for the single-threaded calls each task of a matmul or a
//! convolution makes (`dense::gemm_into`).
//!
//! Blocking, for a core with 48 KiB of L1 and 1 MiB of L2:
//! - the right operand is packed in blocks of up to [`KC`] steps × [`NC`] columns (512 KiB,
//!   half of L2), each block as panels of [`NR`] columns, one step's 64 values contiguous and
//!   a last partial panel padded with zeros;
//! - the left operand is read in place through its strides (six rows' values broadcast at
//!   each step), so nothing of it is copied: a row-major or a transposed operand alike;
//! - a product of few rows reads the right operand's whole panels in place too, where its
//!   columns are contiguous ([`in_place`]): too few row blocks read each panel to repay a copy;
//!   the next block's panels are asked for while the current block's tiles run ([`Ahead`]);
//! - for each six rows, the microkernel runs over every panel of the block, its six rows of
//!   the left operand staying in L1 while the panels stream from L2, and adds its sums to
//!   the destination (stores them, on the first block of steps); a last panel of a few
//!   columns computes only the vectors they reach;
//! - up to 8 columns past the last whole vector (a 14×14 image's 196 positions end in 4) are
//!   dot products along the steps instead ([`dot_columns`]), each row block's right after its
//!   panels, while its rows of the left operand are in L1.
//!
//! It exists because it leads the `gemm` crate on W5a's product on one thread, and by a little
//! on two (`docs/benchmarks.md`, "W5a and W5b: dense layers").
//! Sums run along `k` in order within a block of steps and blocks are added in order, with
//! FMA: fast numerics only, like the `gemm` crate's.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use crate::epilogue::{epilogue, Activation, RowBias, Tail};
use crate::prefetch::ask_line;
use crate::simd::InRegisters;

/// Rows of a microkernel block.
const MR: usize = 6;
/// Columns of a microkernel block: four 16-lane vectors.
const NR: usize = 64;
/// Steps of the sum per packed block of the right operand.
const KC: usize = 512;
/// Columns per packed block of the right operand.
const NC: usize = 256;

/// Products of at most this many rows read the right operand's whole panels in place (see
/// [`in_place`]).
const IN_PLACE_ROWS: usize = 256;

/// Whether the product's right operand `b` is read in place rather than packed: its columns
/// contiguous, few rows of the left operand (packing copies all of `b`, a cost the row blocks
/// that read each panel must repay: 43 of them at 256 rows, 11 at 64), and its rows a whole
/// number of cache lines apart (every step's 64 values then lie alike across lines) but not a
/// multiple of 2 KiB (whose lines would crowd a few sets of L2). Each whole panel is then read
/// a step at a time through `b`'s row stride; only a last partial panel is packed. The limits
/// (few rows, whole lines) are where in place measured faster than packed
/// (`docs/structured-ops.md`, "Measurements behind design choices").
fn in_place(m: usize, b: &Strided) -> bool {
    m <= IN_PLACE_ROWS && b.cs == 1 && b.rs.is_multiple_of(16) && !b.rs.is_multiple_of(512)
}

/// A matrix operand in place: element `(i, j)` at `ptr + i * rs + j * cs`.
#[derive(Clone, Copy)]
pub(crate) struct Strided {
    pub ptr: *const f32,
    pub rs: usize,
    pub cs: usize,
}

/// What the sums of a tile get once the last of them is in, before they are stored, in the
/// IR's order: a bias per row of the output (an NCHW convolution's output channel) or per
/// column (a dense layer's output feature), then a residual laid out as the output, then the
/// activation. Each step rounds as the IR's op does, so the result is the one a pass over the
/// stored output gives, without that pass.
#[derive(Clone, Copy, Default)]
pub(crate) struct Finish {
    /// `m` values, one per row.
    pub row_bias: Option<*const f32>,
    /// `n` values, one per column.
    pub col_bias: Option<*const f32>,
    /// An `m × n` matrix with the output's row stride.
    pub residual: Option<*const f32>,
    pub activation: Option<Activation>,
    /// Whole tiles of the last block of steps stored non-temporally: an output too large to
    /// stay in cache for its consumer, whose lines need not be read for ownership first. The
    /// output must then start on a cache line, its rows a whole number of lines apart.
    pub stream: bool,
}

impl Finish {
    fn is_empty(&self) -> bool {
        self.row_bias.is_none()
            && self.col_bias.is_none()
            && self.residual.is_none()
            && self.activation.is_none()
    }

    /// The finish of the tile at row `i`, column `j` and element `at` of the output.
    fn at(&self, i: usize, j: usize, at: usize) -> Finish {
        // Offsets within the operands the caller vouches for.
        Finish {
            row_bias: self.row_bias.map(|b| b.wrapping_add(i)),
            col_bias: self.col_bias.map(|b| b.wrapping_add(j)),
            residual: self.residual.map(|r| r.wrapping_add(at)),
            activation: self.activation,
            stream: self.stream,
        }
    }
}

/// Whether [`sgemm`] runs here (AVX-512) and pays for this product: at least a vector's
/// width of columns, since every panel computes whole vectors.
pub(crate) fn applies(m: usize, n: usize, k: usize) -> bool {
    crate::dense::has_avx512() && m >= 1 && n >= 16 && k >= 1
}

thread_local! {
    /// The packed right operand, kept between calls (a fresh buffer would fault its pages in
    /// at every call). Its own, since callers may hold `dense::with_scratch`.
    static PACKED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `c[m×n] (+)= a[m×k] @ b[k×n]`, single-threaded: added to `c`'s values where `accumulate`,
/// else stored over them, then `finish`ed. `c` is given as its first element and row stride
/// (its columns contiguous).
///
/// # Safety
/// The CPU must have AVX-512F ([`applies`]). `a` and `b` must address matrices of these shapes,
/// `c` an `m × n` matrix with rows `ldc` apart, not overlapping them, and no other thread may
/// touch `c`'s elements during the call; `finish`'s operands must hold what it says.
pub(crate) unsafe fn sgemm(
    [m, n, k]: [usize; 3],
    a: Strided,
    b: Strided,
    (c, ldc): (*mut f32, usize),
    accumulate: bool,
    finish: &Finish,
) {
    if m == 0 || n == 0 {
        return;
    }
    // Streamed only where every whole tile's rows start on cache lines.
    let finish = &Finish {
        stream: finish.stream && (c as usize).is_multiple_of(64) && ldc.is_multiple_of(16),
        ..*finish
    };
    // Columns past the last whole vector computed as dot products (see [`dot_columns`]); the
    // panels cover the rest.
    let tail = dot_columns(n, &a);
    let n = n - tail;
    let kc_max = KC.min(k);
    let nc_max = NC.min(n).div_ceil(NR) * NR;
    PACKED.with(|cell| {
        let mut buffer = cell.borrow_mut();
        // Room to start the panels on a cache line.
        let len = kc_max * nc_max + 16;
        if buffer.len() < len {
            buffer.resize(len, 0.0);
        }
        let skip = buffer.as_ptr().align_offset(64).min(16);
        let packed = &mut buffer[skip..][..kc_max * nc_max];
        for jc in (0..n).step_by(NC) {
            let nc = NC.min(n - jc);
            let panels = nc.div_ceil(NR);
            // A product of no steps still stores (or keeps) and finishes its output, through
            // one block of none.
            for pc in (0..k.max(1)).step_by(KC) {
                let kc = KC.min(k - pc);
                // Panels read in place: the block's whole ones where `in_place`.
                let whole = if in_place(m, &b) { nc / NR } else { 0 };
                if whole * NR < nc {
                    // SAFETY: the block lies within `b`, as the caller vouches.
                    unsafe { pack(b, pc..pc + kc, jc + whole * NR..jc + nc, packed) };
                }
                let add = accumulate || pc > 0;
                let last = pc + kc == k && (!finish.is_empty() || finish.stream);
                // The next block's whole panels read in place, asked for a few lines per 16
                // steps of this block's tiles, so that its first row block finds them in cache
                // (see [`Ahead`]).
                let next = if pc + kc < k {
                    Some((pc + kc..(pc + kc + KC).min(k), jc..jc + nc))
                } else if jc + nc < n {
                    Some((0..kc_max, jc + NC..(jc + 2 * NC).min(n)))
                } else {
                    None
                };
                let mut ahead = next.filter(|_| whole > 0).map(|(steps, cols)| {
                    let whole_cols = cols.len() / NR * NR;
                    Ahead::new(b, steps, cols.start..cols.start + whole_cols)
                });
                let per_chunk = ahead.as_ref().map_or(0, |a| {
                    a.total()
                        .div_ceil((m.div_ceil(MR) * panels * kc.div_ceil(16)).max(1))
                });
                let ahead_ptr: *mut Ahead = ahead
                    .as_mut()
                    .map_or(std::ptr::null_mut(), |a| a as *mut Ahead);
                // The dot columns go with the last block of columns, their steps transposed.
                let dots = (jc + nc == n && tail > 0).then(|| {
                    // SAFETY: the tail's columns and these steps lie within `b`.
                    unsafe { transposed(b, pc..pc + kc, n..n + tail) }
                });
                for ir in (0..m).step_by(MR) {
                    let rows = MR.min(m - ir);
                    // SAFETY: rows ir.. and steps pc.. lie within `a`; the panels within
                    // `packed`; the block within `c`; the features are the caller's.
                    unsafe {
                        let a_at = a.ptr.add(ir * a.rs + pc * a.cs);
                        for panel in 0..panels {
                            let cols = NR.min(nc - panel * NR);
                            let at = ir * ldc + jc + panel * NR;
                            let (b_at, b_rs) = if panel < whole {
                                let at = pc * b.rs + jc + panel * NR;
                                (b.ptr.wrapping_add(at), b.rs)
                            } else {
                                (packed.as_ptr().add((panel - whole) * kc * NR), NR)
                            };
                            let tile = Tile {
                                a: a_at,
                                a_rs: a.rs,
                                a_cs: a.cs,
                                b: b_at,
                                b_rs,
                                kc,
                                c: c.add(at),
                                ldc,
                                cols,
                                add,
                                ahead: (ahead_ptr, per_chunk),
                            };
                            if let Some(residual) = finish.residual.filter(|_| last) {
                                // The next tile's residual lines (the next panel's, or the
                                // next row block's first), asked for a whole tile ahead of
                                // its finish: a tile's own, asked for as its sums begin, still
                                // arrived late from memory.
                                let (ni, np) = if panel + 1 < panels {
                                    (ir, panel + 1)
                                } else {
                                    (ir + MR, 0)
                                };
                                let next_cols = NR.min(nc - np * NR);
                                for i in ni..(ni + MR).min(m) {
                                    for v in 0..next_cols.div_ceil(16) {
                                        let at = i * ldc + jc + np * NR + 16 * v;
                                        ask_line(residual.wrapping_add(at));
                                    }
                                }
                            }
                            let col = jc + panel * NR;
                            match last.then(|| finish.at(ir, col, at)) {
                                None => dispatch(rows, cols.div_ceil(16), &tile),
                                Some(f) => finished(rows, &tile, &f),
                            }
                        }
                        if let Some(bt) = &dots {
                            let at = ir * ldc + n;
                            let f =
                                (pc + kc == k && !finish.is_empty()).then(|| finish.at(ir, n, at));
                            let tile = Tile {
                                a: a_at,
                                a_rs: a.rs,
                                a_cs: a.cs,
                                b: bt.as_ptr(),
                                b_rs: kc,
                                kc,
                                c: c.add(at),
                                ldc,
                                cols: tail,
                                add,
                                ahead: (std::ptr::null_mut(), 0),
                            };
                            dot_tile(rows, &tile, f.as_ref());
                        }
                    }
                }
                if let Some(kept) = dots {
                    DOTS.with(|cell| *cell.borrow_mut() = kept);
                }
            }
        }
    });
    if finish.stream {
        // SAFETY: SSE is baseline on x86-64. Orders the streamed stores before the caller
        // reports its task done.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            _mm_sfence()
        };
    }
}

/// The lines of the next block of the right operand's panels read in place ([`in_place`]),
/// asked for a few per 16 steps of the current block's tiles. The panels' rows are a plane of
/// an NCHW input apart (12.5 KB at 56×56), 4 lines each, which the hardware prefetchers do
/// not follow: each block's first row block waited on every line. Tiles with nothing to ask
/// for keep the plain loop, which the chunked one would slow a little
/// (`docs/structured-ops.md`, "Measurements behind design choices").
struct Ahead {
    b: Strided,
    steps: Range<usize>,
    cols: Range<usize>,
    step: usize,
    col: usize,
}

impl Ahead {
    fn new(b: Strided, steps: Range<usize>, cols: Range<usize>) -> Self {
        Ahead {
            b,
            step: steps.start,
            col: cols.start,
            steps,
            cols,
        }
    }

    /// Lines in all.
    fn total(&self) -> usize {
        self.steps.len() * self.cols.len().div_ceil(16)
    }

    /// Asks for the next `count` lines, a step's lines after another's.
    #[inline(always)]
    fn ask(&mut self, mut count: usize) {
        while count > 0 && self.step < self.steps.end && !self.cols.is_empty() {
            ask_line(self.b.ptr.wrapping_add(self.step * self.b.rs + self.col));
            self.col += 16;
            if self.col >= self.cols.end {
                self.col = self.cols.start;
                self.step += 1;
            }
            count -= 1;
        }
    }
}

/// The columns of an `n`-column product past its last whole vector that [`dot_tile`] computes
/// as dot products along the steps, rather than a last vector of 16 lanes of which they fill a
/// few: at most [`DOT_COLUMNS`] of them, where the left operand's steps are contiguous (each
/// of its rows then loads 16 steps at a time). A 14×14 image's 196 positions ran as three
/// panels and a vector of 4 columns in 6 registers, too few to hide the multiply-add's latency;
/// the 4 columns as dot products take a quarter of that vector's work, and the reductions
/// about as much again. Each row's four sums are reduced together and finished in registers,
/// which measured faster than one by one through the epilogue pass
/// (`docs/structured-ops.md`, "Measurements behind design choices").
fn dot_columns(n: usize, a: &Strided) -> usize {
    let tail = n % 16;
    if a.cs == 1 && tail <= DOT_COLUMNS && n > tail {
        tail
    } else {
        0
    }
}

/// The most columns [`dot_columns`] takes from the panels.
const DOT_COLUMNS: usize = 8;

thread_local! {
    /// The dot columns' steps, transposed ([`transposed`]), kept between calls.
    static DOTS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Steps `steps` of columns `cols` of `b`, each column's steps contiguous (`steps.len()` apart).
///
/// # Safety
/// The block must lie within `b`.
unsafe fn transposed(b: Strided, steps: Range<usize>, cols: Range<usize>) -> Vec<f32> {
    let kc = steps.len();
    let mut out = DOTS.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    out.clear();
    out.resize(kc * cols.len(), 0.0);
    for (j, col) in cols.enumerate() {
        let dst = &mut out[j * kc..][..kc];
        for (p, d) in dst.iter_mut().enumerate() {
            // SAFETY: step `steps.start + p` of column `col` lies within `b`.
            *d = unsafe { *b.ptr.add((steps.start + p) * b.rs + col * b.cs) };
        }
    }
    out
}

/// `rows` rows × `t.cols` (1 to [`DOT_COLUMNS`]) columns of the output as dot products of the
/// left operand's rows (steps contiguous) with the right operand's columns transposed at
/// `t.b` (`t.b_rs` apart): four columns at a time, the `rows × 4` sums in vectors of 16 steps,
/// each reduced at the end. Added to the output's values where `t.add`; then finished by the
/// epilogue a pass over the output would run, where `f` is given.
///
/// # Safety
/// As for [`kernel`], with the right operand as described; `f`'s operands at the tile's first
/// row and element.
unsafe fn dot_tile(rows: usize, t: &Tile, f: Option<&Finish>) {
    // A finish of a bias, a residual and ReLU (or no activation) is applied to the sums in
    // registers; any other after they are stored, by the epilogue.
    let (in_registers, after) = match f {
        Some(f)
            if matches!(f.activation, None | Some(Activation::Relu)) && f.col_bias.is_none() =>
        {
            (Some(f), None)
        }
        other => (None, other),
    };
    for j0 in (0..t.cols).step_by(4) {
        let part = Tile {
            b: t.b.wrapping_add(j0 * t.b_rs),
            c: t.c.wrapping_add(j0),
            cols: 4.min(t.cols - j0),
            ..*t
        };
        let f = in_registers.map(|f| f.at(0, j0, j0));
        let f = f.as_ref();
        macro_rules! by_columns {
            ($r:literal) => {
                match part.cols {
                    4 => dots::<$r, 4>(&part, f),
                    3 => dots::<$r, 3>(&part, f),
                    2 => dots::<$r, 2>(&part, f),
                    _ => dots::<$r, 1>(&part, f),
                }
            };
        }
        // SAFETY: forwarded from the caller.
        unsafe {
            match rows {
                6 => by_columns!(6),
                5 => by_columns!(5),
                4 => by_columns!(4),
                3 => by_columns!(3),
                2 => by_columns!(2),
                _ => by_columns!(1),
            }
        }
    }
    if let Some(f) = after {
        // SAFETY: forwarded from the caller.
        unsafe { finish_stored(rows, t, f) };
    }
}

/// The stored `rows × t.cols` tile at `t.c` finished by the epilogue a pass over the output
/// would run, row by row in L1.
///
/// # Safety
/// The tile's rows must be this thread's, and `f`'s operands at its first row and element.
unsafe fn finish_stored(rows: usize, t: &Tile, f: &Finish) {
    for i in 0..rows {
        // SAFETY: the tile's rows and the finish's operands, as the caller vouches.
        unsafe {
            let row = std::slice::from_raw_parts_mut(t.c.add(i * t.ldc), t.cols);
            let residual = f
                .residual
                .map(|r| std::slice::from_raw_parts(r.add(i * t.ldc), t.cols));
            let bias = match (f.row_bias, f.col_bias) {
                (Some(b), _) => RowBias::Same(*b.add(i)),
                (None, Some(b)) => RowBias::Each(std::slice::from_raw_parts(b, t.cols)),
                (None, None) => RowBias::None,
            };
            let tail = Tail {
                bias,
                scale: RowBias::None,
                residual,
                activation: f.activation,
            };
            epilogue(row, tail);
        }
    }
}

/// The sums of four vectors' lanes, in the first four lanes: pairs of lanes added within each
/// 128-bit quarter, the four vectors' quarters then gathered and added, and the quarters added
/// last (13 operations, where reducing each vector alone takes 8).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn sums_of_four(v: [__m512; 4]) -> __m512 {
    // SAFETY: AVX-512F, which the callers enable.
    unsafe {
        // Per quarter: [v0 0+2, v1 0+2, v0 1+3, v1 1+3], and likewise for v2 and v3.
        let x = _mm512_add_ps(
            _mm512_unpacklo_ps(v[0], v[1]),
            _mm512_unpackhi_ps(v[0], v[1]),
        );
        let y = _mm512_add_ps(
            _mm512_unpacklo_ps(v[2], v[3]),
            _mm512_unpackhi_ps(v[2], v[3]),
        );
        // Per quarter: each vector's sum of the quarter's four lanes.
        let (xd, yd) = (_mm512_castps_pd(x), _mm512_castps_pd(y));
        let z = _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(xd, yd)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(xd, yd)),
        );
        // The quarters: 0 + 2 and 1 + 3, then their sum in the first.
        let h = _mm512_add_ps(z, _mm512_shuffle_f32x4::<0b01_00_11_10>(z, z));
        _mm512_add_ps(h, _mm512_shuffle_f32x4::<0b10_11_00_01>(h, h))
    }
}

/// `R` rows × `J` columns of [`dot_tile`]: `R J` sums of 16 lanes each over the steps (a last
/// partial vector of steps through a mask), each row's reduced together, then stored (added
/// to the output's values where the tile adds), finished where `f` is given: its bias, its
/// residual and ReLU if it has them, all in registers.
///
/// # Safety
/// As for [`dot_tile`], and the CPU must have AVX-512DQ too ([`applies`] checks both); `f`'s
/// operands at the tile's first row and element, its activation none or ReLU.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn dots<const R: usize, const J: usize>(t: &Tile, f: Option<&Finish>) {
    // SAFETY: in bounds as the caller vouches.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); J]; R];
        let mut step = |p: usize, mask: __mmask16| {
            let bv: [__m512; J] =
                std::array::from_fn(|j| _mm512_maskz_loadu_ps(mask, t.b.add(j * t.b_rs + p)));
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm512_maskz_loadu_ps(mask, t.a.add(i * t.a_rs + p));
                for (sum, &bv) in row.iter_mut().zip(&bv) {
                    *sum = _mm512_fmadd_ps(av, bv, *sum);
                }
            }
        };
        let whole = t.kc / 16 * 16;
        for p in (0..whole).step_by(16) {
            step(p, u16::MAX);
        }
        if whole < t.kc {
            step(whole, (1u16 << (t.kc - whole)) - 1);
        }
        let lanes: __mmask16 = (1 << J) - 1;
        for (i, row) in acc.iter().enumerate() {
            let four = std::array::from_fn(|j| row.get(j).copied().unwrap_or(_mm512_setzero_ps()));
            let mut value = sums_of_four(four);
            let dst = t.c.add(i * t.ldc);
            if t.add {
                value = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, dst), value);
            }
            if let Some(f) = f {
                if let Some(bias) = f.row_bias {
                    value = _mm512_add_ps(value, _mm512_set1_ps(*bias.add(i)));
                }
                if let Some(residual) = f.residual {
                    let r = _mm512_maskz_loadu_ps(lanes, residual.add(i * t.ldc));
                    value = _mm512_add_ps(value, r);
                }
                if f.activation == Some(Activation::Relu) {
                    value = InRegisters::Relu.apply(value);
                }
            }
            _mm512_mask_storeu_ps(dst, lanes, value);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn dots<const R: usize, const J: usize>(_: &Tile, _: Option<&Finish>) {
    unreachable!("`applies` is false without AVX-512")
}

/// Steps `steps` of columns `cols` of `b` into `packed`, as panels of [`NR`] columns (each
/// step's values contiguous), the last panel padded with zeros.
///
/// # Safety
/// The block must lie within `b`; `packed` holds `steps.len()` times `cols.len()` rounded up to
/// whole panels.
unsafe fn pack(b: Strided, steps: Range<usize>, cols: Range<usize>, packed: &mut [f32]) {
    let kc = steps.len();
    let nc = cols.len();
    for panel in 0..nc.div_ceil(NR) {
        let j0 = cols.start + panel * NR;
        let width = NR.min(cols.end - j0);
        let dst = &mut packed[panel * kc * NR..][..kc * NR];
        if b.cs == 1 {
            for (p, row) in dst.chunks_exact_mut(NR).enumerate() {
                // SAFETY: `width` values of step p from column j0, within `b`.
                let src = unsafe {
                    std::slice::from_raw_parts(b.ptr.add((steps.start + p) * b.rs + j0), width)
                };
                row[..width].copy_from_slice(src);
                row[width..].fill(0.0);
            }
        } else {
            // Columns contiguous along the steps (a transposed operand): column by column.
            if width < NR {
                dst.fill(0.0);
            }
            for j in 0..width {
                // SAFETY: column j0 + j, steps `steps`, within `b`.
                let src = unsafe { b.ptr.add(steps.start * b.rs + (j0 + j) * b.cs) };
                for p in 0..kc {
                    // SAFETY: as above.
                    dst[p * NR + j] = unsafe { *src.add(p * b.rs) };
                }
            }
        }
    }
}

/// One microkernel call: `rows` (the kernel's `R`) × `cols` of the output at `c`, from the
/// left operand's rows at `a` and a packed panel at `b`, over `kc` steps.
#[derive(Clone, Copy)]
struct Tile {
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    b: *const f32,
    /// Elements between one step's values of the right operand and the next step's: a
    /// packed panel's [`NR`], or the operand's row stride where it is read in place.
    b_rs: usize,
    kc: usize,
    c: *mut f32,
    ldc: usize,
    /// Valid columns of the panel, 1 to [`NR`].
    cols: usize,
    /// Add the sums to the output's values rather than storing them over.
    add: bool,
    /// Lines of the next block read in place, `ahead.1` of them asked for per 16 steps, or
    /// null.
    ahead: (*mut Ahead, usize),
}

/// [`kernel`] for `rows` rows (1 to [`MR`]) and the `vectors` (1 to 4) of the panel that hold
/// its valid columns: a last panel of a few columns computes only the vectors they reach (of
/// 200 columns, 208, not 256).
///
/// # Safety
/// As for [`kernel`].
unsafe fn dispatch(rows: usize, vectors: usize, t: &Tile) {
    macro_rules! by_vectors {
        ($r:literal) => {
            match vectors {
                4 => kernel::<$r, 4>(t),
                3 => kernel::<$r, 3>(t),
                2 => kernel::<$r, 2>(t),
                _ => kernel::<$r, 1>(t),
            }
        };
    }
    // SAFETY: forwarded from the caller.
    unsafe {
        match rows {
            6 => by_vectors!(6),
            5 => by_vectors!(5),
            4 => by_vectors!(4),
            3 => by_vectors!(3),
            2 => by_vectors!(2),
            _ => by_vectors!(1),
        }
    }
}

/// A tile of the last block of steps, finished: a whole one in registers where its activation
/// is none or ReLU ([`kernel_finished`]), else stored and then finished in L1 by the epilogue
/// a pass over the output would run.
///
/// # Safety
/// As for [`kernel`]; `f`'s operands at the tile's first row and element.
unsafe fn finished(rows: usize, t: &Tile, f: &Finish) {
    let relu = match f.activation {
        None => Some(false),
        Some(Activation::Relu) => Some(true),
        Some(_) => None,
    };
    // SAFETY: forwarded from the caller.
    unsafe {
        match (rows, t.cols, relu, f.residual.is_some()) {
            (MR, NR, Some(relu), residual) => match (relu, residual, f.stream) {
                (false, false, false) => kernel_finished::<false, false, false>(t, f),
                (false, true, false) => kernel_finished::<false, true, false>(t, f),
                (true, false, false) => kernel_finished::<true, false, false>(t, f),
                (true, true, false) => kernel_finished::<true, true, false>(t, f),
                (false, false, true) => kernel_finished::<false, false, true>(t, f),
                (false, true, true) => kernel_finished::<false, true, true>(t, f),
                (true, false, true) => kernel_finished::<true, false, true>(t, f),
                (true, true, true) => kernel_finished::<true, true, true>(t, f),
            },
            _ => {
                dispatch(rows, t.cols.div_ceil(16), t);
                finish_stored(rows, t, f);
            }
        }
    }
}

/// The sums of `R` rows × `V` vectors of a panel over all steps, in `R V` registers. Always
/// inlined into the kernels, whose features it takes.
///
/// # Safety
/// As for [`kernel`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn sums<const R: usize, const V: usize>(t: &Tile) -> [[__m512; V]; R] {
    // SAFETY: in bounds as the caller vouches.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        let offsets: [usize; R] = std::array::from_fn(|i| i * t.a_rs);
        let (mut a, mut b) = (t.a, t.b);
        // One step of the sums (a macro rather than a closure, which would not be compiled
        // with the kernels' features).
        macro_rules! step {
            () => {
                let bv: [__m512; V] = std::array::from_fn(|v| _mm512_loadu_ps(b.add(16 * v)));
                for (row, &offset) in acc.iter_mut().zip(&offsets) {
                    let av = _mm512_set1_ps(*a.add(offset));
                    for (sum, &bv) in row.iter_mut().zip(&bv) {
                        *sum = _mm512_fmadd_ps(av, bv, *sum);
                    }
                }
                a = a.add(t.a_cs);
                b = b.add(t.b_rs);
            };
        }
        if t.ahead.0.is_null() {
            // A plain loop where nothing is asked for: the chunked loop below slows products
            // that need no hints, such as W5a's (see `Ahead`).
            for _ in 0..t.kc {
                step!();
            }
        } else {
            let mut left = t.kc;
            while left > 0 {
                let chunk = left.min(16);
                // The caller's `Ahead`, alive for the block's tiles and touched by this tile
                // alone while it runs.
                (*t.ahead.0).ask(t.ahead.1);
                for _ in 0..chunk {
                    step!();
                }
                left -= chunk;
            }
        }
        acc
    }
}

/// A whole tile ([`MR`] rows × [`NR`] columns) of the last block of steps: its sums, plus the
/// output's values where the tile adds, plus the row's bias, plus the residual (`RES`), through
/// ReLU (`RELU`), stored.
///
/// # Safety
/// As for [`kernel`], and the CPU must have AVX-512DQ too ([`applies`] checks both); `f`'s
/// operands at the tile's first row and element.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn kernel_finished<const RELU: bool, const RES: bool, const STREAM: bool>(
    t: &Tile,
    f: &Finish,
) {
    // SAFETY: in bounds as the caller vouches.
    unsafe {
        let residual = f.residual.unwrap_or(std::ptr::null());
        if RES {
            // The residual's lines, asked for now, arrive while the sums run.
            for i in 0..MR {
                for v in 0..4 {
                    _mm_prefetch::<_MM_HINT_T0>(residual.add(i * t.ldc + 16 * v).cast::<i8>());
                }
            }
        }
        let acc = sums::<MR, 4>(t);
        for (i, row) in acc.iter().enumerate() {
            let bias = _mm512_set1_ps(f.row_bias.map_or(0.0, |b| *b.add(i)));
            for (v, &sum) in row.iter().enumerate() {
                let at = i * t.ldc + 16 * v;
                let dst = t.c.add(at);
                let mut value = if t.add {
                    _mm512_add_ps(_mm512_loadu_ps(dst), sum)
                } else {
                    sum
                };
                if f.row_bias.is_some() {
                    value = _mm512_add_ps(value, bias);
                }
                if let Some(b) = f.col_bias {
                    value = _mm512_add_ps(value, _mm512_loadu_ps(b.add(16 * v)));
                }
                if RES {
                    value = _mm512_add_ps(value, _mm512_loadu_ps(residual.add(at)));
                }
                if RELU {
                    value = InRegisters::Relu.apply(value);
                }
                if STREAM {
                    _mm512_stream_ps(dst, value);
                } else {
                    _mm512_storeu_ps(dst, value);
                }
            }
        }
    }
}

/// `R` rows × `V` vectors of a panel: the sums in `R V` registers over all steps, then added
/// to (or stored over) the output, a last partial vector through a mask.
///
/// # Safety
/// The CPU must have AVX-512F; `t` must address valid operands as [`sgemm`] describes, its
/// valid columns within the `V` vectors.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn kernel<const R: usize, const V: usize>(t: &Tile) {
    // SAFETY: in bounds as the caller vouches.
    unsafe {
        let acc = sums::<R, V>(t);
        for (i, row) in acc.iter().enumerate() {
            let dst = t.c.add(i * t.ldc);
            for (v, &sum) in row.iter().enumerate() {
                let col = 16 * v;
                if col >= t.cols {
                    break;
                }
                let at = dst.add(col);
                if t.cols - col >= 16 {
                    let value = if t.add {
                        _mm512_add_ps(_mm512_loadu_ps(at), sum)
                    } else {
                        sum
                    };
                    _mm512_storeu_ps(at, value);
                } else {
                    let mask: __mmask16 = (1u16 << (t.cols - col)) - 1;
                    let value = if t.add {
                        _mm512_add_ps(_mm512_maskz_loadu_ps(mask, at), sum)
                    } else {
                        sum
                    };
                    _mm512_mask_storeu_ps(at, mask, value);
                }
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn kernel<const R: usize, const V: usize>(_: &Tile) {
    unreachable!("`applies` is false without AVX-512")
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn kernel_finished<const RELU: bool, const RES: bool, const STREAM: bool>(
    _: &Tile,
    _: &Finish,
) {
    unreachable!("`applies` is false without AVX-512")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The product in f64, for comparison.
    fn reference(m: usize, n: usize, k: usize, a: Strided, b: Strided) -> Vec<f64> {
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut sum = 0.0f64;
                for p in 0..k {
                    // SAFETY: within the test's operands.
                    let (x, y) = unsafe {
                        (
                            *a.ptr.add(i * a.rs + p * a.cs),
                            *b.ptr.add(p * b.rs + j * b.cs),
                        )
                    };
                    sum += f64::from(x) * f64::from(y);
                }
                out[i * n + j] = sum;
            }
        }
        out
    }

    /// A `rows × cols` matrix stored row-major, or (where `transposed`) as its transpose.
    fn strided(values: &[f32], rows: usize, cols: usize, transposed: bool) -> Strided {
        let (rs, cs) = if transposed { (1, rows) } else { (cols, 1) };
        Strided {
            ptr: values.as_ptr(),
            rs,
            cs,
        }
    }

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 7919 + seed * 104_729) % 1999) as f32 - 999.0) / 997.0)
            .collect()
    }

    /// Every size class of the blocking (partial row blocks of 1 to 5 rows, partial panels and
    /// partial vectors, dot columns, several blocks of steps and of columns, one step, zero
    /// steps), both
    /// layouts of each operand, the right one packed and read in place, stored and
    /// accumulated, within the sum's rounding of an f64 reference, and nothing written outside
    /// the output's rows.
    #[test]
    fn products_match_an_f64_reference() {
        if !applies(1, 16, 1) {
            kfuse_testkit::skip(
                "products_match_an_f64_reference",
                kfuse_testkit::Prerequisite::Avx512,
                "the CPU lacks AVX-512",
            );
            return;
        }
        let shapes = [
            (1, 16, 1),
            (6, 64, 8),
            (7, 65, 3),
            (13, 100, 37),
            (5, 17, 513),
            (12, 300, 1030),
            (25, 257, 64),
            (3, 31, 0),
            // Packed where the right operand would otherwise be read in place: more rows than
            // `IN_PLACE_ROWS`, and rows a multiple of 512 values apart.
            (300, 130, 20),
            (4, 512, 9),
            // In place: with no steps, a partial panel and several blocks of steps.
            (3, 64, 0),
            (13, 160, 37),
            (12, 320, 1030),
            // Dot columns (1 to 8 past the last whole vector): 8 of them over several blocks
            // of steps and a partial vector of steps, beside a single whole vector, and a 14×14
            // image's 196 positions.
            (9, 200, 1030),
            (6, 24, 17),
            (11, 196, 256),
        ];
        for &(m, n, k) in &shapes {
            for (ta, tb, accumulate) in [
                (false, false, false),
                (true, false, false),
                (false, true, true),
                (true, true, false),
            ] {
                let (av, bv) = (values(m * k, 1), values(k * n, 2));
                let (a, b) = (strided(&av, m, k, ta), strided(&bv, k, n, tb));
                // A row stride wider than the output's, with guards past each row.
                let ldc = n + 3;
                let start: Vec<f32> = (0..m * ldc).map(|i| (i % 5) as f32 * 0.25).collect();
                let mut c = start.clone();
                // SAFETY: the operands above, and the CPU checked.
                unsafe {
                    sgemm(
                        [m, n, k],
                        a,
                        b,
                        (c.as_mut_ptr(), ldc),
                        accumulate,
                        &Finish::default(),
                    )
                };
                let want = reference(m, n, k, a, b);
                for i in 0..m {
                    for j in 0..ldc {
                        let got = c[i * ldc + j];
                        if j >= n {
                            assert_eq!(got, start[i * ldc + j], "{m}x{n}x{k}: guard touched");
                            continue;
                        }
                        let base = if accumulate {
                            start[i * ldc + j] as f64
                        } else {
                            0.0
                        };
                        let expect = base + want[i * n + j];
                        let bound = 1e-6 * (k as f64 + 1.0) * (1.0 + expect.abs());
                        assert!(
                            (got as f64 - expect).abs() <= bound,
                            "{m}x{n}x{k} ta={ta} tb={tb} at ({i}, {j}): {got} against {expect}"
                        );
                    }
                }
            }
        }
    }

    /// The finish in registers (bias per row or per column, residual, ReLU or none; whole tiles,
    /// edge tiles and dot columns, several blocks of steps, a product of no steps) gives bit for
    /// bit what storing the product and running the epilogue pass over it gives, NaN,
    /// infinities and signed zeros included; the other activations take the
    /// stored-then-finished route, also bit for bit.
    #[test]
    fn a_finished_product_is_the_product_then_its_epilogue() {
        if !applies(1, 16, 1) {
            kfuse_testkit::skip(
                "a_finished_product_is_the_product_then_its_epilogue",
                kfuse_testkit::Prerequisite::Avx512,
                "the CPU lacks AVX-512",
            );
            return;
        }
        // The last two finishes take a bias per column instead of per row.
        let activations = [
            None,
            Some(Activation::Relu),
            Some(Activation::Sigmoid),
            Some(Activation::Relu),
            Some(Activation::Relu),
            Some(Activation::Sigmoid),
        ];
        for (case, &(m, n, k)) in [
            (12, 128, 64),
            (13, 100, 37),
            (7, 200, 600),
            (6, 64, 700),
            (7, 70, 0),
            (1, 16, 3),
        ]
        .iter()
        .enumerate()
        {
            let (av, bv) = (values(m * k, 3), values(k * n, 4));
            let (a, b) = (strided(&av, m, k, false), strided(&bv, k, n, false));
            let mut bias = values(m, 5);
            let mut col_bias = values(n, 7);
            col_bias[n - 1] = f32::INFINITY;
            let mut residual = values(m * n, 6);
            bias[0] = -0.0;
            residual[1] = f32::NAN;
            residual[2] = f32::NEG_INFINITY;
            residual[n.min(3)] = -0.0;
            for (which, &activation) in activations.iter().enumerate() {
                // The third finish streams its whole tiles (rows of 16-multiple widths, the
                // output on a cache line).
                let finish = Finish {
                    row_bias: (which != 1 && which < 4).then_some(bias.as_ptr()),
                    col_bias: (which >= 4).then_some(col_bias.as_ptr()),
                    residual: (which >= 1 && which != 5).then_some(residual.as_ptr()),
                    activation,
                    stream: which == 3,
                };
                let mut buffer = vec![0.0f32; m * n + 16];
                let line = buffer.as_ptr().align_offset(64);
                let got = &mut buffer[line..][..m * n];
                let mut want = vec![0.0f32; m * n];
                // SAFETY: the operands above, and the CPU checked.
                unsafe {
                    sgemm([m, n, k], a, b, (got.as_mut_ptr(), n), false, &finish);
                    sgemm(
                        [m, n, k],
                        a,
                        b,
                        (want.as_mut_ptr(), n),
                        false,
                        &Finish::default(),
                    );
                }
                for (i, row) in want.chunks_mut(n).enumerate() {
                    let tail = Tail {
                        bias: match (finish.row_bias, finish.col_bias) {
                            (Some(_), _) => RowBias::Same(bias[i]),
                            (None, Some(_)) => RowBias::Each(&col_bias),
                            (None, None) => RowBias::None,
                        },
                        scale: RowBias::None,
                        residual: finish.residual.map(|_| &residual[i * n..][..n]),
                        activation,
                    };
                    epilogue(row, tail);
                }
                for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        w.to_bits(),
                        "case {case}, finish {which}, element {j}: {g} against {w}"
                    );
                }
            }
        }
    }

    /// NaN and infinities reach exactly the outputs whose sums hold them; the zero padding of a
    /// partial panel never leaks a NaN (0 × inf) into a stored column.
    #[test]
    fn special_values_reach_only_their_outputs() {
        if !applies(1, 16, 1) {
            kfuse_testkit::skip(
                "special_values_reach_only_their_outputs",
                kfuse_testkit::Prerequisite::Avx512,
                "the CPU lacks AVX-512",
            );
            return;
        }
        let (m, n, k) = (7, 20, 5);
        let mut a = vec![1.0f32; m * k];
        let mut b = vec![0.5f32; k * n];
        a[2 * k + 1] = f32::INFINITY; // row 2: +inf where b is positive
        b[3 * n + 7] = f32::NAN; // column 7
        let mut c = vec![0.0f32; m * n];
        // SAFETY: the operands above, and the CPU checked.
        unsafe {
            sgemm(
                [m, n, k],
                Strided {
                    ptr: a.as_ptr(),
                    rs: k,
                    cs: 1,
                },
                Strided {
                    ptr: b.as_ptr(),
                    rs: n,
                    cs: 1,
                },
                (c.as_mut_ptr(), n),
                false,
                &Finish::default(),
            )
        };
        for i in 0..m {
            for j in 0..n {
                let v = c[i * n + j];
                if j == 7 {
                    assert!(v.is_nan(), "({i}, {j}) = {v}");
                } else if i == 2 {
                    assert_eq!(v, f32::INFINITY, "({i}, {j})");
                } else {
                    assert_eq!(v, 2.5, "({i}, {j})");
                }
            }
        }
    }
}
