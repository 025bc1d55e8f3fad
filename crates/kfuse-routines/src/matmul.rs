//! Matrix products on a single-threaded GEMM per task (`dense::gemm_into`: kfuse's own for f32
//! on AVX-512, else the `gemm` crate), for fast numerics.
//!
//! `gemm` blocks and uses fused multiply-adds, so its sums are not bit-identical to the reference
//! interpreter's sequential `k` loop: strict numerics keep the reference matmul.

use kfuse_ir::{bf16, f16, DType, Shape, Storage};

use crate::dense::{widen_half, with_scratch, Out, Real, View};
use crate::epilogue::{
    epilogue as apply_epilogue, epilogue_operand, epilogue_rounded, Activation, Epilogue, RowBias,
    Tail, Widened,
};
use crate::gemm::{gemm_finished, gemm_into, Init};
use crate::Pool;

/// Bytes of a block of output columns (all rows) that a task computes: about one core's L2, so
/// that the epilogue's pass finds the block in cache.
const TILE_BYTES: usize = 1024 << 10;

/// Whether [`matmul`] handles this operand dtype.
pub fn supported(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F64)
}

/// Whether [`matmul`] writes a product computed in `compute` into an output of dtype `out`:
/// its own dtype, or another float dtype it is cast to.
pub fn writes(compute: DType, out: DType) -> bool {
    match compute {
        // Rounded to their own dtype (or cast from it, as the IR casts the rounded product).
        DType::F16 | DType::BF16 => out.is_float(),
        _ => supported(compute) && out.is_float(),
    }
}

/// An element type a product computed in `T` is written as: `T` itself, or another float
/// type the product is cast to as its epilogue's last step, rounding to nearest as the IR's
/// `cast` does (and through the same conversions, so the cast itself adds no difference).
trait Output<T>: Copy + Send + Sync + 'static {
    /// `dst[i] = cast(src[i])`.
    fn convert(src: &[T], dst: &mut [Self]);
}

impl<T: Real> Output<T> for T {
    fn convert(src: &[T], dst: &mut [T]) {
        dst.copy_from_slice(src);
    }
}

impl Output<f32> for f64 {
    fn convert(src: &[f32], dst: &mut [f64]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = f64::from(s);
        }
    }
}

impl Output<f64> for f32 {
    fn convert(src: &[f64], dst: &mut [f32]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s as f32;
        }
    }
}

impl Output<f32> for f16 {
    fn convert(src: &[f32], dst: &mut [f16]) {
        crate::simd::f16_from_f32_slice(src, dst);
    }
}

impl Output<f32> for bf16 {
    fn convert(src: &[f32], dst: &mut [bf16]) {
        crate::simd::bf16_from_f32_slice(src, dst);
    }
}

impl Output<f64> for f16 {
    fn convert(src: &[f64], dst: &mut [f16]) {
        // One rounding from f64, as the IR's cast does (element by element, as it does).
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = f16::from_f64(s);
        }
    }
}

impl Output<f64> for bf16 {
    fn convert(src: &[f64], dst: &mut [bf16]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = bf16::from_f64(s);
        }
    }
}

/// Whether `U` is `T` (the product is then computed where it is written).
fn same<T: 'static, U: 'static>() -> bool {
    std::any::TypeId::of::<T>() == std::any::TypeId::of::<U>()
}

/// The scale factors of columns `cols`: the one factor for all, or each column's.
fn factors<T: Copy>(scale: Option<&[T]>, cols: std::ops::Range<usize>) -> RowBias<'_, T> {
    match scale {
        None => RowBias::None,
        Some(&[s]) => RowBias::Same(s),
        Some(s) => RowBias::Each(&s[cols]),
    }
}

/// `[..., M, K] @ [..., K, N]` with numpy batch broadcasting, for f32 and f64 operands, written
/// into `out` (the output's element count; its contents are overwritten). Operands are read
/// where they live, without copies. An operand marked in `transposed` is given as its source
/// `[..., K, M]` (or `[..., N, K]`) and read through swapped strides. The epilogue (a bias per
/// column, a scale, a residual of the output's shape, an activation) is applied to each task's
/// block right after its GEMM. An output of another float dtype than the operands' is a cast
/// after the epilogue: each task computes its block in a scratch tile in cache and writes it
/// converted. One-row products take a GEMV path.
pub fn matmul(
    a: View,
    b: View,
    transposed: [bool; 2],
    out_dims: &[usize],
    out: &mut Storage,
    epilogue: &Epilogue,
    threads: usize,
) -> Result<(), String> {
    let bf16 = match a.storage.dtype() {
        DType::BF16 => true,
        DType::F16 => false,
        _ => return matmul_as(a, b, transposed, (out_dims, out), epilogue, threads, None),
    };
    // f16 and bf16: the IR's product of the operands widened to f32, each op's result
    // rounded to the half dtype (the epilogue rounds them, the output's conversion is then
    // exact).
    let (wa, wb) = (widen_half(a.storage)?, widen_half(b.storage)?);
    let wide = Widened::of(epilogue)?;
    matmul_as(
        View {
            storage: &wa,
            dims: a.dims,
        },
        View {
            storage: &wb,
            dims: b.dims,
        },
        transposed,
        (out_dims, out),
        &wide.epilogue(),
        threads,
        Some(bf16),
    )
}

/// [`matmul`] of f32 or f64 operands, each result rounded to bf16 (`round` true) or f16
/// (false) after every step where `round` is given.
fn matmul_as(
    a: View,
    b: View,
    transposed: [bool; 2],
    (out_dims, out): (&[usize], &mut Storage),
    epilogue: &Epilogue,
    threads: usize,
    round: Option<bool>,
) -> Result<(), String> {
    let swap = |dims: &[usize], t: bool| {
        let mut d = dims.to_vec();
        let r = d.len();
        if t {
            d.swap(r - 2, r - 1);
        }
        d
    };
    let (a_dims, b_dims) = (swap(a.dims, transposed[0]), swap(b.dims, transposed[1]));
    let (ra, rb) = (a_dims.len(), b_dims.len());
    let (m, k) = (a_dims[ra - 2], a_dims[ra - 1]);
    let n = b_dims[rb - 1];
    let rank = out_dims.len();
    let batch = Shape::new(out_dims[..rank - 2].to_vec());
    let out_elems: usize = out_dims.iter().product();
    if out.len() != out_elems {
        return Err(format!(
            "the output holds {} elements, not {out_elems}",
            out.len()
        ));
    }
    // Batch offsets of each operand, in matrices, for every output batch index.
    let batch_offsets = |shape: &Shape, r: usize| -> Vec<usize> {
        let own = Shape::new(shape.dims()[..r - 2].to_vec());
        let strides = own.strides();
        let skip = batch.rank() - own.rank();
        (0..batch.n_elems())
            .map(|flat| {
                let mut rest = flat;
                let mut offset = 0;
                for axis in (0..batch.rank()).rev() {
                    let coord = rest % batch.dims()[axis];
                    rest /= batch.dims()[axis];
                    if axis >= skip && own.dims()[axis - skip] != 1 {
                        offset += coord * strides[axis - skip];
                    }
                }
                offset
            })
            .collect()
    };
    let (oa, ob) = (
        batch_offsets(&Shape::new(a_dims.clone()), ra),
        batch_offsets(&Shape::new(b_dims.clone()), rb),
    );
    // Tasks on the kernel pool, each running a single-threaded GEMM. Where the rows are few
    // enough that a block of at least 64 columns fits in L2, a task is a block of columns over
    // all rows: an activation then runs on the block right after its GEMM, while it is in
    // cache. Blocks of columns repack the left operand per block, which is cheap when the rows
    // are few, and split the right operand's packing between the threads; blocks of rows
    // would each repack the whole right operand, and measured slower on W5a's bare GEMM
    // (`docs/structured-ops.md`, "Routines": `matmul`). Small products are split only if a
    // pass over the output (an activation, a scale or a residual) wants the blocks.
    // Otherwise (tall matrices, narrow outputs, and large products with a pass after a short
    // sum) the rows of every batch matrix are split across the threads when the product is
    // large enough to pay for a split, and the pass follows on each task's rows: in bands that
    // fit in cache where there is a pass.
    let elem = a.storage.dtype().size_bytes();
    let large = threads > 1 && m * n * k >= 1 << 22;
    // A cast is a pass too: each task converts its block.
    let cast = out.dtype() != a.storage.dtype();
    let pass = epilogue.activation.is_some()
        || epilogue.residual.is_some()
        || epilogue.scale.is_some()
        || cast
        || round.is_some();
    let by_cache = (TILE_BYTES / (m.max(1) * elem)) / 64 * 64;
    // With a pass and a short sum (K below 256), the product is bound by memory rather than
    // arithmetic, and bands of whole rows that fit in cache, the pass following each, beat
    // column blocks (whose rows are strided); from K = 256 the column blocks lead
    // (`docs/structured-ops.md`, "Routines": `matmul`).
    let short = k < 256;
    // Column blocks for a pass after a long sum, or for a large product without a pass.
    let columns = if pass { !short } else { large };
    let block_cols = if columns && m > 1 && n >= 128 && by_cache >= 64 {
        let by_balance = n.div_ceil(threads.max(1)).div_ceil(64) * 64;
        Some(if large {
            by_cache.min(by_balance)
        } else {
            by_cache
        })
    } else {
        None
    };
    let (chunks, rows, cols) = match block_cols {
        Some(cols) => (n.div_ceil(cols), m, cols),
        None => {
            let chunks = if (large && pass) || cast {
                // Bands of rows that stay in cache for the pass (and bound a cast's scratch
                // tile).
                let by_cache = (TILE_BYTES / (n.max(1) * elem)).max(16);
                let bands = m.div_ceil(by_cache);
                if large {
                    bands.max(threads)
                } else {
                    bands
                }
            } else if large {
                threads.min(m.div_ceil(16)).max(1)
            } else {
                1
            };
            (chunks, m.div_ceil(chunks), n)
        }
    };
    /// The per-task work: rows r0..r1 and columns c0..c1 of batch matrix bi (one of the two
    /// ranges is whole), then the epilogue on them.
    struct Plan<'a, T> {
        m: usize,
        k: usize,
        n: usize,
        rows: usize,
        cols: usize,
        chunks: usize,
        transposed: [bool; 2],
        oa: &'a [usize],
        ob: &'a [usize],
        bias: Option<&'a [T]>,
        /// One factor per column, or one for all, multiplied after the bias.
        scale: Option<&'a [T]>,
        /// The whole output's worth of residual values, added after the bias.
        residual: Option<&'a [T]>,
        activation: Option<Activation>,
        /// Round each step's result to bf16 (true) or f16.
        round: Option<bool>,
    }
    fn run<T: Real, U: Output<T>>(x: &[T], y: &[T], c: &mut [U], plan: &Plan<T>) {
        let Plan {
            m,
            k,
            n,
            rows,
            cols,
            chunks,
            transposed,
            oa,
            ob,
            bias,
            scale,
            residual,
            activation,
            round,
        } = *plan;
        let dst = Out(c.as_mut_ptr());
        // Strides of A (M x K) and B (K x N) as stored.
        let (a_rs, a_cs) = if transposed[0] { (1, m) } else { (k, 1) };
        let (b_rs, b_cs) = if transposed[1] { (1, k) } else { (n, 1) };
        let by_columns = cols < n;
        let in_place = same::<T, U>();
        Pool::global().run(oa.len() * chunks, &|task| {
            let (bi, chunk) = (task / chunks, task % chunks);
            let (r0, r1, c0, c1) = if by_columns {
                (0, m, chunk * cols, ((chunk + 1) * cols).min(n))
            } else {
                (chunk * rows, ((chunk + 1) * rows).min(m), 0, n)
            };
            if r0 >= r1 || c0 >= c1 {
                return;
            }
            let lhs = x[oa[bi] * m * k + r0 * a_rs..].as_ptr();
            let gemv_path = r1 - r0 == 1 && !transposed[1] && !by_columns;
            // Columns c0..c1 of the task's rows: the product and the epilogue into `at`, rows
            // `ld` apart.
            // SAFETY (of the calls): the operands hold an M x K and a K x N matrix with these
            // strides at these offsets (shapes checked by inference); `at` addresses this task's
            // block alone, `r1 - r0` rows of `c1 - c0` elements `ld` apart.
            let compute = |at: *mut T, ld: usize, c0: usize, c1: usize| unsafe {
                let rhs = y[ob[bi] * k * n + c0 * b_cs..].as_ptr();
                let bias = bias.map(|b| &b[c0..c1]);
                let width = c1 - c0;
                // With an activation, a scale or a residual to apply in a pass over the output
                // anyway, the bias joins that pass; so it does on a block of columns, which is
                // in cache after its GEMM; otherwise it is pre-filled into the GEMM's
                // destination. Rounded steps add it in the pass, after rounding the product.
                // Pre-filled, the GEMM reads the block back as it accumulates, which measured
                // slower than the pass (`docs/structured-ops.md`, "Routines": `matmul`).
                let pass = activation.is_some()
                    || residual.is_some()
                    || scale.is_some()
                    || round.is_some()
                    || (bias.is_some() && by_columns);
                let bias_in_pass = pass && (!gemv_path || round.is_some());
                // f32 on kfuse's GEMM with a bias, a residual and ReLU (or some of them): each
                // tile takes them in registers as it is stored, and no pass follows, so W5a
                // costs its bare GEMM's time (`docs/benchmarks.md`, "W5a and W5b: dense layers").
                let finished = !gemv_path
                    && (bias.is_some() || residual.is_some() || activation.is_some())
                    && scale.is_none()
                    && round.is_none()
                    && (residual.is_none() || ld == n)
                    && gemm_finished(
                        [r1 - r0, width, k],
                        (at, ld),
                        (lhs, a_rs, a_cs),
                        (rhs, b_rs, b_cs),
                        bias,
                        residual.map(|res| res[bi * m * n + r0 * n + c0..].as_ptr()),
                        activation,
                    );
                if finished {
                    return;
                }
                if gemv_path {
                    gemv(k, n, lhs, a_cs, rhs, at, bias.filter(|_| !bias_in_pass));
                } else {
                    let init = match bias {
                        Some(b) if !bias_in_pass => Init::ColumnBias(b),
                        _ => Init::Zero,
                    };
                    gemm_into(
                        r1 - r0,
                        width,
                        k,
                        at,
                        ld,
                        1,
                        lhs,
                        a_rs,
                        a_cs,
                        rhs,
                        b_rs,
                        b_cs,
                        init,
                    );
                }
                if pass {
                    let row_bias = match bias {
                        Some(b) if bias_in_pass => RowBias::Each(b),
                        _ => RowBias::None,
                    };
                    for r in r0..r1 {
                        let first = bi * m * n + r * n + c0;
                        let row = std::slice::from_raw_parts_mut(at.add((r - r0) * ld), width);
                        let tail = Tail {
                            bias: row_bias,
                            scale: factors(scale, c0..c1),
                            residual: residual.map(|res| &res[first..][..width]),
                            activation,
                        };
                        match round {
                            Some(bf16) => epilogue_rounded(row, tail, bf16),
                            None => apply_epilogue(row, tail),
                        }
                    }
                }
            };
            let at = |r: usize, c: usize| bi * m * n + r * n + c;
            if in_place {
                // `U` is `T`: the block is computed where it is written, rows `n` apart.
                compute(dst.ptr().wrapping_add(at(r0, c0)).cast::<T>(), n, c0, c1);
                return;
            }
            // A cast: the block is computed in a scratch tile and written converted. A band of
            // whole rows goes in runs of columns whose tile takes a quarter of L2 (the GEMM's
            // packed right operand needs the rest), each run repacking only the band's few
            // rows of the left operand; a block of columns goes whole (runs of it would each
            // repack all rows of the left operand).
            let step = if by_columns || gemv_path {
                c1 - c0
            } else {
                (TILE_BYTES / 4 / ((r1 - r0) * std::mem::size_of::<T>()) / 16 * 16).max(16)
            };
            with_scratch::<T, _>((r1 - r0) * step.min(c1 - c0), |tile| {
                for s0 in (c0..c1).step_by(step) {
                    let s1 = (s0 + step).min(c1);
                    let width = s1 - s0;
                    compute(tile.as_mut_ptr(), width, s0, s1);
                    for (r, row) in tile.chunks_exact(width).take(r1 - r0).enumerate() {
                        // SAFETY: row r0 + r, columns s0..s1 of the task's block, its alone.
                        let out = unsafe {
                            std::slice::from_raw_parts_mut(dst.ptr().add(at(r0 + r, s0)), width)
                        };
                        U::convert(row, out);
                    }
                }
            });
        });
    }
    if m * n == 0 {
        return Ok(());
    }
    macro_rules! plan {
        ($t:ty) => {
            Plan::<$t> {
                m,
                k,
                n,
                rows,
                cols,
                chunks,
                transposed,
                oa: &oa,
                ob: &ob,
                bias: epilogue_operand(epilogue.bias, n, "bias")?,
                scale: epilogue_operand(
                    epilogue.scale,
                    if epilogue.scale.is_some_and(|s| s.len() == 1) {
                        1
                    } else {
                        n
                    },
                    "scale",
                )?,
                residual: epilogue_operand(epilogue.residual, out_elems, "residual")?,
                activation: epilogue.activation,
                round,
            }
        };
    }
    /// An empty sum is zero (gemm is not asked to define it); the epilogue still applies.
    fn empty_sum<T: Real, U: Output<T>>(c: &mut [U], n: usize, plan: &Plan<T>) {
        let mut row = vec![T::ZERO; n];
        for (i, out) in c.chunks_mut(n).enumerate() {
            row.fill(T::ZERO);
            let tail = Tail {
                bias: plan.bias.map_or(RowBias::None, RowBias::Each),
                scale: factors(plan.scale, 0..n),
                residual: plan.residual.map(|r| &r[i * n..][..n]),
                activation: plan.activation,
            };
            match plan.round {
                Some(bf16) => epilogue_rounded(&mut row, tail, bf16),
                None => apply_epilogue(&mut row, tail),
            }
            U::convert(&row, out);
        }
    }
    macro_rules! go {
        ($x:expr, $y:expr, $c:expr, $t:ty) => {{
            let plan = plan!($t);
            if k == 0 {
                empty_sum($c, n, &plan)
            } else {
                run($x, $y, $c, &plan)
            }
        }};
    }
    match (a.storage, b.storage, out) {
        (Storage::F32(x), Storage::F32(y), Storage::F32(c)) => go!(x, y, c, f32),
        (Storage::F32(x), Storage::F32(y), Storage::F64(c)) => go!(x, y, c, f32),
        (Storage::F32(x), Storage::F32(y), Storage::F16(c)) => go!(x, y, c, f32),
        (Storage::F32(x), Storage::F32(y), Storage::BF16(c)) => go!(x, y, c, f32),
        (Storage::F64(x), Storage::F64(y), Storage::F64(c)) => go!(x, y, c, f64),
        (Storage::F64(x), Storage::F64(y), Storage::F32(c)) => go!(x, y, c, f64),
        (Storage::F64(x), Storage::F64(y), Storage::F16(c)) => go!(x, y, c, f64),
        (Storage::F64(x), Storage::F64(y), Storage::BF16(c)) => go!(x, y, c, f64),
        (x, y, c) => {
            return Err(format!(
                "gemm matmul computes f32 and f64 products into float outputs, not {} @ {} into {}",
                x.dtype(),
                y.dtype(),
                c.dtype()
            ))
        }
    }
    Ok(())
}

/// One row times a matrix, `y = bias + x B` with `x` strided by `x_stride` and `B` row-major
/// K x N: accumulates rows of `B` scaled by `x[k]`, a memory-bound sweep that vectorizes along N.
///
/// # Safety
/// `x` addresses K elements at stride `x_stride`, `b` a K x N row-major matrix, `y` N writable
/// elements not overlapping the others.
unsafe fn gemv<T: Real>(
    k: usize,
    n: usize,
    x: *const T,
    x_stride: usize,
    b: *const T,
    y: *mut T,
    bias: Option<&[T]>,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        let y = std::slice::from_raw_parts_mut(y, n);
        match bias {
            Some(bias) => y.copy_from_slice(bias),
            None => y.fill(T::ZERO),
        }
        for kk in 0..k {
            let xv = *x.add(kk * x_stride);
            let row = std::slice::from_raw_parts(b.add(kk * n), n);
            for (acc, bv) in y.iter_mut().zip(row) {
                *acc = acc.add(xv.mul(*bv));
            }
        }
    }
}
