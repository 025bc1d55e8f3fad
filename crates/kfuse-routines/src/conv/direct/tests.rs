//! Each routine's outputs against their sums of products, and streamed stores against
//! ordinary ones.

use super::fused::separable_stored;
use super::packing::pack_afresh;
use super::*;
use crate::dense::has_avx512;
use crate::prefetch::weights_ahead;
use crate::simd::InRegisters;

use crate::epilogue::Activation;
use kfuse_ir::{Conv2dAttrs, Layout};

/// Strided convolutions on the phase planes: each output within rounding of its sum, then the
/// epilogue, over strides 2 and 3 (and different per axis), kernels from 2×2 to 7×7 (the stem's 7×7
/// at stride 2 with 3 channels), dilation with a stride, groups, odd and asymmetric padding, odd
/// sizes, an output of one pixel, an output large enough to be streamed, and subnormals and signed
/// zeros in the input. Columns of more than [`PACK_COLUMN`](super::packing::PACK_COLUMN) bytes (32
/// channels × 9 taps, 16 × 25) are copied before their blocks run, the last block of positions
/// partial.
#[test]
fn strided_convolutions_match_their_sums() {
    check_against_sums(&[
        (1, 32, 24, 6, 57, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
        (2, 16, 16, 9, 61, 5, 5, [2, 2], [1, 1], 1, [2, 2, 2, 2]),
        (2, 8, 16, 13, 15, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
        (1, 3, 12, 23, 21, 7, 7, [2, 2], [1, 1], 1, [3, 3, 3, 3]),
        (1, 5, 9, 10, 11, 3, 3, [3, 3], [1, 1], 1, [1, 0, 2, 1]),
        (1, 4, 8, 9, 17, 3, 3, [1, 2], [1, 1], 1, [1, 1, 1, 1]),
        (1, 4, 8, 17, 9, 3, 3, [2, 1], [1, 1], 1, [0, 0, 0, 0]),
        (1, 6, 10, 15, 15, 3, 3, [2, 2], [2, 2], 1, [2, 2, 2, 2]),
        (2, 8, 12, 12, 12, 3, 3, [2, 2], [1, 1], 2, [1, 1, 1, 1]),
        (1, 4, 6, 8, 8, 2, 2, [2, 2], [1, 1], 1, [0, 0, 0, 0]),
        (1, 7, 9, 3, 3, 3, 3, [2, 2], [1, 1], 1, [0, 0, 0, 0]),
        // 16.8 MB of output: copied out of the stage with streaming stores.
        (1, 1, 64, 512, 512, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
    ]);
}

/// Strided convolutions with positions broadcast ([`broadcast_positions`]): rows of 28
/// and more outputs in blocks of seven (a last partial block), 3×3 and 5×5 filters, a row
/// stride of 1 and of 2, asymmetric padding, several blocks of 32 output channels and bands
/// of rows with a partial last one, each output within rounding of its sum, then the
/// epilogue (the residual after the band's rows).
#[test]
fn broadcast_positions_match_their_sums() {
    let cases = [
        (2, 16, 32, 57, 61, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
        (1, 24, 64, 56, 56, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
        (1, 16, 32, 60, 62, 5, 5, [2, 2], [1, 1], 1, [2, 2, 2, 2]),
        (1, 16, 32, 30, 60, 3, 3, [1, 2], [1, 1], 1, [1, 1, 1, 1]),
        (1, 20, 32, 31, 63, 3, 3, [2, 2], [1, 1], 1, [1, 0, 2, 1]),
    ];
    for case in cases.iter().filter(|_| has_avx512()) {
        assert!(route::broadcasts_positions(&geometry_of(case)), "{case:?}");
    }
    check_against_sums(&cases);
}

/// Strided convolutions onto rows of at least `route::TAP_PLANES_BELOW` run on phase planes,
/// narrower ones on tap planes: both sides of that line, odd sizes, a 5×5 filter with
/// uneven padding, dilation, stride 3 and unequal strides, groups, strided 1×1
/// convolutions with and without padding, last blocks of a few positions (the tail
/// kernel), and small images at batch 1 (whose tasks split the output channels).
#[test]
fn strided_convolutions_on_either_planes_match_their_sums() {
    let cases = [
        (1, 4, 8, 61, 59, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
        (1, 3, 10, 40, 63, 5, 5, [2, 2], [1, 1], 1, [2, 1, 2, 0]),
        (1, 4, 8, 64, 60, 3, 3, [2, 2], [2, 2], 1, [2, 2, 2, 2]),
        (2, 6, 12, 29, 55, 3, 3, [2, 2], [1, 1], 2, [1, 1, 1, 1]),
        (2, 6, 12, 29, 53, 3, 3, [2, 2], [1, 1], 2, [1, 1, 1, 1]),
        (2, 5, 9, 21, 33, 5, 5, [3, 3], [1, 1], 1, [2, 2, 1, 1]),
        (1, 4, 8, 17, 40, 3, 3, [1, 2], [1, 1], 1, [1, 1, 1, 1]),
        (1, 4, 8, 40, 17, 3, 3, [2, 1], [1, 1], 1, [0, 1, 2, 0]),
        (1, 16, 40, 14, 14, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
        (3, 16, 24, 13, 13, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
        (2, 8, 16, 31, 31, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
        (2, 64, 72, 13, 15, 1, 1, [2, 2], [1, 1], 1, [0, 0, 0, 0]),
        (1, 64, 64, 14, 14, 1, 1, [2, 2], [1, 1], 1, [1, 0, 1, 0]),
        (1, 64, 80, 11, 9, 1, 1, [3, 2], [1, 1], 1, [0, 0, 0, 0]),
        // Columns copied into contiguous runs (`PACK_COLUMN`), a tail block of one
        // position left in place.
        (1, 24, 16, 33, 33, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
        // Tail blocks of one and of four positions over an odd number of terms (channels
        // times taps), which the tail kernel takes in pairs but for the last.
        (1, 5, 12, 14, 14, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
        (2, 3, 10, 28, 28, 3, 3, [2, 2], [1, 1], 1, [1, 1, 1, 1]),
    ];
    let (mut phase, mut tap) = (0, 0);
    for case in &cases {
        if route::on_tap_planes(&geometry_of(case)) {
            tap += 1;
        } else {
            phase += 1;
        }
    }
    assert!(
        phase >= 4 && tap >= 8,
        "{phase} on phase planes, {tap} on tap planes"
    );
    check_against_sums(&cases);
}

/// Same-width convolutions of small images, whose tasks each take a whole image and a
/// share of its output channels (batch 1 to 3; the residual's part of the epilogue runs
/// over each task's channels only), and weights large enough to be read a block of output
/// channels at a time (128 → 136 channels, 3×3: 627 KB), with last position blocks of one
/// and two vectors; columns copied into contiguous runs in both orders (`PACK_COLUMN`).
#[test]
fn small_images_and_large_weights_match_their_sums() {
    check_against_sums(&[
        (1, 16, 40, 7, 7, 3, 3, [1, 1], [1, 1], 1, [1, 1, 1, 1]),
        (3, 8, 24, 5, 9, 3, 3, [1, 1], [1, 1], 1, [1, 1, 1, 1]),
        (2, 12, 20, 1, 1, 3, 3, [1, 1], [1, 1], 2, [1, 1, 1, 1]),
        (1, 128, 136, 6, 6, 3, 3, [1, 1], [1, 1], 1, [1, 1, 1, 1]),
        (2, 128, 136, 20, 20, 3, 3, [1, 1], [1, 1], 1, [1, 1, 1, 1]),
        (1, 8, 16, 15, 15, 5, 5, [1, 1], [2, 2], 1, [4, 4, 4, 4]),
        // Columns copied into contiguous runs through the taps' masks (`PACK_COLUMN`),
        // with dilation, positions outside the image, and a last partial block.
        (1, 24, 16, 9, 9, 3, 3, [1, 1], [1, 1], 1, [1, 1, 1, 1]),
        (2, 24, 24, 10, 11, 3, 3, [1, 1], [2, 2], 1, [2, 2, 2, 2]),
    ]);
}

/// 1×1 convolutions of 256+ channels onto small images (`route::narrow_pointwise`): a last
/// block of one position (7×7), of 35 (three vectors, masked), output channels short of a
/// block, and batch 1 (tasks splitting the output channels).
#[test]
fn narrow_pointwise_convolutions_match_their_sums() {
    let cases = [
        (3, 256, 256, 7, 7, 1, 1, [1, 1], [1, 1], 1, [0, 0, 0, 0]),
        (2, 264, 270, 5, 7, 1, 1, [1, 1], [1, 1], 1, [0, 0, 0, 0]),
        (1, 256, 300, 6, 9, 1, 1, [1, 1], [1, 1], 1, [0, 0, 0, 0]),
    ];
    for case in &cases {
        assert!(route::narrow_pointwise(&geometry_of(case)), "{case:?}");
    }
    check_against_sums(&cases);
}

/// 1×1 convolutions on [`pointwise`] (a copy of each band's input rows, projected by the
/// microkernel one column of positions at a time): at stride 1 and 2, several bands and
/// columns, a last partial column, output channels short of a block, and each epilogue,
/// the residual among them added in registers.
#[test]
fn pointwise_convolutions_on_a_copy_match_their_sums() {
    check_run_against_sums(
        &[
            (2, 64, 72, 29, 29, 1, 1, [2, 2], [1, 1], 1, [0, 0, 0, 0]),
            (3, 64, 70, 28, 30, 1, 1, [2, 2], [1, 1], 1, [0, 0, 0, 0]),
            (1, 40, 24, 9, 9, 1, 1, [1, 1], [1, 1], 1, [0, 0, 0, 0]),
            (2, 16, 20, 30, 30, 1, 1, [1, 1], [1, 1], 1, [0, 0, 0, 0]),
            (1, 7, 9, 1, 1, 1, 1, [1, 1], [1, 1], 1, [0, 0, 0, 0]),
        ],
        pointwise,
    );
}

/// Same-width convolutions whose last block of positions holds 1 to 7 of them, which the
/// tail kernel computes with vectors over output channels: every tail size, groups,
/// dilation, output channels short of a block, and a single position.
#[test]
fn last_blocks_of_few_positions_match_their_sums() {
    check_against_sums(&[
        (2, 9, 13, 5, 10, 3, 3, [1, 1], [1, 1], 1, [1, 1, 1, 1]),
        (1, 16, 24, 3, 17, 3, 3, [1, 1], [1, 1], 1, [1, 1, 1, 1]),
        (2, 12, 20, 14, 14, 3, 3, [1, 1], [1, 1], 2, [1, 1, 1, 1]),
        (1, 8, 5, 1, 53, 3, 3, [1, 1], [1, 1], 1, [1, 1, 1, 1]),
        (1, 10, 17, 6, 17, 3, 3, [1, 1], [2, 2], 1, [2, 2, 2, 2]),
        (3, 20, 8, 5, 11, 5, 5, [1, 1], [1, 1], 1, [2, 2, 2, 2]),
        (1, 512, 24, 7, 7, 3, 3, [1, 1], [1, 1], 1, [1, 1, 1, 1]),
        (2, 6, 9, 1, 1, 3, 3, [1, 1], [1, 1], 1, [1, 1, 1, 1]),
    ]);
}

/// (n, c_in, c_out, h, w, kh, kw, stride, dilation, groups, [top, bottom, left, right])
type Case = (
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    [usize; 2],
    [usize; 2],
    usize,
    [usize; 4],
);

/// Runs [`conv`] on each case (normal inputs with subnormals and signed zeros, three
/// epilogues) and checks each output within rounding of its sum of products; skips, saying
/// so, without AVX-512.
/// The geometry of `case`, its output as large as its input, filter, stride, dilation
/// and padding make it.
fn geometry_of(&(n, ci, co, h, w, kh, kw, stride, dilation, groups, pad): &Case) -> Geometry {
    let attrs = Conv2dAttrs {
        layout: Layout::Nchw,
        stride,
        padding: pad,
        dilation,
        groups,
    };
    let out =
        |len: usize, p: usize, k: usize, d: usize, s: usize| (len + p - d * (k - 1) - 1) / s + 1;
    let (oh, ow) = (
        out(h, pad[0] + pad[1], kh, dilation[0], stride[0]),
        out(w, pad[2] + pad[3], kw, dilation[1], stride[1]),
    );
    Geometry::new(
        &[n, ci, h, w],
        &[co, ci / groups, kh, kw],
        &attrs,
        &[n, co, oh, ow],
    )
}

fn check_against_sums(cases: &[Case]) {
    for case in cases {
        let isa = route::Isa::host();
        assert!(
            route::direct_takes(&geometry_of(case), true, isa).is_ok(),
            "{case:?}"
        );
    }
    check_run_against_sums(cases, conv);
}

/// A convolution routine: geometry, input, weights, output, epilogue.
type Routine = fn(&Geometry, &[f32], &[f32], &mut [f32], Post<f32>);

/// [`check_against_sums`] for `run` in place of [`conv`].
fn check_run_against_sums(cases: &[Case], run: Routine) {
    if !has_avx512() {
        kfuse_testkit::skip(
            "check_run_against_sums",
            kfuse_testkit::Prerequisite::Avx512,
            "the direct kernel needs AVX-512, which this CPU lacks",
        );
        return;
    }
    use super::super::reference::{sums, values};
    let specials = [0.0, -0.0, 1e-40, -3e-39];
    for (case, &(n, ci, co, h, w, kh, kw, _, _, groups, _)) in cases.iter().enumerate() {
        let g = geometry_of(&cases[case]);
        let [oh, ow] = [g.y[2], g.y[3]];
        let xs = values(n * ci * h * w, 7 + case as u64, 5, &specials);
        let ws = values(co * ci / groups * kh * kw, 8, 0, &[]);
        let bias: Vec<f32> = (0..co).map(|o| o as f32 * 0.3 - 1.0).collect();
        let residual = values(n * co * oh * ow, 9, 0, &[]);
        let want = sums(&g, &xs, &ws);
        let posts = [
            Post {
                bias: None,
                residual: None,
                act: None,
            },
            Post {
                bias: Some(&bias[..]),
                residual: None,
                act: Some(Activation::Relu),
            },
            Post {
                bias: Some(&bias[..]),
                residual: Some(&residual[..]),
                act: Some(Activation::Tanh),
            },
            // A residual with ReLU, and with a clamp and no bias: both in registers where
            // the blocks store straight to the output.
            Post {
                bias: Some(&bias[..]),
                residual: Some(&residual[..]),
                act: Some(Activation::Relu),
            },
            Post {
                bias: None,
                residual: Some(&residual[..]),
                act: Some(Activation::Clamp(kfuse_ir::Bounds::new(-0.5, 6.0))),
            },
        ];
        for post in posts {
            let mut y = vec![f32::NAN; n * co * oh * ow];
            run(&g, &xs, &ws, &mut y, post);
            super::super::reference::assert_within(
                &y,
                &want,
                &post,
                (co, oh * ow),
                &format!("case {case}"),
            );
        }
    }
}

/// Whether two runs of values are the same bit for bit.
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn streamed_stores_off_a_line_write_what_ordinary_stores_write() {
    if !has_avx512() {
        kfuse_testkit::skip(
            "streamed_stores_off_a_line_write_what_ordinary_stores_write",
            kfuse_testkit::Prerequisite::Avx512,
            "the direct kernel needs AVX-512, which this CPU lacks",
        );
        return;
    }
    let value = |i: usize| ((i * 7919) % 997) as f32 / 997.0 - 0.5;
    // Input channels, the taps' offsets, output channels (a partial last block), positions
    // per channel (whole vectors, so that the head applies), and input past them: one tap
    // (the column loop), four read in place, and four over a copied column; last, an
    // input with no room for the shifted blocks' reads, so that no head is taken.
    let cases: [(usize, &[usize], usize, usize, usize); 4] = [
        (5, &[0], 19, 160, QB + 32),
        (3, &[0, 1, 17, 18], 11, 144, QB + 32),
        (48, &[0, 1, 17, 18], 11, 160, QB + 32),
        (5, &[0], 19, 144, 0),
    ];
    for (channels, offsets, c_out, positions, room) in cases {
        let taps = offsets.len();
        let plane = positions + room;
        let x: Vec<f32> = (0..channels * plane).map(value).collect();
        let ws: Vec<f32> = (0..c_out * channels * taps).map(|i| value(i + 5)).collect();
        let packed = pack_afresh(&ws, 1, c_out, channels * taps);
        let bias: Vec<f32> = (0..c_out).map(|i| value(i + 7)).collect();
        let len = c_out * positions;
        let run = |y: &mut [f32], stream: bool| {
            let dst = Dst {
                ptr: y.as_mut_ptr(),
                stride: positions,
                channels: c_out,
                valid: positions,
            };
            let relu = Some(InRegisters::Relu);
            // SAFETY: `y` holds the output's channels and is this thread's; the fence
            // orders the streamed stores before they are read.
            unsafe {
                compute(
                    &x,
                    plane,
                    offsets,
                    (&packed, weights_ahead(packed.len())),
                    dst,
                    Some(&bias),
                    None,
                    relu,
                    stream,
                    &[],
                );
                #[cfg(target_arch = "x86_64")]
                _mm_sfence();
            }
        };
        let mut plain = vec![f32::NAN; len];
        run(&mut plain, false);
        assert!(plain.iter().all(|v| v.is_finite()));
        let sentinel = f32::from_bits(0x7fc0_1234);
        for shift in [0, 1, 4, 12, 15] {
            // The output `shift` floats past a line, with sentinels on both sides, which
            // a streamed store of a whole line that the output only shares would overwrite.
            let mut buffer = vec![sentinel; len + 64];
            let start = buffer.as_ptr().align_offset(64) + 16 + shift;
            run(&mut buffer[start..][..len], true);
            let (before, rest) = buffer.split_at(start);
            let (y, after) = rest.split_at(len);
            assert!(
                same_bits(y, &plain),
                "{taps} taps, shift {shift}: streamed stores differ from ordinary ones"
            );
            let untouched = |s: &[f32]| s.iter().all(|v| v.to_bits() == sentinel.to_bits());
            assert!(
                untouched(before) && untouched(after),
                "{taps} taps, shift {shift}: a store reached past the output"
            );
        }
    }
}

/// Streamed and ordinary stores write the same bits, into an output 64-byte aligned or
/// not, with partial blocks of channels and positions.
#[test]
fn streamed_stores_write_what_ordinary_stores_write() {
    if !has_avx512() {
        kfuse_testkit::skip(
            "streamed_stores_write_what_ordinary_stores_write",
            kfuse_testkit::Prerequisite::Avx512,
            "the separable kernel needs AVX-512, which this CPU lacks",
        );
        return;
    }
    // Planes of 207 positions (never on lines but the first), and of 240 in three images
    // (a task per image), each plane as far off a line as the output's start.
    for (n, c, c_out, h, w) in [(2, 5, 11, 9, 23), (3, 5, 11, 12, 20)] {
        let attrs = Conv2dAttrs {
            layout: Layout::Nchw,
            stride: [1, 1],
            padding: [1; 4],
            dilation: [1, 1],
            groups: c,
        };
        let g = Geometry::new(&[n, c, h, w], &[c, 1, 3, 3], &attrs, &[n, c, h, w]);
        let value = |i: usize| ((i * 7919) % 997) as f32 / 997.0 - 0.5;
        let xs: Vec<f32> = (0..n * c * h * w).map(value).collect();
        let wd: Vec<f32> = (0..c * 9).map(|i| value(i + 11)).collect();
        let wp: Vec<f32> = (0..c_out * c).map(|i| value(i + 23)).collect();
        let len = n * c_out * h * w;
        let none = Post {
            bias: None,
            residual: None,
            act: None,
        };
        let bias: Vec<f32> = (0..c_out).map(|i| value(i + 31)).collect();
        let residual: Vec<f32> = (0..len).map(|i| value(i + 41)).collect();
        // The residual added in registers, as the stores stream.
        let shortcut = Post {
            bias: Some(&bias[..]),
            residual: Some(&residual[..]),
            act: Some(Activation::Relu),
        };
        for post in [none, shortcut] {
            let mut plain = vec![f32::NAN; len];
            separable_stored(&g, &xs, &wd, none, &wp, c_out, &mut plain, post, false);
            assert!(plain.iter().all(|v| v.is_finite()));
            for shift in [0, 1, 6] {
                // A buffer with room to start the output on a line boundary, then a float and
                // six past.
                let mut buffer = vec![f32::NAN; len + 32];
                let aligned = buffer.as_ptr().align_offset(64);
                let y = &mut buffer[aligned + shift..][..len];
                separable_stored(&g, &xs, &wd, none, &wp, c_out, y, post, true);
                assert!(
                    same_bits(y, &plain),
                    "{h}×{w}: streamed stores (shift {shift}) differ from ordinary ones"
                );
            }
        }
    }
}
