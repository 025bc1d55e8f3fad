//! Structured ops on their fast paths against the reference interpreter: convolutions in both
//! layouts over strides, padding, dilation, groups, depthwise and pointwise shapes, odd and
//! size-1 dimensions, non-finite inputs; fast numerics within the summation bound, strict
//! numerics bit-identical.
//!
//! Strict structured ops *are* the reference: in strict numerics the runner computes matmul,
//! convolution and pooling with the reference interpreter's code, so the strict checks here
//! test the plumbing around them (buffers, layouts, the epilogue's order), not a second
//! implementation. The hand-written routines are the second implementation, and they run in
//! fast numerics only: each result is checked against the reference within the bound their
//! summation order gives, `2k * eps * sum |a_i b_i|` for a sum of `k` products (see
//! docs/numerics.md).

use kfuse_cpu::Numerics;
use kfuse_fusion::{FixedCostModel, FusePolicy};
use kfuse_interp::CustomOps;
use kfuse_ir::text::parse_graph;
use kfuse_ir::{Array, Graph};
use kfuse_runtime::{compile_with, Backend, Executable, Options};
use kfuse_testkit::Rng;

fn build(graph: &Graph, numerics: Numerics) -> Executable {
    build_with(graph, numerics, true)
}

/// [`build`], with the layout assignment (`keep_layouts: false`) or without.
fn build_with(graph: &Graph, numerics: Numerics, keep_layouts: bool) -> Executable {
    let options = Options {
        policy: FusePolicy::Cost,
        numerics,
        backend: Backend::Auto,
        cache_dir: std::env::temp_dir().join(format!("kfuse-structured-{}", std::process::id())),
        graph_passes: true,
        // `build` keeps the NHWC routines under test as written (`nhwc_regions_run_in_nchw`
        // tests the layout assignment).
        keep_layouts,
    };
    compile_with(graph, &options, &FixedCostModel::default()).expect("compiles")
}

fn random_inputs(graph: &Graph, seed: u64) -> Vec<(String, Array)> {
    kfuse_testkit::grid_inputs(graph, seed, 4.0, 250)
}

fn abs_inputs(inputs: &[(String, Array)]) -> Vec<(String, Array)> {
    inputs
        .iter()
        .map(|(n, a)| {
            let values: Vec<f64> = (0..a.n_elems()).map(|i| a.get_f64(i).abs()).collect();
            let abs = Array::from_vec(a.shape().dims().to_vec(), values).unwrap();
            (n.clone(), kfuse_interp::elementwise::cast(&abs, a.dtype()))
        })
        .collect()
}

/// The program `text` compiles to one step in fast numerics, and [`check`]s on random inputs
/// drawn from `seed`.
fn check_one_step(text: &str, seed: u64, terms: usize, what: &str) {
    let graph = parse_graph(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let exe = build(&graph, Numerics::Fast);
    assert_eq!(exe.program.steps.len(), 1, "{what} is one step:\n{text}");
    let inputs = random_inputs(&graph, seed);
    check(&graph, &inputs, terms, &format!("{what}:\n{text}"));
}

/// Checks `graph` (whose every output is a sum of at most `terms` products per element) fast
/// against the reference within `2 terms eps sum|products|`, and strict bit for bit. Returns how
/// many fast results differ from the reference in any bit (the fast path sums in another order).
fn check(graph: &Graph, inputs: &[(String, Array)], terms: usize, what: &str) -> usize {
    check_with(graph, inputs, terms, what, true)
}

/// [`check`], with the layout assignment in fast numerics (`keep_layouts: false`) or without.
fn check_with(
    graph: &Graph,
    inputs: &[(String, Array)],
    terms: usize,
    what: &str,
    keep_layouts: bool,
) -> usize {
    let mut differing = 0;
    let want = kfuse_interp::run(graph, inputs, &CustomOps::new()).unwrap();
    // The magnitudes bound each sum's rounding. They are taken before sigmoid, tanh and clamp:
    // those squash large sums, but pass the sum's error on with a slope of up to 1 (ReLU is
    // the identity on these non-negative magnitudes, and a clamp becomes `max(v, lo)`, which
    // is `v` or more).
    let unsquashed: String = kfuse_ir::text::print_graph(graph)
        .replace(" = sigmoid(", " = relu(")
        .replace(" = tanh(", " = relu(")
        .lines()
        .map(|line| match line.split_once(" = clamp(") {
            Some((out, args)) => {
                let (v, rest) = args.split_once(", ").expect("clamp's operands");
                let lo = rest.split_once(", ").expect("clamp's bounds").0;
                format!("{out} = max({v}, {lo})\n")
            }
            None => format!("{line}\n"),
        })
        .collect();
    let unsquashed = parse_graph(&unsquashed).unwrap();
    let magnitude = kfuse_interp::run(&unsquashed, &abs_inputs(inputs), &CustomOps::new()).unwrap();
    let (fast, _) = build_with(graph, Numerics::Fast, keep_layouts)
        .run(inputs, &CustomOps::new())
        .unwrap();
    // The programs compute in their float inputs' dtype; an output of another dtype is a cast
    // of the sum, which may round two nearby sums one step apart (at most a step of the
    // output's dtype, relative or, below its normal range, absolute).
    let compute = graph
        .inputs()
        .map(|(_, _, ty)| ty.dtype)
        .find(|d| d.is_float())
        .unwrap_or(want[0].1.dtype());
    let step = |dtype: kfuse_ir::DType| match dtype {
        kfuse_ir::DType::F16 => (2f64.powi(-10), 2f64.powi(-24)),
        kfuse_ir::DType::BF16 => (2f64.powi(-7), 2f64.powi(-133)),
        kfuse_ir::DType::F32 => (f32::EPSILON as f64, 2f64.powi(-149)),
        _ => (f64::EPSILON, 0.0),
    };
    // f16 and bf16 sum in f32 and round each op's result (the product, then each epilogue
    // op): a few steps of the half type on top of the f32 sum's bound.
    let (eps, half) = match compute {
        kfuse_ir::DType::F16 | kfuse_ir::DType::BF16 => {
            let (rel, abs) = step(compute);
            (f32::EPSILON as f64, (6.0 * rel, 6.0 * abs))
        }
        _ => (step(compute).0, (0.0, 0.0)),
    };
    for ((name, w), ((_, f), (_, m))) in want.iter().zip(fast.iter().zip(&magnitude)) {
        assert_eq!(w.shape(), f.shape(), "{what}: {name}");
        assert_eq!(w.dtype(), f.dtype(), "{what}: {name}");
        let (rel, abs) = if w.dtype() == compute {
            (0.0, 0.0)
        } else {
            step(w.dtype())
        };
        for i in 0..w.n_elems() {
            let (wv, fv) = (w.get_f64(i), f.get_f64(i));
            if !wv.is_finite() {
                assert!(
                    wv.is_nan() && fv.is_nan() || wv == fv,
                    "{what}: {name}[{i}] reference {wv}, fast {fv}"
                );
                continue;
            }
            differing += (wv.to_bits() != fv.to_bits()) as usize;
            let bound = 2.0 * terms as f64 * eps * m.get_f64(i)
                + if half.0 > 0.0 {
                    half.0 * m.get_f64(i) + half.1
                } else {
                    0.0
                }
                + rel * wv.abs().max(fv.abs())
                + abs
                + f64::MIN_POSITIVE;
            assert!(
                (wv - fv).abs() <= bound,
                "{what}: {name}[{i}] reference {wv}, fast {fv}, bound {bound}"
            );
        }
    }
    let (strict, _) = build(graph, Numerics::Strict)
        .run(inputs, &CustomOps::new())
        .unwrap();
    for ((name, w), (_, s)) in want.iter().zip(&strict) {
        for i in 0..w.n_elems() {
            let (a, b) = (w.get_f64(i), s.get_f64(i));
            assert!(
                a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan(),
                "{what}: strict {name}[{i}] {b} differs from the reference {a}"
            );
        }
    }
    differing
}

/// One convolution case: NCHW dims of x, output channels, kernel, stride, padding, dilation,
/// groups.
struct Case {
    x: [usize; 4],
    c_out: usize,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 4],
    dilation: [usize; 2],
    groups: usize,
}

fn conv_program(case: &Case, layout: &str, dtype: &str) -> Graph {
    let text = conv_text(case, layout, dtype);
    parse_graph(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// The text of a program that convolves input `x` with weights `w`.
fn conv_text(case: &Case, layout: &str, dtype: &str) -> String {
    let [n, c, h, w] = case.x;
    let x_shape = if layout == "nchw" {
        format!("[{n}, {c}, {h}, {w}]")
    } else {
        format!("[{n}, {h}, {w}, {c}]")
    };
    format!(
        "%x = input() name=\"x\" : {dtype}{x_shape}\n\
         %w = input() name=\"w\" : {dtype}[{}, {}, {}, {}]\n\
         %y = conv2d(%x, %w) layout={layout} stride={:?} padding={:?} dilation={:?} groups={}\n\
         output \"y\" = %y\n",
        case.c_out,
        c / case.groups,
        case.kernel[0],
        case.kernel[1],
        case.stride,
        case.padding,
        case.dilation,
        case.groups
    )
}

fn cases() -> Vec<Case> {
    let case = |x, c_out, kernel, stride, padding, dilation, groups| Case {
        x,
        c_out,
        kernel,
        stride,
        padding,
        dilation,
        groups,
    };
    vec![
        case([2, 6, 9, 11], 4, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        case([1, 4, 7, 5], 6, [3, 2], [2, 1], [1, 0, 2, 1], [2, 1], 2),
        case([2, 5, 8, 9], 3, [3, 3], [1, 1], [2, 2, 2, 2], [2, 2], 1),
        // Depthwise, depthwise with stride and uneven padding, and channel multiplier 2.
        case([2, 8, 13, 10], 8, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 8),
        case([2, 8, 13, 10], 8, [3, 3], [2, 2], [1, 0, 0, 1], [1, 1], 8),
        case([1, 8, 9, 7], 8, [5, 3], [1, 2], [2, 2, 1, 1], [1, 2], 8),
        case([1, 4, 6, 6], 8, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 4),
        // Rows of 16 outputs and more: the register-blocked 3×3 and 5×5 kernels, with a last
        // block overlapping its predecessor (37, 21) and without (16).
        case([1, 8, 11, 37], 8, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 8),
        case([1, 4, 9, 21], 4, [5, 5], [1, 1], [2, 2, 2, 2], [2, 1], 4),
        case([2, 4, 6, 16], 4, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 4),
        case([1, 3, 7, 40], 3, [3, 3], [1, 1], [0, 1, 2, 0], [1, 3], 3),
        // The in-place f32 NCHW kernel (3×3 and 5×5, stride 1, no dilation): rows of 17 and
        // 33 (a last block of one lane), of 1, no padding, uneven padding, and padding wider
        // than the filter's reach (output rows and columns made of padding alone).
        case([1, 6, 10, 17], 6, [5, 5], [1, 1], [2, 2, 2, 2], [1, 1], 6),
        case([2, 3, 5, 33], 3, [5, 5], [1, 1], [1, 3, 0, 4], [1, 1], 3),
        case([1, 4, 7, 1], 4, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 4),
        case([1, 4, 6, 20], 4, [3, 3], [1, 1], [0, 0, 0, 0], [1, 1], 4),
        case([1, 2, 3, 5], 2, [3, 3], [1, 1], [3, 2, 3, 3], [1, 1], 2),
        // ... and at stride 2 (MobileNet's downsampling blocks): rows of 23 and 8 outputs.
        case([2, 6, 15, 45], 6, [3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 6),
        case([1, 4, 12, 16], 4, [5, 5], [2, 2], [2, 1, 2, 1], [1, 1], 4),
        // Pointwise: plain, grouped, strided (not a plain product).
        case([2, 16, 5, 7], 12, [1, 1], [1, 1], [0; 4], [1, 1], 1),
        case([2, 16, 5, 7], 12, [1, 1], [1, 1], [0; 4], [1, 1], 4),
        case([1, 6, 7, 7], 5, [1, 1], [2, 2], [0; 4], [1, 1], 1),
        // At least 16 input channels per group and no more output channels: the shifted-GEMM
        // path (plain, dilated with uneven padding, grouped, several bands per image).
        case([2, 16, 9, 11], 16, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        case([1, 20, 8, 13], 12, [3, 2], [1, 1], [2, 0, 1, 2], [2, 1], 1),
        case([1, 32, 6, 7], 32, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 2),
        case([1, 16, 70, 19], 9, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        // More output than input channels: shifted GEMMs in NHWC (im2col for f64 NCHW).
        case([1, 16, 7, 9], 24, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        // The direct f32 kernel's blocks: 8 output channels (13: a partial block) by 48
        // positions (rows of 37 + 2 padding columns end mid-block), 64 channels as in W7.
        case([1, 24, 10, 37], 13, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        case([2, 64, 9, 20], 64, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        case([1, 8, 11, 30], 24, [5, 3], [1, 1], [2, 2, 0, 3], [1, 2], 2),
        // Output rows as wide as input rows (the direct kernel's masked layout): uneven
        // left/right and top/bottom padding, dilation, 56-wide rows (W7's) in several bands
        // with a partial last block of positions, a partial block of output channels.
        case([1, 5, 7, 12], 9, [3, 3], [1, 1], [0, 2, 2, 0], [1, 1], 1),
        case([2, 6, 9, 10], 8, [5, 3], [1, 1], [4, 4, 1, 3], [2, 2], 2),
        case([1, 16, 40, 56], 13, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        // Size 1 everywhere, a kernel larger than the input, and an empty batch.
        case([1, 1, 1, 1], 1, [1, 1], [1, 1], [0; 4], [1, 1], 1),
        case([1, 3, 2, 2], 2, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        case([0, 3, 4, 4], 2, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        // Enough rows to split into several bands per image.
        case([1, 3, 64, 33], 5, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        // 1×1 convolutions wide enough for the direct microkernel (at least 64 channels each
        // way onto at least 196 pixels): several bands, a partial last block of positions and
        // of output channels, at a batch of two and of one.
        case([2, 64, 15, 17], 70, [1, 1], [1, 1], [0; 4], [1, 1], 1),
        case([1, 72, 20, 20], 64, [1, 1], [1, 1], [0; 4], [1, 1], 1),
        // Bands of 8 rows of a 14-wide image (each starting on a cache line), the last of 4.
        case([1, 64, 20, 14], 48, [1, 1], [1, 1], [0; 4], [1, 1], 1),
        // Strided, as ResNet's down-sampling shortcuts: odd sizes, unequal strides.
        case([2, 64, 29, 31], 72, [1, 1], [2, 2], [0; 4], [1, 1], 1),
        case([1, 64, 30, 15], 64, [1, 1], [2, 1], [0; 4], [1, 1], 1),
        // Onto narrow outputs, on the direct kernel's tap planes: strided 3×3 and 1×1.
        case([2, 16, 13, 13], 24, [3, 3], [2, 2], [1; 4], [1, 1], 1),
        case([2, 64, 13, 14], 64, [1, 1], [2, 2], [0; 4], [1, 1], 1),
        // 1×1 of 256+ channels onto a 7×7 image (the direct kernel, a tail of one position).
        case([2, 256, 7, 7], 264, [1, 1], [1, 1], [0; 4], [1, 1], 1),
    ]
}

#[test]
fn fast_convolutions_match_the_reference_in_every_layout_and_shape() {
    let mut differing = 0;
    for (k, case) in cases().iter().enumerate() {
        for layout in ["nchw", "nhwc"] {
            for dtype in ["f32", "f64"] {
                let graph = conv_program(case, layout, dtype);
                let inputs = random_inputs(&graph, k as u64);
                let terms = case.x[1] / case.groups * case.kernel[0] * case.kernel[1];
                differing += check(
                    &graph,
                    &inputs,
                    terms,
                    &format!("case {k} {layout} {dtype}"),
                );
            }
        }
    }
    assert!(
        differing > 0,
        "fast numerics never left the reference's summation order"
    );
}

#[test]
fn non_finite_inputs_propagate_as_in_the_reference() {
    let case = Case {
        x: [1, 4, 6, 6],
        c_out: 3,
        kernel: [3, 3],
        stride: [1, 1],
        padding: [1, 1, 1, 1],
        dilation: [1, 1],
        groups: 1,
    };
    for layout in ["nchw", "nhwc"] {
        let graph = conv_program(&case, layout, "f32");
        let mut inputs = random_inputs(&graph, 99);
        let x = &inputs[0].1;
        let mut values: Vec<f32> = x.as_slice::<f32>().unwrap().to_vec();
        values[3] = f32::NAN;
        values[40] = f32::INFINITY;
        values[41] = f32::NEG_INFINITY;
        values[100] = 1e-40; // subnormal
        values[101] = -0.0;
        inputs[0].1 = Array::from_vec(x.shape().dims().to_vec(), values).unwrap();
        check(&graph, &inputs, 36, &format!("non-finite {layout}"));
    }
}

/// A 3×3 convolution (`groups`, stride 1, padding 1, as many outputs as inputs) with a
/// per-channel bias, a skip connection from its input, and `act` (none if empty): a residual
/// block's tail.
fn residual(layout: &str, dtype: &str, x: &str, groups: usize, act: &str) -> (String, usize) {
    let c: usize = if layout == "nchw" {
        x.trim_matches(|c| c == '[' || c == ']').split(", ").nth(1)
    } else {
        x.trim_matches(|c| c == '[' || c == ']').split(", ").nth(3)
    }
    .unwrap()
    .parse()
    .unwrap();
    let bias = if layout == "nchw" {
        format!("[{c}, 1, 1]")
    } else {
        format!("[{c}]")
    };
    let mut text = format!(
        "%x = input() name=\"x\" : {dtype}{x}\n\
         %w = input() name=\"w\" : {dtype}[{c}, {}, 3, 3]\n\
         %b = input() name=\"b\" : {dtype}{bias}\n\
         %c = conv2d(%x, %w) layout={layout} stride=[1, 1] padding=[1, 1, 1, 1] dilation=[1, 1] groups={groups}\n\
         %s = add(%c, %b)\n%r = add(%x, %s)\n",
        c / groups
    );
    let last = if act.is_empty() {
        "%r"
    } else {
        text += &activate(act, "%r", "y", dtype);
        "%y"
    };
    text += &format!("output \"y\" = {last}\n");
    (text, c / groups * 9 + 2)
}

/// A depthwise convolution (padding 1 or 2, filter `kernel`) of NCHW `x`, then its
/// per-channel bias and `act` (`clamp` is ReLU6).
fn depthwise_bias(dtype: &str, x: &str, kernel: &str, stride: usize, act: &str) -> (String, usize) {
    let c: usize = x.split(", ").nth(1).unwrap().parse().unwrap();
    let k: usize = kernel[1..2].parse().unwrap();
    let pad = k / 2;
    let act = if act == "clamp" {
        format!(
            "%lo = constant() value=[0.0] : {dtype}[]\n%hi = constant() value=[6.0] : {dtype}[]\n\
             %y = clamp(%s, %lo, %hi)\n"
        )
    } else {
        format!("%y = {act}(%s)\n")
    };
    (
        format!(
            "%x = input() name=\"x\" : {dtype}{x}\n\
             %w = input() name=\"w\" : {dtype}[{c}, 1, {k}, {k}]\n\
             %b = input() name=\"b\" : {dtype}[{c}, 1, 1]\n\
             %d = conv2d(%x, %w) layout=nchw stride=[{stride}, {stride}] padding=[{pad}, {pad}, {pad}, {pad}] dilation=[1, 1] groups={c}\n\
             %s = add(%d, %b)\n{act}output \"y\" = %y\n"
        ),
        k * k,
    )
}

/// A depthwise-separable block with a skip connection around it (MobileNetV2's inverted
/// residual, without the expansion).
fn separable_residual(layout: &str) -> (String, usize) {
    let (x, bias) = if layout == "nchw" {
        ("[1, 8, 9, 21]", "[8, 1, 1]")
    } else {
        ("[1, 9, 21, 8]", "[8]")
    };
    (
        format!(
            "%x = input() name=\"x\" : f32{x}\n\
             %wd = input() name=\"wd\" : f32[8, 1, 3, 3]\n\
             %wp = input() name=\"wp\" : f32[8, 8, 1, 1]\n\
             %b = input() name=\"b\" : f32{bias}\n\
             %d = conv2d(%x, %wd) layout={layout} stride=[1, 1] padding=[1, 1, 1, 1] dilation=[1, 1] groups=8\n\
             %p = conv2d(%d, %wp) layout={layout} stride=[1, 1] padding=[0, 0, 0, 0] dilation=[1, 1] groups=1\n\
             %s = add(%p, %b)\n%r = add(%s, %x)\n%y = relu(%r)\noutput \"y\" = %y\n"
        ),
        8 * 9 + 8 + 2,
    )
}

/// A MobileNet block (batchnorms folded): depthwise 3×3 → its per-channel bias (if `bias`) →
/// `middle` (if any) → pointwise → bias → ReLU, in `layout` and `dtype`.
/// SiLU of `v` into `%out`, as exporters write it: `mul(v, sigmoid(v))`.
fn silu(v: &str, out: &str) -> String {
    format!("%{out}_sig = sigmoid({v})\n%{out} = mul({v}, %{out}_sig)\n")
}

/// Hard-swish of `v` (of `dtype`) into `%out`, as exporters write it: `x * relu6(x + 3) / 6`,
/// the product first (`hardswish`, PyTorch's decomposition) or the hard sigmoid first
/// (`hardsigmoid_mul`: `(relu6(3 + x) / 6) * x`, operands swapped).
fn hardswish(v: &str, out: &str, dtype: &str, form: &str) -> String {
    let mut text = format!(
        "%{out}_3 = constant() value=[3.0] : {dtype}[]\n%{out}_0 = constant() value=[0.0] : {dtype}[]\n\
         %{out}_6 = constant() value=[6.0] : {dtype}[]\n"
    );
    if form == "hardswish" {
        text += &format!(
            "%{out}_a = add({v}, %{out}_3)\n%{out}_c = clamp(%{out}_a, %{out}_0, %{out}_6)\n\
             %{out}_m = mul({v}, %{out}_c)\n%{out} = div(%{out}_m, %{out}_6)\n"
        );
    } else {
        text += &format!(
            "%{out}_a = add(%{out}_3, {v})\n%{out}_c = clamp(%{out}_a, %{out}_0, %{out}_6)\n\
             %{out}_h = div(%{out}_c, %{out}_6)\n%{out} = mul(%{out}_h, {v})\n"
        );
    }
    text
}

/// `act` of `v` (of `dtype`) into `%out` as exporters write it: SiLU and hard-swish (both
/// forms, see [`hardswish`]) as their nodes, any other name as that unary op.
fn activate(act: &str, v: &str, out: &str, dtype: &str) -> String {
    match act {
        "silu" => silu(v, out),
        a if a.starts_with("hard") => hardswish(v, out, dtype, a),
        a => format!("%{out} = {a}({v})\n"),
    }
}

fn mobilenet_block(
    layout: &str,
    dtype: &str,
    x: &str,
    bias: bool,
    middle: &str,
) -> (String, usize) {
    let (c, cout) = (8, 12);
    let (bd, b) = if layout == "nchw" {
        (format!("[{c}, 1, 1]"), format!("[{cout}, 1, 1]"))
    } else {
        (format!("[{c}]"), format!("[{cout}]"))
    };
    let mut text = format!(
        "%x = input() name=\"x\" : {dtype}{x}\n\
         %wd = input() name=\"wd\" : {dtype}[{c}, 1, 3, 3]\n\
         %wp = input() name=\"wp\" : {dtype}[{cout}, {c}, 1, 1]\n\
         %b = input() name=\"b\" : {dtype}{b}\n\
         %d = conv2d(%x, %wd) layout={layout} stride=[1, 1] padding=[1, 1, 1, 1] dilation=[1, 1] groups={c}\n"
    );
    let mut last = "%d".to_string();
    if bias {
        text += &format!("%bd = input() name=\"bd\" : {dtype}{bd}\n%e = add({last}, %bd)\n");
        last = "%e".into();
    }
    if middle == "relu6" {
        // ReLU6 as ONNX and PyTorch export it: a clamp to constant bounds.
        text += &format!(
            "%lo = constant() value=[0.0] : {dtype}[]\n%hi = constant() value=[6.0] : {dtype}[]\n\
             %a = clamp({last}, %lo, %hi)\n"
        );
        last = "%a".into();
    } else if !middle.is_empty() {
        text += &activate(middle, &last, "a", dtype);
        last = "%a".into();
    }
    text += &format!(
        "%p = conv2d({last}, %wp) layout={layout} stride=[1, 1] padding=[0, 0, 0, 0] dilation=[1, 1] groups=1\n\
         %s = add(%p, %b)\n%y = relu(%s)\noutput \"y\" = %y\n"
    );
    // A GELU between the halves is itself a rounded function of a sum of 9 + 1 terms.
    (text, c * (9 + 2) + 3)
}

/// MobileNetV2's inverted residual (batchnorms folded): 1×1 expansion of `c` channels to
/// `6c` → bias → `act` → depthwise 3×3 at `stride` → bias → `act` → 1×1 projection to `c` →
/// bias → the skip connection (stride 1 only), in `layout` and `dtype`.
fn inverted_residual(
    layout: &str,
    dtype: &str,
    x: &str,
    stride: usize,
    act: &str,
) -> (String, usize) {
    let (c, e) = (4, 24);
    let per = |n: usize| {
        if layout == "nchw" {
            format!("[{n}, 1, 1]")
        } else {
            format!("[{n}]")
        }
    };
    let mut text = format!(
        "%x = input() name=\"x\" : {dtype}{x}\n\
         %we = input() name=\"we\" : {dtype}[{e}, {c}, 1, 1]\n\
         %be = input() name=\"be\" : {dtype}{}\n\
         %wd = input() name=\"wd\" : {dtype}[{e}, 1, 3, 3]\n\
         %bd = input() name=\"bd\" : {dtype}{}\n\
         %wp = input() name=\"wp\" : {dtype}[{c}, {e}, 1, 1]\n\
         %bp = input() name=\"bp\" : {dtype}{}\n\
         %lo = constant() value=[0.0] : {dtype}[]\n%hi = constant() value=[6.0] : {dtype}[]\n\
         %x1 = conv2d(%x, %we) layout={layout} stride=[1, 1] padding=[0, 0, 0, 0] dilation=[1, 1] groups=1\n\
         %x2 = add(%x1, %be)\n",
        per(e),
        per(e),
        per(c)
    );
    let apply = |v: &str, out: &str| match act {
        "relu6" => format!("%{out} = clamp({v}, %lo, %hi)\n"),
        "" => format!("%{out} = add({v}, %lo)\n"),
        a => activate(a, v, out, dtype),
    };
    text += &apply("%x2", "x3");
    text += &format!(
        "%d1 = conv2d(%x3, %wd) layout={layout} stride=[{stride}, {stride}] padding=[1, 1, 1, 1] dilation=[1, 1] groups={e}\n\
         %d2 = add(%d1, %bd)\n"
    );
    text += &apply("%d2", "d3");
    text += &format!(
        "%p1 = conv2d(%d3, %wp) layout={layout} stride=[1, 1] padding=[0, 0, 0, 0] dilation=[1, 1] groups=1\n\
         %p2 = add(%p1, %bp)\n"
    );
    if stride == 1 {
        text += "%y = add(%p2, %x)\noutput \"y\" = %y\n";
    } else {
        text += "output \"y\" = %p2\n";
    }
    (text, e * (c + 1) * 11 + 3)
}

/// A program text with its inputs, and the sum length bounding each output's rounding.
fn structured_programs() -> Vec<(String, usize)> {
    let dsc = |layout: &str, x: &str, stride: &str, bias: &str, relu: bool| {
        let (c, cout) = (8, 12);
        let mut text = format!(
            "%x = input() name=\"x\" : f32{x}\n\
             %wd = input() name=\"wd\" : f32[{c}, 1, 3, 3]\n\
             %wp = input() name=\"wp\" : f32[{cout}, {c}, 1, 1]\n\
             %d = conv2d(%x, %wd) layout={layout} stride={stride} padding=[1, 1, 1, 1] dilation=[1, 1] groups={c}\n\
             %p = conv2d(%d, %wp) layout={layout} stride=[1, 1] padding=[0, 0, 0, 0] dilation=[1, 1] groups=1\n"
        );
        let mut last = "%p";
        if !bias.is_empty() {
            text += &format!("%b = input() name=\"b\" : f32{bias}\n%s = add(%b, %p)\n");
            last = "%s";
        }
        if relu {
            text += &format!("%r = relu({last})\n");
            last = "%r";
        }
        text += &format!("output \"y\" = {last}\n");
        (text, c * 9 + c + 1)
    };
    let conv = |layout: &str, x: &str, w: &str, groups: usize, bias: &str, terms: usize| {
        // Stride 1 (and, here, 16 channels and more per group) takes the shifted-GEMM path.
        let stride = if terms >= 144 { "[1, 1]" } else { "[2, 1]" };
        (
            format!(
                "%x = input() name=\"x\" : f32{x}\n\
                 %w = input() name=\"w\" : f32{w}\n\
                 %b = input() name=\"b\" : f32{bias}\n\
                 %c = conv2d(%x, %w) layout={layout} stride={stride} padding=[1, 0, 1, 1] dilation=[1, 1] groups={groups}\n\
                 %s = add(%c, %b)\n%y = relu(%s)\noutput \"y\" = %y\n"
            ),
            terms + 1,
        )
    };
    vec![
        dsc("nchw", "[2, 8, 13, 11]", "[1, 1]", "[12, 1, 1]", true),
        dsc("nchw", "[2, 8, 13, 11]", "[2, 2]", "", false),
        dsc("nchw", "[1, 8, 40, 23]", "[1, 1]", "[1, 12, 1, 1]", false),
        dsc("nchw", "[1, 8, 5, 32]", "[1, 1]", "", true),
        dsc("nchw", "[3, 8, 17, 1]", "[1, 1]", "", false),
        // f64 takes the `gemm` path of the separable block (as f32 does without AVX-512).
        {
            let (text, terms) = dsc("nchw", "[1, 8, 7, 19]", "[1, 1]", "[12, 1, 1]", true);
            (text.replace("f32", "f64"), terms)
        },
        dsc("nhwc", "[2, 13, 11, 8]", "[1, 1]", "[12]", true),
        dsc("nhwc", "[1, 9, 9, 8]", "[2, 1]", "", true),
        conv("nchw", "[2, 6, 9, 10]", "[4, 3, 3, 3]", 2, "[4, 1, 1]", 27),
        conv("nhwc", "[2, 9, 10, 6]", "[5, 6, 3, 3]", 1, "[5]", 54),
        conv("nchw", "[2, 16, 9, 10]", "[8, 16, 3, 3]", 1, "[8, 1, 1]", 144),
        // Residual blocks: bias, skip connection and activation after every convolution path
        // (direct f32 NCHW with ReLU and with GELU, NHWC, f64, depthwise, separable).
        residual("nchw", "f32", "[2, 16, 7, 20]", 16, "relu"),
        residual("nchw", "f32", "[1, 8, 5, 9]", 1, "gelu_tanh"),
        residual("nchw", "f32", "[1, 8, 6, 9]", 8, "gelu"),
        // SiLU (`mul(x, sigmoid(x))`, two nodes) as the epilogue, the depthwise half's and the
        // expansion's activation: EfficientNet's MBConv block, in f32 and f64.
        residual("nchw", "f32", "[1, 16, 5, 18]", 1, "silu"),
        residual("nhwc", "f64", "[1, 5, 6, 16]", 1, "silu"),
        mobilenet_block("nchw", "f32", "[2, 8, 9, 13]", true, "silu"),
        inverted_residual("nchw", "f32", "[2, 4, 9, 11]", 1, "silu"),
        inverted_residual("nhwc", "f32", "[1, 9, 11, 4]", 2, "silu"),
        // Hard-swish (four nodes, in both of the forms exporters write): MobileNetV3's
        // inverted residual, a separable block, residual blocks in f32 and f64.
        inverted_residual("nchw", "f32", "[2, 4, 9, 11]", 1, "hardswish"),
        inverted_residual("nchw", "f32", "[1, 4, 10, 9]", 2, "hardsigmoid_mul"),
        inverted_residual("nhwc", "f32", "[1, 9, 11, 4]", 1, "hardsigmoid_mul"),
        mobilenet_block("nchw", "f32", "[2, 8, 9, 13]", true, "hardswish"),
        residual("nchw", "f32", "[1, 16, 5, 18]", 1, "hardswish"),
        residual("nhwc", "f64", "[1, 5, 6, 16]", 1, "hardsigmoid_mul"),
        residual("nhwc", "f32", "[2, 7, 20, 16]", 1, "relu"),
        residual("nchw", "f64", "[1, 16, 6, 7]", 1, "relu"),
        residual("nchw", "f32", "[1, 8, 6, 19]", 8, "relu"),
        residual("nhwc", "f32", "[1, 5, 6, 8]", 8, ""),
        residual("nchw", "f32", "[1, 16, 5, 18]", 1, "sigmoid"),
        residual("nhwc", "f64", "[1, 5, 6, 16]", 1, "tanh"),
        separable_residual("nchw"),
        separable_residual("nhwc"),
        // Small images at batch 1, whose one band runs in two phases over the threads: the
        // tile's channels split (24 expanded channels: runs of 16 and 8), then the outputs
        // (12: runs of 8 and 4).
        inverted_residual("nchw", "f32", "[1, 4, 7, 7]", 1, "relu6"),
        inverted_residual("nchw", "f32", "[1, 4, 9, 6]", 2, "relu"),
        mobilenet_block("nchw", "f32", "[1, 8, 7, 9]", true, "relu6"),
        // Small images at larger batches, several whole images per task side by side in one
        // tile: groups of three 7×7 images with the skip connection after the projection;
        // 3×2 outputs at stride 2 in groups of two, the last group one image; 3×5 separable
        // blocks in groups of three and one; 4×4 images (whole blocks of positions already),
        // one per task.
        inverted_residual("nchw", "f32", "[6, 4, 7, 7]", 1, "relu6"),
        inverted_residual("nchw", "f32", "[5, 4, 5, 3]", 2, "sigmoid"),
        mobilenet_block("nchw", "f32", "[7, 8, 3, 5]", true, "relu"),
        mobilenet_block("nchw", "f32", "[4, 8, 4, 4]", true, "relu6"),
        // 1×1 convolutions of small images at batch 1, on the direct microkernel in two
        // phases: a bias and ReLU6, and a residual then sigmoid.
        (
            "%x = input() name=\"x\" : f32[1, 20, 7, 7]\n\
             %w = input() name=\"w\" : f32[13, 20, 1, 1]\n\
             %b = input() name=\"b\" : f32[13, 1, 1]\n\
             %lo = constant() value=[0.0] : f32[]\n%hi = constant() value=[6.0] : f32[]\n\
             %c = conv2d(%x, %w) layout=nchw stride=[1, 1] padding=[0, 0, 0, 0] dilation=[1, 1] groups=1\n\
             %s = add(%c, %b)\n%y = clamp(%s, %lo, %hi)\noutput \"y\" = %y\n"
                .to_string(),
            21,
        ),
        (
            "%x = input() name=\"x\" : f32[1, 9, 10, 9]\n\
             %w = input() name=\"w\" : f32[9, 9, 1, 1]\n\
             %c = conv2d(%x, %w) layout=nchw stride=[1, 1] padding=[0, 0, 0, 0] dilation=[1, 1] groups=1\n\
             %s = add(%c, %x)\n%y = sigmoid(%s)\noutput \"y\" = %y\n"
                .to_string(),
            10,
        ),
        // Standalone depthwise convolutions of small images (MobileNet's late stages), whose
        // tasks split the channels rather than the few rows: bias and ReLU6 or sigmoid, batch
        // 1 and 2, f32 and f64, stride 1 and 2, 3×3 and 5×5.
        depthwise_bias("f32", "[1, 24, 7, 7]", "[3, 3]", 1, "clamp"),
        depthwise_bias("f32", "[2, 19, 6, 14]", "[5, 5]", 1, "sigmoid"),
        depthwise_bias("f32", "[1, 32, 9, 9]", "[3, 3]", 2, "clamp"),
        depthwise_bias("f64", "[1, 12, 7, 7]", "[3, 3]", 1, "clamp"),
        // MobileNet blocks: the depthwise half's own bias and activation run on its tile.
        mobilenet_block("nchw", "f32", "[2, 8, 13, 37]", true, "relu"),
        mobilenet_block("nchw", "f32", "[1, 8, 9, 16]", false, "sigmoid"),
        mobilenet_block("nchw", "f32", "[1, 8, 7, 20]", true, ""),
        mobilenet_block("nchw", "f32", "[1, 8, 6, 11]", true, "gelu_tanh"),
        mobilenet_block("nchw", "f32", "[1, 8, 7, 12]", false, "gelu"),
        mobilenet_block("nhwc", "f32", "[2, 9, 11, 8]", true, "relu"),
        mobilenet_block("nhwc", "f32", "[1, 7, 5, 8]", false, "tanh"),
        mobilenet_block("nchw", "f64", "[1, 8, 9, 13]", true, "relu"),
        mobilenet_block("nchw", "f32", "[1, 8, 11, 21]", true, "relu6"),
        // Inverted residuals: the expansion joins too (fused band by band in f32 NCHW; the
        // expansion computed whole, then the separable block, elsewhere).
        inverted_residual("nchw", "f32", "[2, 4, 13, 37]", 1, "relu6"),
        inverted_residual("nchw", "f32", "[1, 4, 17, 20]", 2, "relu"),
        inverted_residual("nchw", "f32", "[1, 4, 1, 5]", 1, "sigmoid"),
        inverted_residual("nhwc", "f32", "[1, 9, 11, 4]", 1, "relu6"),
        inverted_residual("nchw", "f64", "[1, 4, 7, 9]", 2, "relu6"),
        mobilenet_block("nhwc", "f32", "[1, 6, 9, 8]", true, "relu6"),
        mobilenet_block("nchw", "f64", "[1, 8, 5, 9]", false, "relu6"),
        // Clamp epilogues with other bounds: after a direct f32 convolution (applied by the
        // microkernel, in its registers) and after a matmul.
        (
            "%x = input() name=\"x\" : f32[1, 6, 7, 19]\n\
             %w = input() name=\"w\" : f32[4, 6, 3, 3]\n\
             %b = input() name=\"b\" : f32[4, 1, 1]\n\
             %lo = constant() value=[-0.5] : f32[]\n%hi = constant() value=[0.75] : f32[]\n\
             %c = conv2d(%x, %w) layout=nchw stride=[1, 1] padding=[1, 1, 1, 1] dilation=[1, 1] groups=1\n\
             %s = add(%c, %b)\n%y = clamp(%s, %lo, %hi)\noutput \"y\" = %y\n"
                .to_string(),
            55,
        ),
        (
            "%x = input() name=\"x\" : f32[1, 6, 7, 9]\n\
             %w = input() name=\"w\" : f32[4, 6, 3, 3]\n\
             %b = input() name=\"b\" : f32[4, 1, 1]\n\
             %c = conv2d(%x, %w) layout=nchw stride=[1, 1] padding=[1, 1, 1, 1] dilation=[1, 1] groups=1\n\
             %s = add(%c, %b)\n%y = gelu_tanh(%s)\noutput \"y\" = %y\n"
                .to_string(),
            55,
        ),
        conv("nhwc", "[1, 9, 10, 32]", "[16, 16, 3, 3]", 2, "[16]", 144),
        // f32 NCHW 1×1 convolutions on kfuse's GEMM with their epilogue in registers: whole
        // tiles of 6 channels × 64 positions and edge tiles (20 channels: three blocks of six
        // and one of two; 225 positions: three panels and one of 33), a bias, a residual and
        // ReLU, and a bias and ReLU alone.
        (
            "%x = input() name=\"x\" : f32[2, 24, 16, 16]\n\
             %w = input() name=\"w\" : f32[20, 24, 1, 1]\n\
             %b = input() name=\"b\" : f32[20, 1, 1]\n\
             %r = input() name=\"r\" : f32[2, 20, 16, 16]\n\
             %c = conv2d(%x, %w) layout=nchw stride=[1, 1] padding=[0, 0, 0, 0] dilation=[1, 1] groups=1\n\
             %s = add(%c, %b)\n%t = add(%s, %r)\n%y = relu(%t)\noutput \"y\" = %y\n"
                .to_string(),
            26,
        ),
        (
            "%x = input() name=\"x\" : f32[1, 32, 15, 15]\n\
             %w = input() name=\"w\" : f32[20, 32, 1, 1]\n\
             %b = input() name=\"b\" : f32[20, 1, 1]\n\
             %c = conv2d(%x, %w) layout=nchw stride=[1, 1] padding=[0, 0, 0, 0] dilation=[1, 1] groups=1\n\
             %s = add(%c, %b)\n%y = relu(%s)\noutput \"y\" = %y\n"
                .to_string(),
            33,
        ),
    ]
}

#[test]
fn structured_convolutions_match_the_reference() {
    for (k, (text, terms)) in structured_programs().into_iter().enumerate() {
        let graph = parse_graph(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let exe = build(&graph, Numerics::Fast);
        let structured = exe
            .program
            .steps
            .iter()
            .filter(|s| matches!(s, kfuse_kernel::Step::Structured { .. }))
            .count();
        assert_eq!(
            structured, 1,
            "program {k} is one structured kernel:\n{text}"
        );
        assert_eq!(
            exe.program.steps.len(),
            1,
            "program {k}: nothing else\n{text}"
        );
        let inputs = random_inputs(&graph, 1000 + k as u64);
        check(
            &graph,
            &inputs,
            terms,
            &format!("structured program {k}:\n{text}"),
        );
    }
}

/// The NHWC structured programs with the layout assignment: each runs its structured kernel in
/// NCHW where the pass finds it pays, the layout changing at its edges only (permute kernels),
/// and stays within the fast bound of the reference.
#[test]
fn nhwc_regions_run_in_nchw() {
    let mut changed = 0;
    for (k, (text, terms)) in structured_programs().into_iter().enumerate() {
        if !text.contains("layout=nhwc") {
            continue;
        }
        let graph = parse_graph(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let exe = build_with(&graph, Numerics::Fast, false);
        if exe
            .passes
            .iter()
            .any(|p| p.starts_with("conv-layout: NCHW for"))
        {
            changed += 1;
            let kernels = &exe.partition.kernels;
            let structured = kernels
                .iter()
                .filter(|k| matches!(k.kind, kfuse_fusion::KernelKind::Structured(_)))
                .count();
            assert_eq!(structured, 1, "program {k}:\n{text}\n{:#?}", exe.passes);
            for kernel in kernels {
                let moves = kernel.nodes.iter().all(|&n| {
                    matches!(
                        exe.graph.node(n).op,
                        kfuse_ir::Op::Permute { .. } | kfuse_ir::Op::Reshape { .. }
                    )
                });
                assert!(
                    moves || matches!(kernel.kind, kfuse_fusion::KernelKind::Structured(_)),
                    "program {k}: a kernel other than the structured one and layout changes\n{text}"
                );
            }
        }
        let inputs = random_inputs(&graph, 3000 + k as u64);
        check_with(
            &graph,
            &inputs,
            terms,
            &format!("program {k} in NCHW:\n{text}"),
            false,
        );
    }
    assert!(changed >= 2, "{changed} NHWC program(s) changed layout");
}

/// Two products of one input added (ResNet's down-sampling block: a strided 3×3 and a
/// strided 1×1 convolution; and two matmuls): the add is the first product's epilogue and the
/// second product its residual. Both products are computed (the second one's kernel claimed
/// the same add once, was never emitted, and lowering panicked on its missing buffer).
#[test]
fn two_products_added_are_both_computed() {
    let text = "%x = input() name=\"x\" : f32[2, 8, 10, 10]\n\
        %w1 = input() name=\"w1\" : f32[16, 8, 3, 3]\n\
        %w2 = input() name=\"w2\" : f32[16, 8, 1, 1]\n\
        %a = conv2d(%x, %w1) layout=nchw stride=[2, 2] padding=[1, 1, 1, 1] dilation=[1, 1] groups=1\n\
        %b = conv2d(%x, %w2) layout=nchw stride=[2, 2] padding=[0, 0, 0, 0] dilation=[1, 1] groups=1\n\
        %s = add(%a, %b)\n%y = relu(%s)\n\
        %m1 = input() name=\"m1\" : f32[4, 16]\n\
        %m2 = input() name=\"m2\" : f32[16, 4]\n\
        %m3 = input() name=\"m3\" : f32[16, 4]\n\
        %p = matmul(%m1, %m2)\n%q = matmul(%m1, %m3)\n%r = add(%p, %q)\n\
        output \"y\" = %y\noutput \"r\" = %r\n";
    let graph = parse_graph(text).unwrap();
    let inputs = random_inputs(&graph, 77);
    check(&graph, &inputs, 80, "two products added");
}

/// Random MobileNet blocks, f32 NCHW: with or without the expansion, odd channel counts (runs
/// of channels that end off a block of 8), images from 1×1 up, batch 1 to 5, stride 1 or 2,
/// ReLU6, ReLU, sigmoid or SiLU, so that the one-task bands, the two-phase bands of small images
/// and the groups of small whole images all run, against the reference.
#[test]
fn random_separable_blocks_match_the_reference() {
    let mut rng = Rng::new(2026);
    for k in 0..40u64 {
        let pick = |rng: &mut Rng, n: usize| 1 + rng.below(n);
        let (n, c, c_out) = (pick(&mut rng, 5), pick(&mut rng, 12), pick(&mut rng, 20));
        let (h, w) = (pick(&mut rng, 15), pick(&mut rng, 15));
        let stride = pick(&mut rng, 2);
        let expand = rng.below(2) == 0;
        let e = if expand { pick(&mut rng, 40) } else { c };
        let act = [
            "relu6",
            "relu",
            "sigmoid",
            "silu",
            "hardswish",
            "hardsigmoid_mul",
        ][rng.below(6)];
        let apply = |v: &str, out: &str| match act {
            "relu6" => format!("%{out} = clamp({v}, %lo, %hi)\n"),
            a => activate(a, v, out, "f32"),
        };
        let mut text = format!(
            "%x = input() name=\"x\" : f32[{n}, {c}, {h}, {w}]\n\
             %wd = input() name=\"wd\" : f32[{e}, 1, 3, 3]\n\
             %bd = input() name=\"bd\" : f32[{e}, 1, 1]\n\
             %wp = input() name=\"wp\" : f32[{c_out}, {e}, 1, 1]\n\
             %bp = input() name=\"bp\" : f32[{c_out}, 1, 1]\n\
             %lo = constant() value=[0.0] : f32[]\n%hi = constant() value=[6.0] : f32[]\n"
        );
        let into_depthwise = if expand {
            text += &format!(
                "%we = input() name=\"we\" : f32[{e}, {c}, 1, 1]\n\
                 %be = input() name=\"be\" : f32[{e}, 1, 1]\n\
                 %x1 = conv2d(%x, %we) layout=nchw stride=[1, 1] padding=[0, 0, 0, 0] dilation=[1, 1] groups=1\n\
                 %x2 = add(%x1, %be)\n"
            );
            text += &apply("%x2", "x3");
            "%x3"
        } else {
            "%x"
        };
        text += &format!(
            "%d1 = conv2d({into_depthwise}, %wd) layout=nchw stride=[{stride}, {stride}] padding=[1, 1, 1, 1] dilation=[1, 1] groups={e}\n\
             %d2 = add(%d1, %bd)\n"
        );
        text += &apply("%d2", "d3");
        text += "%p1 = conv2d(%d3, %wp) layout=nchw stride=[1, 1] padding=[0, 0, 0, 0] dilation=[1, 1] groups=1\n\
                 %y = add(%p1, %bp)\noutput \"y\" = %y\n";
        check_one_step(
            &text,
            7000 + k,
            e * (c + 1) * 11 + 3,
            &format!("random block {k}"),
        );
    }
}

/// A runner keeps the packed copies of its program's constant weights between runs: two
/// programs of the same shapes with different constant weights, run side by side and then
/// compiled, run and dropped in turn (so that one's constants may take the other's freed
/// memory), each give the reference's results every time.
#[test]
fn packed_constant_weights_follow_their_program() {
    let program = |seed: u64| {
        let mut rng = Rng::new(seed);
        let mut values = |n: usize| {
            (0..n)
                .map(|_| format!("{}", rng.below(17) as f32 / 8.0 - 1.0))
                .collect::<Vec<_>>()
                .join(", ")
        };
        // A 3×3 convolution (the direct kernel) and a 7×7 inverted residual's 1×1 weights.
        let text = format!(
            "%x = input() name=\"x\" : f32[1, 4, 7, 7]\n\
             %w = constant() value=[{}] : f32[8, 4, 3, 3]\n\
             %c = conv2d(%x, %w) layout=nchw stride=[1, 1] padding=[1, 1, 1, 1] dilation=[1, 1] groups=1\n\
             %we = constant() value=[{}] : f32[24, 8, 1, 1]\n\
             %e = conv2d(%c, %we) layout=nchw stride=[1, 1] padding=[0, 0, 0, 0] dilation=[1, 1] groups=1\n\
             output \"y\" = %e\n",
            values(8 * 4 * 9),
            values(24 * 8)
        );
        parse_graph(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    };
    let (a, b) = (program(1), program(2));
    let inputs = random_inputs(&a, 33);
    let want = |g: &Graph| kfuse_interp::run(g, &inputs, &CustomOps::new()).unwrap();
    let (want_a, want_b) = (want(&a), want(&b));
    assert_ne!(want_a[0].1, want_b[0].1, "the two programs differ");
    let close = |got: &[(String, Array)], want: &[(String, Array)], what: &str| {
        for i in 0..want[0].1.n_elems() {
            let (g, w) = (got[0].1.get_f64(i), want[0].1.get_f64(i));
            assert!(
                (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                "{what}: y[{i}] {g} against {w}"
            );
        }
    };
    let (exe_a, exe_b) = (build(&a, Numerics::Fast), build(&b, Numerics::Fast));
    let (mut runner_a, mut runner_b) = (exe_a.runner(), exe_b.runner());
    for round in 0..3 {
        runner_a.run(&inputs, &CustomOps::new()).unwrap();
        close(
            &runner_a.outputs(&inputs),
            &want_a,
            &format!("a, round {round}"),
        );
        runner_b.run(&inputs, &CustomOps::new()).unwrap();
        close(
            &runner_b.outputs(&inputs),
            &want_b,
            &format!("b, round {round}"),
        );
    }
    for round in 0..4 {
        let (g, want) = if round % 2 == 0 {
            (&a, &want_a)
        } else {
            (&b, &want_b)
        };
        let exe = build(g, Numerics::Fast);
        let mut runner = exe.runner();
        for _ in 0..2 {
            runner.run(&inputs, &CustomOps::new()).unwrap();
            close(
                &runner.outputs(&inputs),
                want,
                &format!("in turn, round {round}"),
            );
        }
    }
}

/// An infinite or NaN weight beside the padding: the fast kernels multiply a padding tap by
/// zero where the reference skips it, so such steps run on the reference, and the border
/// outputs stay numbers where the reference's are. Plain (direct, NHWC, f64), depthwise,
/// separable and inverted-residual convolutions, with the weight's tap in a corner of the
/// filter.
#[test]
fn non_finite_weights_beside_the_padding_match_the_reference() {
    let cases = [
        (conv_case("nchw", "f32"), "w"),
        (conv_case("nhwc", "f32"), "w"),
        (conv_case("nchw", "f64"), "w"),
        // Half-precision convolutions, bare and in a separable block.
        (conv_case("nchw", "bf16"), "w"),
        (conv_case("nhwc", "f16"), "w"),
        (
            mobilenet_block("nchw", "bf16", "[1, 8, 9, 16]", true, "relu"),
            "wd",
        ),
        (
            depthwise_bias("f32", "[1, 24, 7, 7]", "[3, 3]", 1, "clamp"),
            "w",
        ),
        (
            mobilenet_block("nchw", "f32", "[1, 8, 9, 16]", true, "relu"),
            "wd",
        ),
        (
            inverted_residual("nchw", "f32", "[2, 4, 13, 37]", 1, "relu6"),
            "wd",
        ),
    ];
    for (k, ((text, terms), weights)) in cases.into_iter().enumerate() {
        let graph = parse_graph(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        for special in [f32::INFINITY, f32::NAN] {
            let mut inputs = random_inputs(&graph, 9000 + k as u64);
            let (_, w) = inputs.iter_mut().find(|(n, _)| n == weights).unwrap();
            // The first weight: tap (0, 0) of the first output channel, padding for the first
            // output row and column.
            let mut values: Vec<f64> = (0..w.n_elems()).map(|i| w.get_f64(i)).collect();
            values[0] = f64::from(special);
            let dims = w.shape().dims().to_vec();
            *w =
                kfuse_interp::elementwise::cast(&Array::from_vec(dims, values).unwrap(), w.dtype());
            let want = kfuse_interp::run(&graph, &inputs, &CustomOps::new()).unwrap();
            assert!(
                (0..want[0].1.n_elems()).any(|i| want[0].1.get_f64(i).is_finite()),
                "case {k}: the reference has numbers to keep"
            );
            check(
                &graph,
                &inputs,
                terms,
                &format!("case {k}, weight {special}:\n{text}"),
            );
        }
    }
}

/// A plain 3×3 convolution with padding 1 and a bias, in `layout` and `dtype`.
fn conv_case(layout: &str, dtype: &str) -> (String, usize) {
    let (x, w, b) = if layout == "nchw" {
        ("[2, 6, 7, 19]", "[4, 6, 3, 3]", "[4, 1, 1]")
    } else {
        ("[2, 7, 19, 6]", "[4, 6, 3, 3]", "[4]")
    };
    (
        format!(
            "%x = input() name=\"x\" : {dtype}{x}\n\
             %w = input() name=\"w\" : {dtype}{w}\n\
             %b = input() name=\"b\" : {dtype}{b}\n\
             %c = conv2d(%x, %w) layout={layout} stride=[1, 1] padding=[1, 1, 1, 1] dilation=[1, 1] groups=1\n\
             %s = add(%c, %b)\noutput \"y\" = %s\n"
        ),
        54,
    )
}

/// Strict numerics run each structured step through the reference ops, in the graph's order:
/// the same bits as the interpreter (the depthwise half's own epilogue included).
#[test]
fn structured_convolutions_are_bit_exact_in_strict_mode() {
    for (k, (text, _)) in structured_programs().into_iter().enumerate() {
        let graph = parse_graph(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let inputs = random_inputs(&graph, 2000 + k as u64);
        let want = kfuse_interp::run(&graph, &inputs, &CustomOps::new()).unwrap();
        let exe = build(&graph, Numerics::Strict);
        let (got, _) = exe.run(&inputs, &CustomOps::new()).unwrap();
        for ((name, w), (_, g)) in want.iter().zip(&got) {
            assert_eq!(
                kfuse_testkit::strict_difference(g, w),
                None,
                "program {k}: {name} differs from the reference\n{text}"
            );
        }
    }
}

#[test]
fn structured_matmuls_match_the_reference() {
    // (program, terms per output)
    let programs = [
        (
            "%x = input() name=\"x\" : f32[5, 7]\n%w = input() name=\"w\" : f32[3, 7]\n%b = input() name=\"b\" : f32[3]\n\
             %wt = permute(%w) perm=[1, 0]\n%h = matmul(%x, %wt)\n%s = add(%h, %b)\n%y = relu(%s)\noutput \"y\" = %y\n",
            8,
        ),
        // A clamp epilogue (ReLU6-like bounds) after a matmul with a bias, f32 and f64.
        (
            "%x = input() name=\"x\" : f32[9, 40]\n%w = input() name=\"w\" : f32[40, 130]\n%b = input() name=\"b\" : f32[130]\n\
             %lo = constant() value=[-1.0] : f32[]\n%hi = constant() value=[1.5] : f32[]\n\
             %h = matmul(%x, %w)\n%s = add(%h, %b)\n%y = clamp(%s, %lo, %hi)\noutput \"y\" = %y\n",
            41,
        ),
        (
            "%x = input() name=\"x\" : f64[3, 17]\n%w = input() name=\"w\" : f64[17, 5]\n\
             %lo = constant() value=[0.0] : f64[]\n%hi = constant() value=[6.0] : f64[]\n\
             %h = matmul(%x, %w)\n%y = clamp(%h, %lo, %hi)\noutput \"y\" = %y\n",
            17,
        ),
        (
            "%a = input() name=\"a\" : f32[2, 7, 5]\n%w = input() name=\"w\" : f32[2, 7, 6]\n%b = input() name=\"b\" : f32[1, 6]\n\
             %at = permute(%a) perm=[0, 2, 1]\n%h = matmul(%at, %w)\n%y = add(%b, %h)\noutput \"y\" = %y\n",
            8,
        ),
        (
            "%x = input() name=\"x\" : f64[1, 33]\n%w = input() name=\"w\" : f64[33, 70]\n%b = input() name=\"b\" : f64[70]\n\
             %h = matmul(%x, %w)\n%s = add(%h, %b)\n%y = relu(%s)\noutput \"y\" = %y\n",
            34,
        ),
        (
            "%a = input() name=\"a\" : f32[3, 1, 4, 9]\n%c = input() name=\"c\" : f32[2, 6, 9]\n\
             %ct = permute(%c) perm=[0, 2, 1]\n%y = matmul(%a, %ct)\noutput \"y\" = %y\n",
            9,
        ),
        (
            "%x = input() name=\"x\" : f32[4, 0]\n%w = input() name=\"w\" : f32[0, 3]\n%b = input() name=\"b\" : f32[3]\n\
             %h = matmul(%x, %w)\n%s = add(%h, %b)\n%y = relu(%s)\noutput \"y\" = %y\n",
            1,
        ),
        (
            "%x = input() name=\"x\" : f32[600, 70]\n%w = input() name=\"w\" : f32[70, 120]\n%b = input() name=\"b\" : f32[120]\n\
             %h = matmul(%x, %w)\n%s = add(%h, %b)\n%y = relu(%s)\noutput \"y\" = %y\n",
            71,
        ),
        // A product large enough to split across threads, by blocks of columns (the last one
        // partial), with its bias.
        (
            "%x = input() name=\"x\" : f32[64, 300]\n%w = input() name=\"w\" : f32[300, 260]\n%b = input() name=\"b\" : f32[260]\n\
             %h = matmul(%x, %w)\n%y = add(%h, %b)\noutput \"y\" = %y\n",
            301,
        ),
        // Residuals (skip connections): over column blocks, over rows, one-row products (the
        // GEMV path), batched, f64, with GELU after them, and with K = 0.
        (
            "%x = input() name=\"x\" : f32[64, 300]\n%w = input() name=\"w\" : f32[300, 260]\n%b = input() name=\"b\" : f32[260]\n\
             %r = input() name=\"r\" : f32[64, 260]\n\
             %h = matmul(%x, %w)\n%s = add(%h, %b)\n%y = add(%r, %s)\noutput \"y\" = %y\n",
            302,
        ),
        (
            "%x = input() name=\"x\" : f32[5, 7]\n%w = input() name=\"w\" : f32[7, 9]\n%r = input() name=\"r\" : f32[5, 9]\n\
             %h = matmul(%x, %w)\n%s = add(%h, %r)\n%y = gelu_tanh(%s)\noutput \"y\" = %y\n",
            8,
        ),
        (
            "%x = input() name=\"x\" : f64[1, 33]\n%w = input() name=\"w\" : f64[33, 70]\n%b = input() name=\"b\" : f64[70]\n\
             %r = input() name=\"r\" : f64[1, 70]\n\
             %h = matmul(%x, %w)\n%s = add(%h, %b)\n%t = add(%s, %r)\n%y = relu(%t)\noutput \"y\" = %y\n",
            35,
        ),
        (
            "%a = input() name=\"a\" : f32[3, 4, 6]\n%w = input() name=\"w\" : f32[6, 130]\n%r = input() name=\"r\" : f32[3, 4, 130]\n\
             %h = matmul(%a, %w)\n%y = add(%h, %r)\noutput \"y\" = %y\n",
            7,
        ),
        (
            "%x = input() name=\"x\" : f32[4, 0]\n%w = input() name=\"w\" : f32[0, 3]\n%b = input() name=\"b\" : f32[3]\n\
             %r = input() name=\"r\" : f32[4, 3]\n\
             %h = matmul(%x, %w)\n%s = add(%h, %b)\n%t = add(%s, %r)\n%y = relu(%t)\noutput \"y\" = %y\n",
            2,
        ),
        // GELU epilogues: over blocks of columns (n >= 128, applied while each block is in
        // cache), over rows (narrow n), in f64, and without a bias.
        (
            "%x = input() name=\"x\" : f32[40, 33]\n%w = input() name=\"w\" : f32[33, 300]\n%b = input() name=\"b\" : f32[300]\n\
             %h = matmul(%x, %w)\n%s = add(%h, %b)\n%y = gelu_tanh(%s)\noutput \"y\" = %y\n",
            34,
        ),
        (
            "%x = input() name=\"x\" : f64[3, 17]\n%w = input() name=\"w\" : f64[17, 130]\n%b = input() name=\"b\" : f64[130]\n\
             %h = matmul(%x, %w)\n%s = add(%b, %h)\n%y = gelu_tanh(%s)\noutput \"y\" = %y\n",
            18,
        ),
        (
            "%x = input() name=\"x\" : f32[5, 7]\n%w = input() name=\"w\" : f32[7, 9]\n\
             %h = matmul(%x, %w)\n%y = gelu_tanh(%h)\noutput \"y\" = %y\n",
            7,
        ),
        // Scale epilogues: per column after the bias, then a residual (LayerScale) and GELU,
        // over column blocks; a constant scalar factor alone (attention scores), batched; a
        // one-element factor on the GEMV path; f64 over rows; and with K = 0.
        (
            "%x = input() name=\"x\" : f32[40, 33]\n%w = input() name=\"w\" : f32[33, 300]\n%b = input() name=\"b\" : f32[300]\n\
             %g = input() name=\"g\" : f32[300]\n%r = input() name=\"r\" : f32[40, 300]\n\
             %h = matmul(%x, %w)\n%s = add(%h, %b)\n%t = mul(%g, %s)\n%u = add(%r, %t)\n%y = gelu(%u)\noutput \"y\" = %y\n",
            36,
        ),
        (
            "%q = input() name=\"q\" : f32[3, 17, 8]\n%k = input() name=\"k\" : f32[3, 8, 21]\n\
             %c = constant() value=[0.35355339] : f32[]\n\
             %h = matmul(%q, %k)\n%y = mul(%h, %c)\noutput \"y\" = %y\n",
            8,
        ),
        (
            "%x = input() name=\"x\" : f32[1, 50]\n%w = input() name=\"w\" : f32[50, 70]\n%b = input() name=\"b\" : f32[70]\n\
             %g = input() name=\"g\" : f32[1, 1]\n\
             %h = matmul(%x, %w)\n%s = add(%h, %b)\n%y = mul(%s, %g)\noutput \"y\" = %y\n",
            51,
        ),
        (
            "%x = input() name=\"x\" : f64[6, 17]\n%w = input() name=\"w\" : f64[17, 9]\n%g = input() name=\"g\" : f64[9]\n\
             %h = matmul(%x, %w)\n%s = mul(%h, %g)\n%y = sigmoid(%s)\noutput \"y\" = %y\n",
            17,
        ),
        (
            "%x = input() name=\"x\" : f32[4, 0]\n%w = input() name=\"w\" : f32[0, 3]\n%b = input() name=\"b\" : f32[3]\n\
             %g = input() name=\"g\" : f32[3]\n%h = matmul(%x, %w)\n%s = add(%h, %b)\n%y = mul(%s, %g)\noutput \"y\" = %y\n",
            2,
        ),
        // GELU's erf form: over blocks of columns, over rows, on the GEMV path, in f64.
        (
            "%x = input() name=\"x\" : f32[40, 33]\n%w = input() name=\"w\" : f32[33, 300]\n%b = input() name=\"b\" : f32[300]\n\
             %h = matmul(%x, %w)\n%s = add(%h, %b)\n%y = gelu(%s)\noutput \"y\" = %y\n",
            34,
        ),
        (
            "%x = input() name=\"x\" : f32[9, 21]\n%w = input() name=\"w\" : f32[21, 13]\n%b = input() name=\"b\" : f32[13]\n\
             %h = matmul(%x, %w)\n%s = add(%h, %b)\n%y = gelu(%s)\noutput \"y\" = %y\n",
            22,
        ),
        (
            "%x = input() name=\"x\" : f32[1, 50]\n%w = input() name=\"w\" : f32[50, 70]\n\
             %h = matmul(%x, %w)\n%y = gelu(%h)\noutput \"y\" = %y\n",
            50,
        ),
        (
            "%x = input() name=\"x\" : f64[3, 17]\n%w = input() name=\"w\" : f64[17, 130]\n%b = input() name=\"b\" : f64[130]\n\
             %h = matmul(%x, %w)\n%s = add(%h, %b)\n%y = gelu(%s)\noutput \"y\" = %y\n",
            18,
        ),
        // Casts after the epilogue: to bf16 over column blocks, to f16 over bands of rows (a
        // large product with a narrow output), over column blocks of a large product without
        // any other pass, on the GEMV path and with K = 0; an f64 product narrowed to f32
        // through a transposed operand; a batched f32 product with a residual widened to f64;
        // an f64 product to bf16.
        (
            "%x = input() name=\"x\" : f32[40, 33]\n%w = input() name=\"w\" : f32[33, 300]\n%b = input() name=\"b\" : f32[300]\n\
             %h = matmul(%x, %w)\n%s = add(%h, %b)\n%g = gelu(%s)\n%y = cast(%g) to=bf16\noutput \"y\" = %y\n",
            34,
        ),
        (
            "%x = input() name=\"x\" : f32[600, 70]\n%w = input() name=\"w\" : f32[70, 120]\n%b = input() name=\"b\" : f32[120]\n\
             %h = matmul(%x, %w)\n%s = add(%h, %b)\n%r = relu(%s)\n%y = cast(%r) to=f16\noutput \"y\" = %y\n",
            71,
        ),
        (
            "%x = input() name=\"x\" : f32[64, 300]\n%w = input() name=\"w\" : f32[300, 260]\n%b = input() name=\"b\" : f32[260]\n\
             %h = matmul(%x, %w)\n%s = add(%h, %b)\n%y = cast(%s) to=f16\noutput \"y\" = %y\n",
            301,
        ),
        (
            "%x = input() name=\"x\" : f32[1, 50]\n%w = input() name=\"w\" : f32[50, 70]\n%b = input() name=\"b\" : f32[70]\n\
             %h = matmul(%x, %w)\n%s = add(%h, %b)\n%y = cast(%s) to=f16\noutput \"y\" = %y\n",
            51,
        ),
        (
            "%x = input() name=\"x\" : f32[4, 0]\n%w = input() name=\"w\" : f32[0, 3]\n%b = input() name=\"b\" : f32[3]\n\
             %h = matmul(%x, %w)\n%s = add(%h, %b)\n%y = cast(%s) to=bf16\noutput \"y\" = %y\n",
            1,
        ),
        (
            "%x = input() name=\"x\" : f64[17, 3]\n%w = input() name=\"w\" : f64[17, 130]\n\
             %xt = permute(%x) perm=[1, 0]\n%h = matmul(%xt, %w)\n%y = cast(%h) to=f32\noutput \"y\" = %y\n",
            17,
        ),
        (
            "%a = input() name=\"a\" : f32[3, 4, 6]\n%w = input() name=\"w\" : f32[6, 130]\n%r = input() name=\"r\" : f32[3, 4, 130]\n\
             %h = matmul(%a, %w)\n%s = add(%h, %r)\n%y = cast(%s) to=f64\noutput \"y\" = %y\n",
            7,
        ),
        (
            "%x = input() name=\"x\" : f64[9, 21]\n%w = input() name=\"w\" : f64[21, 13]\n\
             %h = matmul(%x, %w)\n%r = relu(%h)\n%y = cast(%r) to=bf16\noutput \"y\" = %y\n",
            21,
        ),
    ];
    for (k, (text, terms)) in programs.iter().enumerate() {
        let graph = parse_graph(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let exe = build(&graph, Numerics::Fast);
        assert_eq!(
            exe.program.steps.len(),
            1,
            "matmul program {k} is one step:\n{text}"
        );
        assert!(
            matches!(exe.program.steps[0], kfuse_kernel::Step::Structured { .. }),
            "program {k}"
        );
        let inputs = random_inputs(&graph, 2000 + k as u64);
        check(&graph, &inputs, *terms, &format!("matmul program {k}"));
    }
}

#[test]
fn pooling_is_bit_identical_to_the_reference_in_both_modes() {
    let cases = [
        ("max", "[3, 3]", "[2, 2]", "[1, 1, 1, 1]", "[1, 1]", "false"),
        ("avg", "[3, 3]", "[2, 2]", "[1, 1, 1, 1]", "[1, 1]", "false"),
        ("avg", "[3, 2]", "[1, 2]", "[1, 0, 1, 1]", "[2, 1]", "true"),
        ("max", "[2, 2]", "[1, 1]", "[0, 0, 0, 0]", "[1, 1]", "false"),
        // Global average pooling: the window is the whole plane.
        ("avg", "[7, 9]", "[1, 1]", "[0, 0, 0, 0]", "[1, 1]", "false"),
    ];
    for (k, (kind, window, stride, padding, dilation, include)) in cases.iter().enumerate() {
        for layout in ["nchw", "nhwc"] {
            let x = if layout == "nchw" {
                "[2, 3, 7, 9]"
            } else {
                "[2, 7, 9, 3]"
            };
            let text = format!(
                "%x = input() name=\"x\" : f32{x}\n\
                 %y = pool2d(%x) kind={kind} layout={layout} window={window} stride={stride} padding={padding} dilation={dilation} count_include_pad={include}\n\
                 output \"y\" = %y\n"
            );
            let graph = parse_graph(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
            let mut inputs = random_inputs(&graph, 3000 + k as u64);
            let mut values: Vec<f32> = inputs[0].1.as_slice::<f32>().unwrap().to_vec();
            values[5] = f32::NAN;
            values[17] = -0.0;
            values[18] = 0.0;
            values[60] = f32::NEG_INFINITY;
            inputs[0].1 = Array::from_vec(inputs[0].1.shape().dims().to_vec(), values).unwrap();
            let want = kfuse_interp::run(&graph, &inputs, &CustomOps::new()).unwrap();
            for numerics in [Numerics::Fast, Numerics::Strict] {
                let (got, _) = build(&graph, numerics)
                    .run(&inputs, &CustomOps::new())
                    .unwrap();
                for i in 0..want[0].1.n_elems() {
                    let (a, b) = (want[0].1.get_f64(i), got[0].1.get_f64(i));
                    assert!(
                        a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan(),
                        "case {k} {layout} {numerics:?}: y[{i}] reference {a}, got {b}"
                    );
                }
            }
        }
    }
}

#[test]
fn random_convolutions_match_the_reference() {
    let mut rng = Rng::new(77);
    let mut checked = 0;
    for k in 0..80u64 {
        let pick = |rng: &mut Rng, n: u64| 1 + rng.below(n as usize);
        let groups = [1, 1, 2, 3][rng.below(4)];
        // One draw in four has 16-19 channels per group and fewer outputs, the shifted-GEMM
        // path at stride 1.
        let wide = rng.below(4) == 0;
        let c_in = groups
            * if wide {
                15 + pick(&mut rng, 4)
            } else {
                pick(&mut rng, 3)
            };
        let depthwise = !wide && rng.below(4) == 0;
        let (groups, c_out) = if depthwise {
            (c_in, c_in * pick(&mut rng, 2))
        } else if wide {
            (groups, groups * pick(&mut rng, 16))
        } else {
            (groups, groups * pick(&mut rng, 3))
        };
        let case = Case {
            // Depthwise rows reach past one 16-wide register block.
            x: [
                pick(&mut rng, 2),
                c_in,
                pick(&mut rng, 9),
                pick(&mut rng, if depthwise { 40 } else { 9 }),
            ],
            c_out,
            kernel: [pick(&mut rng, 3), pick(&mut rng, 3)],
            stride: [pick(&mut rng, 2), pick(&mut rng, 2)],
            padding: [rng.below(2), rng.below(2), rng.below(3), rng.below(2)],
            dilation: [pick(&mut rng, 2), pick(&mut rng, 2)],
            groups,
        };
        let layout = if rng.below(2) == 0 { "nchw" } else { "nhwc" };
        let text = conv_text(&case, layout, "f32");
        let c = case.x[1];
        // A kernel that does not fit the padded input is a type error: skip those draws.
        let Ok(graph) = parse_graph(&text) else {
            continue;
        };
        let inputs = random_inputs(&graph, 4000 + k);
        let terms = c / case.groups * case.kernel[0] * case.kernel[1];
        check(&graph, &inputs, terms, &format!("random conv {k}:\n{text}"));
        checked += 1;
    }
    assert!(
        checked >= 40,
        "only {checked} random convolutions were valid"
    );
}

/// Hard-swish (four nodes) in a matmul's epilogue, in both forms: over column blocks after a
/// bias, over rows in f64, on the GEMV path.
#[test]
fn hardswish_matmul_epilogues_match_the_reference() {
    let cases = [
        ("f32", 40, 33, 300, true, "hardswish"),
        ("f64", 9, 21, 13, false, "hardsigmoid_mul"),
        ("f32", 1, 50, 70, true, "hardsigmoid_mul"),
    ];
    for (k, (dtype, m, kk, n, bias, form)) in cases.into_iter().enumerate() {
        let mut text = format!(
            "%x = input() name=\"x\" : {dtype}[{m}, {kk}]\n%w = input() name=\"w\" : {dtype}[{kk}, {n}]\n\
             %h = matmul(%x, %w)\n"
        );
        let sum = if bias {
            text += &format!("%b = input() name=\"b\" : {dtype}[{n}]\n%s = add(%h, %b)\n");
            "%s"
        } else {
            "%h"
        };
        text += &hardswish(sum, "y", dtype, form);
        text += "output \"y\" = %y\n";
        check_one_step(
            &text,
            3100 + k as u64,
            kk + 1,
            &format!("hard-swish matmul {k}"),
        );
    }
}

/// Convolutions and matmuls of f16 and bf16 operands run their products on the f32 routines
/// in fast numerics (the epilogue op by op, rounding as the reference does): structured
/// matmuls with transposes and epilogues, bare products, a convolution with its epilogue,
/// and a separable block.
#[test]
fn half_precision_products_match_the_reference() {
    let programs = [
        (
            "%x = input() name=\"x\" : bf16[40, 33]\n%w = input() name=\"w\" : bf16[33, 300]\n%b = input() name=\"b\" : bf16[300]\n\
             %h = matmul(%x, %w)\n%s = add(%h, %b)\n%y = relu(%s)\noutput \"y\" = %y\n"
                .to_string(),
            34,
        ),
        (
            "%x = input() name=\"x\" : f16[3, 9, 21]\n%w = input() name=\"w\" : f16[13, 21]\n%b = input() name=\"b\" : f16[13]\n\
             %wt = permute(%w) perm=[1, 0]\n%h = matmul(%x, %wt)\n%s = add(%h, %b)\n%y = gelu(%s)\noutput \"y\" = %y\n"
                .to_string(),
            22,
        ),
        (
            "%x = input() name=\"x\" : f16[1, 50]\n%w = input() name=\"w\" : f16[50, 70]\n\
             %y = matmul(%x, %w)\noutput \"y\" = %y\n"
                .to_string(),
            50,
        ),
        residual("nchw", "bf16", "[1, 8, 6, 9]", 1, "relu"),
        residual("nhwc", "f16", "[2, 5, 7, 8]", 8, "silu"),
        mobilenet_block("nchw", "bf16", "[2, 8, 9, 13]", true, "relu6"),
        (
            "%x = input() name=\"x\" : bf16[2, 6, 9, 10]\n%w = input() name=\"w\" : bf16[4, 3, 3, 3]\n\
             %y = conv2d(%x, %w) layout=nchw stride=[2, 2] padding=[1, 1, 1, 1] dilation=[1, 1] groups=2\n\
             output \"y\" = %y\n"
                .to_string(),
            27,
        ),
        // Dilated, unevenly padded, NHWC, f16, with a bias.
        (
            "%x = input() name=\"x\" : f16[1, 11, 9, 4]\n%w = input() name=\"w\" : f16[5, 4, 3, 2]\n\
             %b = input() name=\"b\" : f16[5]\n\
             %c = conv2d(%x, %w) layout=nhwc stride=[1, 2] padding=[2, 0, 1, 3] dilation=[2, 3] groups=1\n\
             %y = add(%c, %b)\noutput \"y\" = %y\n"
                .to_string(),
            25,
        ),
    ];
    for (k, (text, terms)) in programs.iter().enumerate() {
        let graph = parse_graph(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let inputs = random_inputs(&graph, 4400 + k as u64);
        check(
            &graph,
            &inputs,
            *terms,
            &format!("half-precision program {k}:\n{text}"),
        );
    }
}

/// The program `text` compiles to one structured step in fast numerics whose outputs on random
/// inputs drawn from `seed`, then on those inputs with edge values in every third element,
/// hold the reference's values exactly (NaN where it has NaN; zeros of either sign alike): for
/// products of one term, exact in f32, whatever the summation order. A transcendental
/// activation's subnormal results come out as zeros of their sign (`kfuse_routines::fpmode`).
fn same_values_in_one_step(text: &str, seed: u64, what: &str) {
    let flushes = ["gelu", "sigmoid", "tanh"].iter().any(|a| text.contains(a));
    let graph = parse_graph(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let exe = build(&graph, Numerics::Fast);
    assert!(
        matches!(
            exe.program.steps[..],
            [kfuse_kernel::Step::Structured { .. }]
        ),
        "{what}: one structured step:\n{text}"
    );
    let mut inputs = random_inputs(&graph, seed);
    // Then with edge values in every input: NaN, infinities, signed zeros, values that
    // overflow f16 once multiplied, and the smallest subnormals of f16 and bf16.
    let edges = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.0,
        0.0,
        60000.0,
        -65504.0,
        2f64.powi(-24),
        -2f64.powi(-133),
        1e-3,
    ];
    for round in 0..2 {
        if round == 1 {
            for (_, a) in &mut inputs {
                let mut values: Vec<f64> = (0..a.n_elems()).map(|i| a.get_f64(i)).collect();
                for (i, v) in values.iter_mut().enumerate().step_by(3) {
                    *v = edges[(i / 3) % edges.len()];
                }
                let wide = Array::from_vec(a.shape().dims().to_vec(), values).unwrap();
                *a = kfuse_interp::elementwise::cast(&wide, a.dtype());
            }
        }
        let want = kfuse_interp::run(&graph, &inputs, &CustomOps::new()).unwrap();
        let (got, _) = exe.run(&inputs, &CustomOps::new()).unwrap();
        let (w, g) = (&want[0].1, &got[0].1);
        assert_eq!(w.dtype(), g.dtype(), "{what}");
        for i in 0..w.n_elems() {
            let (a, b) = (w.get_f64(i), g.get_f64(i));
            let flushed = flushes
                && a != 0.0
                && a.abs() < f64::from(f32::MIN_POSITIVE)
                && b == 0.0
                && a.is_sign_negative() == b.is_sign_negative();
            assert!(
                a == b || a.is_nan() && b.is_nan() || flushed,
                "{what} (edge values: {}): element {i}: reference {a:e}, fast {b:e}",
                round == 1
            );
        }
    }
}

/// Half-precision matmuls round every step as the reference does: with one term per sum, the
/// f32 product is exact, so every later step sees the reference's values and the results are
/// the reference's, bit for bit (zeros of either sign aside). Each epilogue step and each
/// compound activation's inner step, over column blocks, rows and the GEMV path, in both
/// half dtypes, and a cast of the rounded product.
#[test]
fn half_precision_matmul_epilogues_round_every_step() {
    for dtype in ["bf16", "f16"] {
        for (m, n) in [(40, 300), (9, 13), (1, 70)] {
            for (k, act) in [
                "relu",
                "gelu",
                "sigmoid",
                "silu",
                "hardswish",
                "hardsigmoid_mul",
                "cast",
            ]
            .into_iter()
            .enumerate()
            {
                let mut text = format!(
                    "%x = input() name=\"x\" : {dtype}[{m}, 1]\n%w = input() name=\"w\" : {dtype}[1, {n}]\n\
                     %b = input() name=\"b\" : {dtype}[{n}]\n%g = input() name=\"g\" : {dtype}[{n}]\n\
                     %r = input() name=\"r\" : {dtype}[{m}, {n}]\n\
                     %h = matmul(%x, %w)\n%s = add(%h, %b)\n%t = mul(%s, %g)\n%u = add(%t, %r)\n"
                );
                text += &match act {
                    "cast" => "%y = cast(%u) to=f32\n".to_string(),
                    a => activate(a, "%u", "y", dtype),
                };
                text += "output \"y\" = %y\n";
                same_values_in_one_step(&text, 700 + k as u64, &format!("{dtype} {m}x{n} {act}"));
            }
        }
    }
}

/// Half-precision convolutions round every step as the reference does: a 1×1 convolution of
/// one input channel sums one term, exact in f32, so the results are the reference's bit for
/// bit (zeros of either sign aside), in both layouts and both half dtypes, with a bias, a
/// skip connection and each kind of activation.
#[test]
fn half_precision_convolution_epilogues_round_every_step() {
    for dtype in ["bf16", "f16"] {
        for layout in ["nchw", "nhwc"] {
            for (k, act) in ["relu", "sigmoid", "silu", "hardswish", ""]
                .into_iter()
                .enumerate()
            {
                let (x, y, bias) = if layout == "nchw" {
                    ("[2, 1, 5, 7]", "[2, 6, 5, 7]", "[6, 1, 1]")
                } else {
                    ("[2, 5, 7, 1]", "[2, 5, 7, 6]", "[6]")
                };
                let mut text = format!(
                    "%x = input() name=\"x\" : {dtype}{x}\n%w = input() name=\"w\" : {dtype}[6, 1, 1, 1]\n\
                     %b = input() name=\"b\" : {dtype}{bias}\n%r = input() name=\"r\" : {dtype}{y}\n\
                     %c = conv2d(%x, %w) layout={layout} stride=[1, 1] padding=[0, 0, 0, 0] dilation=[1, 1] groups=1\n\
                     %s = add(%c, %b)\n%u = add(%s, %r)\n"
                );
                let last = if act.is_empty() {
                    "%u"
                } else {
                    text += &activate(act, "%u", "y", dtype);
                    "%y"
                };
                text += &format!("output \"y\" = {last}\n");
                same_values_in_one_step(&text, 900 + k as u64, &format!("{dtype} {layout} {act}"));
            }
        }
        // An inverted residual of one channel throughout (1×1 expansion, 1×1 depthwise,
        // projection, each with its bias and activation, then the skip connection): every
        // convolution of the block sums one term.
        for (k, act) in ["relu", "silu", "hardswish"].into_iter().enumerate() {
            let apply = |v: &str, out: &str| activate(act, v, out, dtype);
            let conv = |x: &str, w: &str, out: &str| {
                format!("%{out} = conv2d(%{x}, %{w}) layout=nchw stride=[1, 1] padding=[0, 0, 0, 0] dilation=[1, 1] groups=1\n")
            };
            let mut text = String::new();
            for (name, dims) in [
                ("x", "[2, 1, 6, 9]"),
                ("we", "[1, 1, 1, 1]"),
                ("be", "[1, 1, 1]"),
                ("wd", "[1, 1, 1, 1]"),
                ("bd", "[1, 1, 1]"),
                ("wp", "[1, 1, 1, 1]"),
                ("bp", "[1, 1, 1]"),
            ] {
                text += &format!("%{name} = input() name=\"{name}\" : {dtype}{dims}\n");
            }
            text += &conv("x", "we", "e1");
            text += "%e2 = add(%e1, %be)\n";
            text += &apply("%e2", "e3");
            text += &conv("e3", "wd", "d1");
            text += "%d2 = add(%d1, %bd)\n";
            text += &apply("%d2", "d3");
            text += &conv("d3", "wp", "p1");
            text += "%p2 = add(%p1, %bp)\n%y = add(%p2, %x)\noutput \"y\" = %y\n";
            same_values_in_one_step(
                &text,
                950 + k as u64,
                &format!("{dtype} inverted residual {act}"),
            );
        }
    }
}

/// A cast epilogue rounds as the IR's `cast` does, bit for bit: products of one term (exact
/// or rounded once, as the reference rounds them) of edge values, cast to every other float
/// dtype. Ties to even in bf16 and f16, the edge of f16's range (65520 rounds to infinity),
/// its subnormals and the tie below them, f32 subnormals, infinities, NaN and signed zeros.
#[test]
fn cast_epilogues_round_as_the_reference_bit_for_bit() {
    let xs: Vec<f64> = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        65504.0,
        65519.99609375,
        65520.0,
        1.0e-5,
        6.0e-8,
        2f64.powi(-25),
        1.0e-40,
        -2.5e-39,
        f32::MAX as f64,
        1.00390625,
        1.01171875,
        -3.333333333,
        7.0e-3,
    ];
    let ws = [1.0, -1.0, 0.5, 2.0, 3.0, 0.0, 1.0e-3];
    for (from, to) in [
        ("f32", "bf16"),
        ("f32", "f16"),
        ("f32", "f64"),
        ("f64", "f32"),
        ("f64", "f16"),
        ("f64", "bf16"),
    ] {
        // One row (the GEMV path) and many (the GEMM), a ReLU between the product and the cast
        // for some.
        for (m, relu) in [(xs.len(), false), (xs.len(), true), (1, false)] {
            let n = ws.len();
            let (last, act) = if relu {
                ("%r", "%r = relu(%h)\n")
            } else {
                ("%h", "")
            };
            let text = format!(
                "%x = input() name=\"x\" : {from}[{m}, 1]\n%w = input() name=\"w\" : {from}[1, {n}]\n\
                 %h = matmul(%x, %w)\n{act}%y = cast({last}) to={to}\noutput \"y\" = %y\n"
            );
            let graph = parse_graph(&text).unwrap();
            let dtype = if from == "f32" {
                kfuse_ir::DType::F32
            } else {
                kfuse_ir::DType::F64
            };
            let array = |dims: Vec<usize>, v: Vec<f64>| {
                kfuse_interp::elementwise::cast(&Array::from_vec(dims, v).unwrap(), dtype)
            };
            let inputs = vec![
                ("x".to_string(), array(vec![m, 1], xs[..m].to_vec())),
                ("w".to_string(), array(vec![1, n], ws.to_vec())),
            ];
            let want = kfuse_interp::run(&graph, &inputs, &CustomOps::new()).unwrap();
            for numerics in [Numerics::Fast, Numerics::Strict] {
                let exe = build(&graph, numerics);
                assert!(
                    matches!(
                        exe.program.steps[..],
                        [kfuse_kernel::Step::Structured { .. }]
                    ),
                    "{from} -> {to}: one structured step"
                );
                let (got, _) = exe.run(&inputs, &CustomOps::new()).unwrap();
                let (w, g) = (&want[0].1, &got[0].1);
                assert_eq!(g.dtype(), w.dtype());
                for i in 0..w.n_elems() {
                    let (a, b) = (w.get_f64(i), g.get_f64(i));
                    // Fast GEMMs may give a zero product's sum either sign (the reference sums
                    // from +0); every other value is the reference's, bit for bit.
                    let same = match numerics {
                        Numerics::Fast => a == b,
                        Numerics::Strict => w.get_bits(i) == g.get_bits(i),
                    };
                    assert!(
                        same || a.is_nan() && b.is_nan(),
                        "{from} -> {to} ({numerics:?}, relu {relu}): element {i} \
                         (x {}, w {}) reference {a:e}, got {b:e}",
                        xs[i / n],
                        ws[i % n]
                    );
                }
            }
        }
    }
}

#[test]
fn random_structured_matmuls_match_the_reference() {
    let mut rng = Rng::new(91);
    for k in 0..60u64 {
        let (m, kk, n) = (1 + rng.below(9), rng.below(12), 1 + rng.below(9));
        let batch = if rng.below(2) == 0 {
            "".to_string()
        } else {
            format!("{}, ", 1 + rng.below(3))
        };
        let (ta, tb) = (rng.below(2) == 0, rng.below(2) == 0);
        let a_src = if ta {
            format!("[{batch}{kk}, {m}]")
        } else {
            format!("[{batch}{m}, {kk}]")
        };
        let b_src = if tb {
            format!("[{n}, {kk}]")
        } else {
            format!("[{kk}, {n}]")
        };
        let perm = |rank: usize| {
            let mut p: Vec<usize> = (0..rank).collect();
            p.swap(rank - 2, rank - 1);
            format!("{p:?}")
        };
        let a_rank = if batch.is_empty() { 2 } else { 3 };
        let mut text = format!(
            "%a = input() name=\"a\" : f32{a_src}\n%b = input() name=\"b\" : f32{b_src}\n%bias = input() name=\"bias\" : f32[{n}]\n"
        );
        let a = if ta {
            text += &format!("%at = permute(%a) perm={}\n", perm(a_rank));
            "%at"
        } else {
            "%a"
        };
        let b = if tb {
            text += &format!("%bt = permute(%b) perm={}\n", perm(2));
            "%bt"
        } else {
            "%b"
        };
        text += &format!("%h = matmul({a}, {b})\n%s0 = add(%h, %bias)\n");
        // One draw in three scales the sum per column, one by a single factor (either operand
        // order).
        let scaled = match rng.below(3) {
            0 => {
                text += &format!("%g = input() name=\"g\" : f32[{n}]\n%s = mul(%g, %s0)\n");
                "%s"
            }
            1 => {
                text += "%g = input() name=\"g\" : f32[1]\n%s = mul(%s0, %g)\n";
                "%s"
            }
            _ => "%s0",
        };
        // One draw in three adds a skip connection of the output's shape.
        let sum = if rng.below(3) == 0 {
            text += &format!(
                "%skip = input() name=\"skip\" : f32[{batch}{m}, {n}]\n%t = add({scaled}, %skip)\n"
            );
            "%t"
        } else {
            scaled
        };
        let activation = [
            "relu",
            "gelu_tanh",
            "gelu",
            "sigmoid",
            "tanh",
            "clamp",
            "silu",
            "hardswish",
            "hardsigmoid_mul",
            "",
        ][rng.below(10)];
        let last = if activation.is_empty() {
            sum
        } else if activation == "clamp" {
            text += &format!(
                "%lo = constant() value=[-0.25] : f32[]\n%hi = constant() value=[0.5] : f32[]\n\
                 %r = clamp({sum}, %lo, %hi)\n"
            );
            "%r"
        } else {
            text += &activate(activation, sum, "r", "f32");
            "%r"
        };
        // One draw in four casts the result to another float dtype.
        let last = match rng.below(8) {
            0 => {
                text += &format!("%c = cast({last}) to=bf16\n");
                "%c"
            }
            1 => {
                text += &format!("%c = cast({last}) to=f16\n");
                "%c"
            }
            _ => last,
        };
        text += &format!("output \"y\" = {last}\n");
        check_one_step(&text, 5000 + k, kk + 2, &format!("random matmul {k}"));
    }
}

/// Random graphs of products and their neighbours, the structured groups' search space: chains
/// of matmuls (some through a transposed weight) or of 3×3, 1×1 and depthwise convolutions
/// (separable blocks and inverted residuals where the uses allow), with bias
/// adds, adds of any two values (two products, a product and an input, a value and itself),
/// activations, values read by several nodes, and graph outputs in the middle of chains. Each
/// compiles, runs, and matches the reference (fast within the summation bound, strict bit for
/// bit). An add of two products once had both claim it, and lowering panicked.
#[test]
fn random_graphs_of_products_match_the_reference() {
    let mut rng = Rng::new(20_261_122);
    let (mut structured, mut separable) = (0, 0);
    for case in 0..120 {
        let convs = case % 3 != 0;
        let (n, k) = (1 + rng.below(3), 1 + rng.below(12));
        let (h, w) = (1 + rng.below(7), 1 + rng.below(9));
        let shape = if convs {
            format!("[{n}, {k}, {h}, {w}]")
        } else {
            format!("[{}, {k}]", n * h)
        };
        let mut text = format!("%x = input() name=\"x\" : f32{shape}\n");
        let mut values = vec!["%x".to_string()];
        let mut products = 0;
        let steps = 3 + rng.below(7);
        for s in 0..steps {
            // Half the time the latest value: chains, where the groups form.
            let a = if rng.below(2) == 0 {
                values.last().unwrap().clone()
            } else {
                values[rng.below(values.len())].clone()
            };
            let out = format!("%v{s}");
            match rng.below(7) {
                6 if convs => {
                    // Depthwise: with a 1×1 convolution after it, a separable block (and with
                    // one before, an inverted residual), if the values' other users allow.
                    let kk = [3, 5][rng.below(2)];
                    let p = kk / 2;
                    text += &format!(
                        "%w{s} = input() name=\"w{s}\" : f32[{k}, 1, {kk}, {kk}]\n\
                         {out} = conv2d({a}, %w{s}) layout=nchw stride=[1, 1] padding=[{p}, {p}, {p}, {p}] dilation=[1, 1] groups={k}\n"
                    );
                    products += 1;
                }
                0 | 1 if convs => {
                    let kk = [1, 3][rng.below(2)];
                    let p = kk / 2;
                    text += &format!(
                        "%w{s} = input() name=\"w{s}\" : f32[{k}, {k}, {kk}, {kk}]\n\
                         {out} = conv2d({a}, %w{s}) layout=nchw stride=[1, 1] padding=[{p}, {p}, {p}, {p}] dilation=[1, 1] groups=1\n"
                    );
                    products += 1;
                }
                0 => {
                    text += &format!(
                        "%w{s} = input() name=\"w{s}\" : f32[{k}, {k}]\n{out} = matmul({a}, %w{s})\n"
                    );
                    products += 1;
                }
                1 => {
                    text += &format!(
                        "%w{s} = input() name=\"w{s}\" : f32[{k}, {k}]\n\
                         %t{s} = permute(%w{s}) perm=[1, 0]\n{out} = matmul({a}, %t{s})\n"
                    );
                    products += 1;
                }
                2 => {
                    let bias = if convs {
                        format!("[{k}, 1, 1]")
                    } else {
                        format!("[{k}]")
                    };
                    text += &format!(
                        "%b{s} = input() name=\"b{s}\" : f32{bias}\n{out} = add({a}, %b{s})\n"
                    );
                }
                3 | 4 => {
                    let b = &values[rng.below(values.len())];
                    text += &format!("{out} = add({a}, {b})\n");
                }
                _ => {
                    let act = ["relu", "tanh", "sigmoid"][rng.below(3)];
                    text += &format!("{out} = {act}({a})\n");
                }
            }
            values.push(out);
        }
        let last = values.last().unwrap().clone();
        text += &format!("output \"y\" = {last}\n");
        for (i, v) in values.iter().enumerate().skip(1) {
            if *v != last && rng.below(4) == 0 {
                text += &format!("output \"o{i}\" = {v}\n");
            }
        }
        let graph = parse_graph(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let inputs = random_inputs(&graph, 5000 + case);
        // Each product sums at most 25 k terms, and the error of a chain's earlier products is
        // carried by the later ones' magnitudes.
        let terms = 25 * k * (products + 1);
        check(
            &graph,
            &inputs,
            terms,
            &format!("random graph {case}:\n{text}"),
        );
        for step in &build(&graph, Numerics::Fast).program.steps {
            if let kfuse_kernel::Step::Structured { call, .. } = step {
                match &call.anchor {
                    kfuse_kernel::Anchor::Conv {
                        depthwise: Some(d), ..
                    } => separable += 1 + usize::from(d.expand.is_some()),
                    _ => structured += 1,
                }
            }
        }
    }
    // The draws reach the groups they are meant to exercise.
    assert!(
        structured >= 40 && separable >= 5,
        "{structured} structured steps, {separable} separable"
    );
}

/// Fast numerics flush the subnormal results of a transcendental activation in an epilogue
/// (`kfuse_routines::fpmode`), leave the calling thread's mode as it was, and keep subnormal products
/// exactly; strict numerics keep every subnormal. The GELU of a pre-activation of -10.5 is
/// subnormal (about -5e-40), as in W5b's first layer.
#[test]
fn fast_activation_epilogues_flush_subnormal_results_and_nothing_else_does() {
    let f32s = |dims: Vec<usize>, values: Vec<f64>| {
        let a = Array::from_vec(dims, values).unwrap();
        kfuse_interp::elementwise::cast(&a, kfuse_ir::DType::F32)
    };
    let tiny = f64::from(f32::MIN_POSITIVE);
    // Row 0's products are subnormal (MIN_POSITIVE / 8 and / 4) but one; row 1's
    // pre-activations are -10.5, 1.0, -3.0 and 0.5.
    let inputs = [
        (
            "x".to_string(),
            f32s(vec![2, 3], vec![tiny, 0.0, 0.0, 1.0, 0.0, 0.0]),
        ),
        (
            "w".to_string(),
            f32s(
                vec![3, 4],
                vec![
                    0.125, -0.125, 0.25, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
                ],
            ),
        ),
        (
            "b".to_string(),
            f32s(vec![4], vec![-10.625, 1.125, -3.25, -1.5]),
        ),
    ];
    let head = "%x = input() name=\"x\" : f32[2, 3]\n\
        %w = input() name=\"w\" : f32[3, 4]\n\
        %p = matmul(%x, %w)\n";
    let product = format!("{head}output \"y\" = %p\n");
    let dense = format!(
        "{head}%b = input() name=\"b\" : f32[4]\n\
        %s = add(%p, %b)\n%g = gelu_tanh(%s)\noutput \"y\" = %g\n"
    );
    let mut results = Vec::new();
    for text in [&product, &dense] {
        let graph = parse_graph(text).unwrap();
        let inputs: Vec<_> = inputs
            .iter()
            .filter(|(n, _)| graph.inputs().any(|(_, name, _)| name == n))
            .cloned()
            .collect();
        let run = |numerics| {
            let exe = build(&graph, numerics);
            assert_eq!(exe.program.steps.len(), 1, "one structured step:\n{text}");
            let (outputs, _) = exe.run(&inputs, &CustomOps::new()).unwrap();
            assert!(
                !kfuse_routines::fpmode::flushing(),
                "the caller's mode is restored"
            );
            let y = outputs.into_iter().next().unwrap().1;
            (0..8).map(|i| y.get_f64(i) as f32).collect::<Vec<f32>>()
        };
        let want = kfuse_interp::run(&graph, &inputs, &CustomOps::new()).unwrap();
        let want: Vec<f32> = (0..8).map(|i| want[0].1.get_f64(i) as f32).collect();
        let (fast, strict) = (run(Numerics::Fast), run(Numerics::Strict));
        for i in 0..8 {
            assert_eq!(
                strict[i].to_bits(),
                want[i].to_bits(),
                "strict [{i}]:\n{text}"
            );
        }
        results.push((want, fast));
    }
    let (want, fast) = &results[0];
    assert_eq!(want[0], f32::MIN_POSITIVE / 8.0);
    assert_eq!(want[1], -want[0]);
    assert!(!want[2].is_normal() && want[3].is_normal());
    let (want_g, fast_g) = &results[1];
    assert!(
        want_g[4] < 0.0 && !want_g[4].is_normal(),
        "gelu_tanh(-10.5) = {:e}",
        want_g[4]
    );
    // The products, subnormal or not, are the reference's (one term each).
    for i in 0..8 {
        assert_eq!(fast[i].to_bits(), want[i].to_bits(), "fast product [{i}]");
    }
    #[cfg(target_arch = "x86_64")]
    {
        // Flushed to zero of its sign.
        assert_eq!(fast_g[4].to_bits(), (-0.0f32).to_bits());
        // Normal results are the reference's within fast numerics' bounds.
        for i in [0, 1, 2, 3, 5, 6, 7] {
            let (f, r) = (fast_g[i], want_g[i]);
            assert!(
                (f - r).abs() <= 1e-6 * r.abs().max(1.0),
                "g[{i}]: {f} against {r}"
            );
        }
    }
}

/// A strided convolution with its bias and activation, then a pooling of its result (ResNet's
/// stem), is one structured step, and matches the reference: fast within the sums' bound,
/// strict bit for bit. On AVX-512 most of these run in one pass, pooled from the direct
/// kernel's stage band by band (several bands per image, odd sizes, a last partial block of
/// output channels, windows over the padding, dilated windows, non-square strides); an
/// average, an activation applied outside the kernel's registers, and a plane with a NaN
/// take the pooling's own routine on a copy of the band's rows; narrow outputs (on tap planes)
/// and an empty batch run the two ops.
#[test]
fn pooled_convolutions_match_the_reference() {
    // x, output channels, kernel, conv stride, conv padding; pooling kind, window, stride,
    // padding, dilation, count_include_pad; activation.
    type PoolCase = (
        [usize; 4],
        usize,
        [usize; 2],
        [usize; 2],
        [usize; 4],
        (
            &'static str,
            [usize; 2],
            [usize; 2],
            [usize; 4],
            [usize; 2],
            bool,
        ),
        &'static str,
    );
    let max3 = ("max", [3, 3], [2, 2], [1, 1, 1, 1], [1, 1], false);
    let cases: [PoolCase; 11] = [
        // The stem, smaller: 7×7 at stride 2, then 3×3 at stride 2.
        (
            [2, 3, 64, 64],
            16,
            [7, 7],
            [2, 2],
            [3, 3, 3, 3],
            max3,
            "relu",
        ),
        // Odd sizes and a last partial block of output channels; several bands per image.
        (
            [1, 5, 121, 59],
            9,
            [3, 3],
            [2, 2],
            [1, 1, 1, 1],
            max3,
            "relu",
        ),
        (
            [2, 4, 200, 120],
            8,
            [5, 5],
            [2, 2],
            [2, 2, 2, 2],
            max3,
            "clamp",
        ),
        // VGG's window, no padding; a dilated window reaching into the padding.
        (
            [2, 8, 60, 64],
            16,
            [3, 3],
            [2, 2],
            [1, 1, 1, 1],
            ("max", [2, 2], [2, 2], [0, 0, 0, 0], [1, 1], false),
            "relu",
        ),
        (
            [1, 6, 90, 70],
            12,
            [3, 3],
            [2, 2],
            [1, 1, 1, 1],
            ("max", [3, 3], [1, 1], [1, 1, 1, 1], [2, 2], false),
            "relu",
        ),
        // Non-square strides on both ops.
        (
            [2, 3, 97, 120],
            16,
            [3, 5],
            [2, 3],
            [1, 2, 2, 1],
            ("max", [3, 2], [3, 2], [1, 0, 1, 0], [1, 1], false),
            "relu",
        ),
        // Averages, with and without the padding counted; an activation outside registers.
        (
            [1, 4, 80, 72],
            8,
            [3, 3],
            [2, 2],
            [1, 1, 1, 1],
            ("avg", [3, 3], [2, 2], [1, 1, 1, 1], [1, 1], false),
            "relu",
        ),
        (
            [1, 4, 80, 72],
            8,
            [3, 3],
            [2, 2],
            [1, 1, 1, 1],
            ("avg", [2, 3], [2, 2], [1, 0, 1, 1], [1, 1], true),
            "relu",
        ),
        (
            [2, 3, 70, 66],
            16,
            [3, 3],
            [2, 2],
            [1, 1, 1, 1],
            max3,
            "gelu_tanh",
        ),
        // Output rows under 28 wide run on tap planes, which have no stage to pool from: the
        // two ops inside the step. An empty batch.
        (
            [2, 8, 40, 40],
            16,
            [3, 3],
            [2, 2],
            [1, 1, 1, 1],
            max3,
            "relu",
        ),
        (
            [0, 3, 64, 64],
            16,
            [7, 7],
            [2, 2],
            [3, 3, 3, 3],
            max3,
            "relu",
        ),
    ];
    let mut one_pass = 0;
    for (k, (x, c_out, kernel, stride, padding, pool, act)) in cases.iter().enumerate() {
        let (kind, window, pool_stride, pool_padding, dilation, include) = pool;
        let [n, c, h, w] = *x;
        let activation = match *act {
            "clamp" => "%lo = constant() value=[0.0] : f32[]\n%hi = constant() value=[6.0] : f32[]\n%a = clamp(%s, %lo, %hi)\n".to_string(),
            other => format!("%a = {other}(%s)\n"),
        };
        let text = format!(
            "%x = input() name=\"x\" : f32[{n}, {c}, {h}, {w}]\n\
             %w = input() name=\"w\" : f32[{c_out}, {c}, {}, {}]\n\
             %b = input() name=\"b\" : f32[{c_out}, 1, 1]\n\
             %c = conv2d(%x, %w) layout=nchw stride={stride:?} padding={padding:?} dilation=[1, 1] groups=1\n\
             %s = add(%c, %b)\n{activation}\
             %y = pool2d(%a) kind={kind} layout=nchw window={window:?} stride={pool_stride:?} padding={pool_padding:?} dilation={dilation:?} count_include_pad={include}\n\
             output \"y\" = %y\n",
            kernel[0], kernel[1]
        );
        let graph = parse_graph(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let exe = build(&graph, Numerics::Fast);
        assert_eq!(
            exe.program.steps.len(),
            1,
            "case {k} is one structured step:\n{text}"
        );
        let kfuse_kernel::Step::Structured { call, .. } = &exe.program.steps[0] else {
            panic!("case {k} is a structured step:\n{text}");
        };
        let pooled = call.pool.as_ref().expect("the pooling is absorbed");
        let conv_dims = pooled.conv_ty.shape.dims();
        if kfuse_routines::conv::pools_in_one_pass(
            &[n, c, h, w],
            &[*c_out, c, kernel[0], kernel[1]],
            &kfuse_ir::Conv2dAttrs {
                layout: kfuse_ir::Layout::Nchw,
                stride: *stride,
                padding: *padding,
                dilation: [1, 1],
                groups: 1,
            },
            conv_dims,
            kfuse_ir::DType::F32,
            &pooled.attrs,
        ) {
            one_pass += 1;
            assert!(k < 9, "case {k} has no stage to pool from:\n{text}");
        }
        let mut inputs = random_inputs(&graph, 5000 + k as u64);
        if k == 0 || k == 3 {
            // Non-finite values and signed zeros: a NaN's plane is pooled on the pooling's
            // own routine, which keeps the reference's NaN.
            let mut values: Vec<f32> = inputs[0].1.as_slice::<f32>().unwrap().to_vec();
            values[1234] = f32::NAN;
            values[77] = f32::INFINITY;
            values[4321] = f32::NEG_INFINITY;
            values[500] = -0.0;
            inputs[0].1 = Array::from_vec(inputs[0].1.shape().dims().to_vec(), values).unwrap();
        }
        check(
            &graph,
            &inputs,
            c * kernel[0] * kernel[1] + 1,
            &format!("pooled convolution {k}:\n{text}"),
        );
    }
    #[cfg(target_arch = "x86_64")]
    let avx512 = is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512dq");
    #[cfg(not(target_arch = "x86_64"))]
    let avx512 = false;
    if avx512 {
        assert!(
            one_pass >= 7,
            "only {one_pass} of the 11 cases ran in one pass on this AVX-512 CPU"
        );
    } else {
        eprintln!(
            "the one-pass kernel needs AVX-512, which this CPU lacks: every case ran as two ops"
        );
    }
}
