//! A MobileNetV2 block as an exporter writes it, batchnorms and ReLU6 spelled out, becomes one
//! structured kernel in fast numerics: each batchnorm folds into the weights before it and a
//! bias, and the (expansion, its bias and ReLU6,) depthwise convolution, its bias, its ReLU6,
//! the pointwise convolution, its bias and the skip connection run together. The result stays
//! within rounding of the reference interpreter running the graph as written. In NHWC the
//! layout assignment runs it in NCHW, the layout changing at its input and output only.

use kfuse::kernel::Step;
use kfuse::{Array, CustomOps, Options};

/// A small deterministic generator (the test needs values, not statistics).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A constant node's text: `dims` values in `[lo, hi)`.
    fn constant(&mut self, dims: &[usize], lo: f64, hi: f64) -> String {
        let n: usize = dims.iter().product();
        let values: Vec<String> = (0..n)
            .map(|_| format!("{:?}", (lo + (hi - lo) * self.next()) as f32))
            .collect();
        format!("constant() value=[{}] : f32{dims:?}", values.join(", "))
    }
}

/// `x → [1×1 expansion to `expand` channels → batchnorm → ReLU6 →] depthwise 3×3 → batchnorm →
/// ReLU6 → pointwise → batchnorm → + x`, in `layout`.
fn block(layout: &str, seed: u64, expand: Option<usize>) -> String {
    let mut rng = Lcg(seed);
    let c_in = 16;
    let c = expand.unwrap_or(c_in);
    let (x, per_channel, per_out) = if layout == "nchw" {
        ("[2, 16, 14, 11]", vec![c, 1, 1], vec![c_in, 1, 1])
    } else {
        ("[2, 14, 11, 16]", vec![c], vec![c_in])
    };
    let mut text = format!("%x = input() name=\"x\" : f32{x}\n");
    for (name, dims, lo, hi) in [
        ("we", vec![c, c_in, 1, 1], -0.3, 0.3),
        ("wd", vec![c, 1, 3, 3], -0.5, 0.5),
        ("wp", vec![c_in, c, 1, 1], -0.3, 0.3),
    ] {
        text += &format!("%{name} = {}\n", rng.constant(&dims, lo, hi));
    }
    for half in ["e", "d", "p"] {
        let dims = if half == "p" { &per_out } else { &per_channel };
        for (name, lo, hi) in [
            ("mean", -0.2, 0.2),
            ("var", 0.5, 1.5),
            ("gamma", 0.8, 1.2),
            ("beta", -0.1, 0.1),
        ] {
            text += &format!("%{name}_{half} = {}\n", rng.constant(dims, lo, hi));
        }
    }
    let batchnorm = |half: &str, input: &str| {
        format!(
            "%n_{half} = sub({input}, %mean_{half})\n%ve_{half} = add(%var_{half}, %eps)\n\
             %sd_{half} = sqrt(%ve_{half})\n%q_{half} = div(%n_{half}, %sd_{half})\n\
             %g_{half} = mul(%q_{half}, %gamma_{half})\n%bn_{half} = add(%g_{half}, %beta_{half})\n"
        )
    };
    text += "%eps = constant() value=[1e-5] : f32[]\n\
             %lo = constant() value=[0.0] : f32[]\n%hi = constant() value=[6.0] : f32[]\n";
    let mut input = "%x";
    if expand.is_some() {
        text += &format!(
            "%e = conv2d(%x, %we) layout={layout} stride=[1, 1] padding=[0, 0, 0, 0] dilation=[1, 1] groups=1\n"
        );
        text += &batchnorm("e", "%e");
        text += "%r6e = clamp(%bn_e, %lo, %hi)\n";
        input = "%r6e";
    }
    text += &format!(
        "%d = conv2d({input}, %wd) layout={layout} stride=[1, 1] padding=[1, 1, 1, 1] dilation=[1, 1] groups={c}\n"
    );
    text += &batchnorm("d", "%d");
    text += "%r6 = clamp(%bn_d, %lo, %hi)\n";
    text += &format!(
        "%p = conv2d(%r6, %wp) layout={layout} stride=[1, 1] padding=[0, 0, 0, 0] dilation=[1, 1] groups=1\n"
    );
    text += &batchnorm("p", "%p");
    text += "%y = add(%bn_p, %x)\noutput \"y\" = %y\n";
    text
}

#[test]
fn a_mobilenet_v2_block_is_one_kernel_within_rounding_of_the_reference() {
    let plain = "conv2d.depthwise+add+clamp+conv2d+add+add";
    let inverted = "conv2d.expand+add+clamp+conv2d.depthwise+add+clamp+conv2d+add+add";
    // The last two: the inverted residual with its expansion (six times the channels).
    let cases = [
        ("nchw", None, plain),
        ("nhwc", None, plain),
        ("nchw", Some(96), inverted),
        ("nhwc", Some(96), inverted),
    ];
    // In NHWC, as written and (by default) run in NCHW with the layout changes at its edges.
    let runs = cases.into_iter().enumerate().flat_map(|(k, case)| {
        let layouts: &[bool] = if case.0 == "nhwc" {
            &[true, false]
        } else {
            &[false]
        };
        layouts.iter().map(move |&keep| (k, case, keep))
    });
    for (k, (layout, expand, name), keep_layouts) in runs {
        let graph = kfuse::parse(&block(layout, 7 + k as u64, expand)).unwrap();
        let options = Options {
            keep_layouts,
            ..Options::default()
        };
        let exe = kfuse::compile(&graph, &options).unwrap();
        // A lone plain block's layout changes would cost more than its depthwise convolution
        // gains in NCHW; the inverted residual's, six times wider, pays for them.
        let changed = layout == "nhwc" && !keep_layouts && expand.is_some();
        let folds = exe
            .passes
            .iter()
            .filter(|p| p.contains("fold-affine"))
            .count();
        assert_eq!(
            folds,
            2 + usize::from(expand.is_some()),
            "{layout}: every batchnorm folds\n{:#?}",
            exe.passes
        );
        assert_eq!(
            exe.passes
                .iter()
                .any(|p| p.starts_with("conv-layout: NCHW for")),
            changed,
            "{layout}, layouts kept: {keep_layouts}\n{:#?}",
            exe.passes
        );
        let structured: Vec<&Step> = exe
            .program
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Structured { .. }))
            .collect();
        let [Step::Structured { call, .. }] = structured[..] else {
            panic!("{layout}: one structured step\n{:#?}", exe.program.steps);
        };
        assert_eq!(call.name(), name, "{layout}");
        // Every other kernel only changes the layout: permutes (and reshapes) alone.
        let others: Vec<&kfuse::fusion::Kernel> = exe
            .partition
            .kernels
            .iter()
            .filter(|k| !matches!(k.kind, kfuse::fusion::KernelKind::Structured(_)))
            .collect();
        assert!(
            others.iter().all(|k| k.nodes.iter().all(|&n| matches!(
                exe.graph.node(n).op,
                kfuse::Op::Permute { .. } | kfuse::Op::Reshape { .. }
            ))),
            "{layout}: only layout changes besides the block\n{:#?}",
            exe.program.steps
        );
        // The input's and the output's, or none.
        assert_eq!(others.len(), if changed { 2 } else { 0 }, "{layout}");

        let shape = graph.ty(graph.outputs()[0].value).shape.clone();
        let mut rng = Lcg(99 + k as u64);
        let values: Vec<f32> = (0..shape.n_elems())
            .map(|_| (rng.next() * 4.0 - 2.0) as f32)
            .collect();
        let x = Array::from_vec(shape.dims().to_vec(), values).unwrap();
        let inputs = vec![("x".to_string(), x)];
        let want = kfuse::run_graph(&graph, &inputs, &CustomOps::new()).unwrap();
        let (got, _) = exe.run(&inputs, &CustomOps::new()).unwrap();
        let (want, got) = (&want[0].1, &got[0].1);
        let scale = (0..want.n_elems())
            .map(|i| want.get_f64(i).abs())
            .fold(1.0, f64::max);
        for i in 0..want.n_elems() {
            let (w, g) = (want.get_f64(i), got.get_f64(i));
            assert!(
                (w - g).abs() <= 1e-5 * scale,
                "{layout} y[{i}]: reference {w}, fused {g}"
            );
        }
    }
}
