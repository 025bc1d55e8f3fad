//! Passes tested text in, text out: each file in `tests/passes` starts with `# pass: NAME`
//! (`constant-fold`, `fold-affine`, `merge-dots`, `conv-layout`, `dead-code`, or `fast` / `strict` for a whole pipeline); the
//! expected graph and the passes' notes follow the marker. Re-bless with `KFUSE_BLESS=1`.
//! Then folding is checked against the reference interpreter on random inputs.

use std::path::Path;

use kfuse_interp::CustomOps;
use kfuse_ir::text::{parse_graph, print_graph};
use kfuse_ir::{Array, Graph};
use kfuse_opt::{ConstantFold, ConvLayout, DeadCode, FoldAffine, MergeDots, Pass, Pipeline};
use kfuse_testkit::Rng;

fn pipeline_named(name: &str) -> Option<Pipeline> {
    let one = |p: Box<dyn Pass>| Some(Pipeline::new(vec![p]));
    match name {
        "constant-fold" => one(Box::<ConstantFold>::default()),
        "fold-affine" => one(Box::new(FoldAffine)),
        "dead-code" => one(Box::new(DeadCode)),
        "merge-dots" => one(Box::new(MergeDots)),
        "conv-layout" => one(Box::<ConvLayout>::default()),
        "fast" => Some(Pipeline::fast()),
        "strict" => Some(Pipeline::strict()),
        _ => None,
    }
}

#[test]
fn passes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/passes");
    let n = kfuse_testkit::run_filetests(&dir, |header, input| {
        let pipeline = header
            .strip_prefix("# pass: ")
            .and_then(pipeline_named)
            .ok_or_else(|| format!("bad header {header:?}"))?;
        let graph = parse_graph(input).map_err(|e| e.to_string())?;
        let (out, trail) = pipeline.run(&graph).map_err(|e| e.to_string())?;
        let mut text = print_graph(&out);
        for (name, _, report) in trail {
            for note in report.notes {
                text.push_str(&format!("# {name}: {note}\n"));
            }
        }
        Ok(text)
    });
    assert!(n >= 5);
}

fn random_inputs(graph: &Graph, seed: u64) -> Vec<(String, Array)> {
    kfuse_testkit::grid_inputs(graph, seed, 2.0, 500)
}

/// A constant of `n` values in `[lo, hi)`, as text.
fn constant(rng: &mut Rng, dims: &[usize], lo: f64, hi: f64) -> String {
    let n: usize = dims.iter().product();
    let values: Vec<String> = (0..n)
        .map(|_| format!("{:?}", lo + (hi - lo) * rng.below(10_000) as f64 / 10_000.0))
        .collect();
    format!("constant() value=[{}] : f32{dims:?}", values.join(", "))
}

#[test]
fn folded_batchnorm_matches_the_reference_within_rounding() {
    for seed in 0..24u64 {
        let mut rng = Rng::new(seed);
        let nhwc = seed % 2 == 1;
        let (c_in, c_out, k) = (
            1 + rng.below(4),
            1 + rng.below(5),
            1 + 2 * (seed % 2) as usize,
        );
        let (x, per_channel, layout) = if nhwc {
            (format!("[2, 5, 4, {c_in}]"), vec![c_out], "nhwc")
        } else {
            (format!("[2, {c_in}, 5, 4]"), vec![c_out, 1, 1], "nchw")
        };
        let text = format!(
            "%x = input() name=\"x\" : f32{x}\n\
             %w = {}\n%mean = {}\n%var = {}\n%gamma = {}\n%beta = {}\n\
             %eps = constant() value=[1e-5] : f32[]\n\
             %c = conv2d(%x, %w) layout={layout} stride=[1, 1] padding=[1, 1, 1, 1] dilation=[1, 1] groups=1\n\
             %n = sub(%c, %mean)\n%ve = add(%var, %eps)\n%sd = sqrt(%ve)\n%q = div(%n, %sd)\n\
             %g = mul(%gamma, %q)\n%b = add(%g, %beta)\n%y = relu(%b)\noutput \"y\" = %y\n",
            constant(&mut rng, &[c_out, c_in, k, k], -1.0, 1.0),
            constant(&mut rng, &per_channel, -1.0, 1.0),
            constant(&mut rng, &per_channel, 0.1, 2.0),
            constant(&mut rng, &per_channel, 0.5, 1.5),
            constant(&mut rng, &per_channel, -1.0, 1.0),
        );
        let graph = parse_graph(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let (folded, trail) = Pipeline::fast().run(&graph).unwrap();
        let folds: usize = trail
            .iter()
            .filter(|(name, _, _)| *name == "fold-affine")
            .map(|(_, _, r)| r.notes.len())
            .sum();
        assert_eq!(
            folds,
            1,
            "seed {seed}: the chain folds\n{}",
            print_graph(&folded)
        );
        let ops: Vec<&str> = folded.nodes().iter().map(|n| n.op.name()).collect();
        assert_eq!(
            ops.iter()
                .filter(|o| !matches!(**o, "input" | "constant"))
                .collect::<Vec<_>>(),
            vec![&"conv2d", &"add", &"relu"],
            "seed {seed}"
        );
        let inputs = random_inputs(&graph, seed);
        let want = kfuse_interp::run(&graph, &inputs, &CustomOps::new()).unwrap();
        let got = kfuse_interp::run(&folded, &inputs, &CustomOps::new()).unwrap();
        let scale = (0..want[0].1.n_elems())
            .map(|i| want[0].1.get_f64(i).abs())
            .fold(1.0, f64::max);
        for i in 0..want[0].1.n_elems() {
            let (a, b) = (want[0].1.get_f64(i), got[0].1.get_f64(i));
            assert!(
                (a - b).abs() <= 1e-5 * scale,
                "seed {seed} y[{i}]: {a} folded to {b}"
            );
        }
    }
}

#[test]
fn merged_dots_compute_the_same_values() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/passes/merge_dots.kf");
    let text = std::fs::read_to_string(path).unwrap();
    let input = text.split("# ==== expected").next().unwrap();
    let graph = parse_graph(input).unwrap();
    let (merged, _) = Pipeline::new(vec![Box::new(MergeDots)])
        .run(&graph)
        .unwrap();
    assert_ne!(graph.nodes().len(), merged.nodes().len());
    let inputs = random_inputs(&graph, 5);
    let want = kfuse_interp::run(&graph, &inputs, &CustomOps::new()).unwrap();
    let got = kfuse_interp::run(&merged, &inputs, &CustomOps::new()).unwrap();
    // Each column of the merged product is the same k-ordered sum: identical bits.
    for i in 0..want[0].1.n_elems() {
        assert_eq!(want[0].1.get_bits(i), got[0].1.get_bits(i), "y[{i}]");
    }
}

#[test]
fn layout_assignment_is_exact_on_random_nhwc_programs() {
    // Every region changes layout: compute free, layout changes free.
    let aggressive = ConvLayout {
        flops_per_second: 1.0,
        bytes_per_second: f64::INFINITY,
    };
    let mut rewritten = 0;
    for seed in 0..200u64 {
        let mut rng = Rng::new(seed);
        let text = kfuse_testkit::random_nhwc_program(&mut rng, 7, 4);
        let graph = parse_graph(&text).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{text}"));
        let (out, trail) = Pipeline::new(vec![Box::new(aggressive.clone()), Box::new(DeadCode)])
            .run(&graph)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{text}"));
        out.verify().unwrap();
        if trail[0].1.is_some() {
            rewritten += 1;
            assert!(
                out.nodes().iter().all(|n| match &n.op {
                    kfuse_ir::Op::Conv2d(a) =>
                        a.layout == kfuse_ir::Layout::Nchw
                            || graph.nodes().iter().any(|m| m.op == n.op),
                    _ => true,
                }),
                "seed {seed}"
            );
        }
        let inputs = if seed % 2 == 0 {
            // Edge values: NaN, infinities, signed zeros, subnormals.
            graph
                .inputs()
                .map(|(_, name, ty)| (name.to_string(), kfuse_testkit::random_array(&mut rng, ty)))
                .collect()
        } else {
            random_inputs(&graph, seed)
        };
        let want = kfuse_interp::run(&graph, &inputs, &CustomOps::new()).unwrap();
        let got = kfuse_interp::run(&out, &inputs, &CustomOps::new())
            .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", print_graph(&out)));
        for ((name, a), (_, b)) in want.iter().zip(&got) {
            assert_eq!(a.ty(), b.ty(), "seed {seed} {name}");
            for i in 0..a.n_elems() {
                assert_eq!(
                    a.get_bits(i),
                    b.get_bits(i),
                    "seed {seed} {name}[{i}]\n{text}\n{}",
                    print_graph(&out)
                );
            }
        }
    }
    assert!(rewritten >= 80, "{rewritten} of 200 programs rewritten");
}
