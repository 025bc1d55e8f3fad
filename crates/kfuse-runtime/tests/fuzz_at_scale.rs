//! Random programs at sizes that reach every code path of compiled kernels, against the
//! reference interpreter. The random-graph fuzzers elsewhere use tensors of a few elements,
//! which never reach the thread pool (work past `kfuse_cpu::GRAIN` elements), the 16-lane
//! vector bodies and their tails, streaming stores (outputs of 16 MiB and more) or transposed
//! reads in tiles. Here each program is drawn over one of a set of shapes chosen for those
//! paths, with NaN, infinities, signed zeros and subnormals among the inputs.
//!
//! Strict numerics must give the reference's bits (NaNs compare as NaN: kfuse promises no NaN
//! payload). Fast numerics are checked one op at a time against the bounds of
//! `docs/numerics.md`: an elementwise op within 4 ULP of the reference, a sum of `n` terms
//! within `n * eps * sum |x_i|`. Every comparison checks the output count, names, dtypes and
//! shapes first.

use kfuse_cpu::Numerics;
use kfuse_fusion::{FixedCostModel, FusePolicy};
use kfuse_interp::CustomOps;
use kfuse_ir::text::parse_graph;
use kfuse_ir::{Array, DType, Graph};
use kfuse_runtime::{compile_with, Backend, Executable, Options, Tier};
use kfuse_testkit::Rng;

fn build(graph: &Graph, numerics: Numerics) -> Executable {
    let options = Options {
        policy: FusePolicy::Cost,
        numerics,
        backend: Backend::Auto,
        cache_dir: std::env::temp_dir().join(format!("kfuse-scale-cache-{}", std::process::id())),
        graph_passes: false,
        keep_layouts: false,
    };
    compile_with(graph, &options, &FixedCostModel::default()).expect("compiles")
}

/// The shapes programs are drawn over, `[rows, cols]`, and what each reaches.
const SHAPES: &[([usize; 2], &str)] = &[
    // 67,591 elements: past the grain, so the pool splits the work; odd rows for the tails.
    ([257, 263], "threaded, vector tails"),
    // Long rows: many vector blocks per row, a remainder of 3.
    ([3, 100_003], "long rows"),
    // 4.2 M f32 elements: outputs of 16 MiB and more stream their stores.
    ([2048, 2056], "streaming stores"),
    // Shorter than a vector.
    ([1031, 7], "rows shorter than a vector"),
    ([1, 1], "one element"),
    ([0, 17], "no elements"),
];

/// The shape of a value: the whole `[r, c]`, a row `[1, c]`, a column `[r, 1]`, or the
/// transpose `[c, r]`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Full,
    Row,
    Col,
    Transposed,
}

/// The kind of `a op b` under broadcasting, where they combine.
fn combine(a: Kind, b: Kind) -> Option<Kind> {
    use Kind::*;
    match (a, b) {
        (Transposed, Transposed) => Some(Transposed),
        (Transposed, _) | (_, Transposed) => None,
        (Row, Row) => Some(Row),
        (Col, Col) => Some(Col),
        _ => Some(Full),
    }
}

const UNARY: &[&str] = &[
    "exp",
    "log",
    "tanh",
    "sigmoid",
    "softplus",
    "sqrt",
    "abs",
    "neg",
    "relu",
    "sin",
    "cos",
    "floor",
    "ceil",
    "round",
    "reciprocal",
    "log1p",
    "exp2",
    "log2",
    "erf",
    "gelu",
    "gelu_tanh",
];
const BINARY: &[&str] = &["add", "sub", "mul", "div", "max", "min", "pow"];
const COMPARE: &[&str] = &["lt", "le", "gt", "ge", "eq", "ne"];

/// A random program over `[rows, cols]` of `dtype`, as `.kf` text: inputs of every kind, then
/// `n_ops` elementwise ops, selects, row reductions broadcast back, and transposes.
fn random_program(rng: &mut Rng, [rows, cols]: [usize; 2], dtype: &str, n_ops: usize) -> String {
    let ty = |kind: Kind| match kind {
        Kind::Full => format!("{dtype}[{rows}, {cols}]"),
        Kind::Row => format!("{dtype}[1, {cols}]"),
        Kind::Col => format!("{dtype}[{rows}, 1]"),
        Kind::Transposed => format!("{dtype}[{cols}, {rows}]"),
    };
    let mut text = String::new();
    let mut values: Vec<(String, Kind)> = Vec::new();
    for (name, kind) in [
        ("x", Kind::Full),
        ("y", Kind::Full),
        ("w", Kind::Row),
        ("r", Kind::Col),
        ("t", Kind::Transposed),
    ] {
        text += &format!("%{name} = input() name=\"{name}\" : {}\n", ty(kind));
        values.push((name.to_string(), kind));
    }
    let mut made = Vec::new();
    for i in 0..n_ops {
        let out = format!("v{i}");
        let (a, ka) = rng.pick(&values);
        let (b, kb) = rng.pick(&values);
        let line = match rng.below(10) {
            0..=3 => {
                values.push((out.clone(), ka));
                format!("%{out} = {}(%{a})", rng.pick(UNARY))
            }
            4..=6 => match combine(ka, kb) {
                Some(kind) => {
                    values.push((out.clone(), kind));
                    format!("%{out} = {}(%{a}, %{b})", rng.pick(BINARY))
                }
                None => continue,
            },
            7 => {
                let (c, kc) = rng.pick(&values);
                let Some(kind) = combine(ka, kb).and_then(|k| combine(k, kc)) else {
                    continue;
                };
                let cond = format!("c{i}");
                text += &format!("%{cond} = {}(%{a}, %{b})\n", rng.pick(COMPARE));
                values.push((out.clone(), kind));
                format!("%{out} = select(%{cond}, %{a}, %{c})")
            }
            8 if ka == Kind::Full => {
                // A row reduction broadcast back over its row, as softmax and layer norm do.
                let op = rng.pick(&["reduce_sum", "reduce_max", "reduce_min", "reduce_mean"]);
                let red = format!("s{i}");
                text += &format!("%{red} = {op}(%{a}) axes=[1] keepdims=true\n");
                values.push((out.clone(), Kind::Full));
                format!("%{out} = sub(%{a}, %{red})")
            }
            9 if ka == Kind::Full || ka == Kind::Transposed => {
                // A transpose read across rows (in tiles where the kernel has no reduction).
                let kind = if ka == Kind::Full {
                    Kind::Transposed
                } else {
                    Kind::Full
                };
                values.push((out.clone(), kind));
                format!("%{out} = permute(%{a}) perm=[1, 0]")
            }
            _ => continue,
        };
        text += &line;
        text.push('\n');
        made.push(out);
    }
    if made.is_empty() {
        text += "%v = add(%x, %y)\n";
        made.push("v".into());
    }
    // The last value and up to two others are outputs.
    let mut outputs = vec![made.last().unwrap().clone()];
    for _ in 0..rng.below(3) {
        let v = rng.pick(&made);
        if !outputs.contains(&v) {
            outputs.push(v);
        }
    }
    for (k, v) in outputs.iter().enumerate() {
        text += &format!("output \"o{k}\" = %{v}\n");
    }
    text
}

/// A value in [0, 1) on a grid of a millionth.
fn unit(rng: &mut Rng) -> f64 {
    rng.below(1_000_000) as f64 / 1e6
}

/// Values for an input: mostly moderate, a few of every edge kind.
fn edgy(rng: &mut Rng, n: usize, dtype: DType) -> Array {
    let specials = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -0.0,
        1e-40,
        -3e-39,
        f64::from(f32::MIN_POSITIVE),
        1e30,
        -88.5,
        88.7,
    ];
    let values: Vec<f64> = (0..n)
        .map(|_| {
            if rng.chance(0.03) {
                rng.pick(&specials)
            } else {
                (unit(rng) - 0.5) * 8.0
            }
        })
        .collect();
    let array = Array::from_vec(vec![n], values).unwrap();
    kfuse_interp::elementwise::cast(&array, dtype)
}

/// The inputs of a program from [`random_program`].
fn inputs_of(graph: &Graph, rng: &mut Rng) -> Vec<(String, Array)> {
    graph
        .inputs()
        .map(|(_, name, ty)| {
            let flat = edgy(rng, ty.shape.n_elems(), ty.dtype);
            let array = Array::new(ty.shape.clone(), flat.storage().clone()).unwrap();
            (name.to_string(), array)
        })
        .collect()
}

/// Both results have the same outputs, by name, dtype and shape.
fn same_outputs(what: &str, want: &[(String, Array)], got: &[(String, Array)]) {
    assert_eq!(want.len(), got.len(), "{what}: output count");
    for ((wn, w), (gn, g)) in want.iter().zip(got) {
        assert_eq!(wn, gn, "{what}: output names");
        assert_eq!(w.dtype(), g.dtype(), "{what}: {wn}'s dtype");
        assert_eq!(w.shape(), g.shape(), "{what}: {wn}'s shape");
    }
}

#[test]
fn random_programs_at_every_size_are_bit_exact_in_strict_mode() {
    let mut rng = Rng::new(0x5ca1e);
    let mut checked = 0;
    for (round, ([rows, cols], reaches)) in SHAPES.iter().cycle().take(18).enumerate() {
        // The streaming size is costly on the interpreter: fewer programs, fewer ops.
        let big = rows * cols > 1 << 20;
        if big && round >= SHAPES.len() * 2 {
            continue;
        }
        let dtype = if round % 5 == 4 { "f64" } else { "f32" };
        let n_ops = if big { 6 } else { 4 + rng.below(10) };
        let text = random_program(&mut rng, [*rows, *cols], dtype, n_ops);
        let what = format!("round {round} ({reaches}, {rows}x{cols} {dtype}):\n{text}");
        let graph = parse_graph(&text).unwrap_or_else(|e| panic!("{what}{e}"));
        let inputs = inputs_of(&graph, &mut rng);
        let exe = build(&graph, Numerics::Strict);
        // f64 `erf` and `gelu` run on the tile interpreter (C has no bit-exact f64 erf), which
        // is checked the same way; everything else must be compiled C.
        for tier in exe.tiers.iter().flatten() {
            if let Tier::Tile { reason } = tier {
                assert!(
                    dtype == "f64" && reason.contains("erf"),
                    "{what}a kernel fell back to the tile interpreter: {reason}"
                );
            }
        }
        let want = kfuse_interp::run(&graph, &inputs, &CustomOps::new())
            .unwrap_or_else(|e| panic!("{what}{e}"));
        let (got, _) = exe
            .run(&inputs, &CustomOps::new())
            .unwrap_or_else(|e| panic!("{what}{e}"));
        same_outputs(&what, &want, &got);
        for ((name, w), (_, g)) in want.iter().zip(&got) {
            for i in 0..w.n_elems() {
                let (wv, gv) = (w.get_f64(i), g.get_f64(i));
                assert!(
                    (wv.is_nan() && gv.is_nan()) || w.get_bits(i) == g.get_bits(i),
                    "{what}{name}[{i}]: compiled {gv:e}, reference {wv:e}"
                );
            }
        }
        checked += 1;
    }
    assert!(checked >= 14, "{checked} programs checked");
}

/// The distance in units in the last place between two f32 values of one sign (zeros of
/// either sign are one value).
fn ulps(a: f32, b: f32) -> u64 {
    let key = |v: f32| {
        let bits = v.to_bits() as i64;
        if bits < 0 {
            -(bits & 0x7fff_ffff)
        } else {
            bits
        }
    };
    key(a).abs_diff(key(b))
}

#[test]
fn fast_mode_stays_within_its_bounds_at_scale() {
    let [rows, cols] = [257, 263];
    let mut rng = Rng::new(0xfa57);
    // Elementwise ops, one at a time, on moderate inputs (fast mode promises nothing at a pole
    // or an overflow: docs/numerics.md).
    for op in [
        "exp",
        "tanh",
        "sigmoid",
        "sqrt",
        "sin",
        "cos",
        "reciprocal",
        "log",
        "erf",
    ] {
        let text = format!(
            "%x = input() name=\"x\" : f32[{rows}, {cols}]\n%y = {op}(%x)\noutput \"y\" = %y\n"
        );
        let graph = parse_graph(&text).unwrap();
        let values: Vec<f32> = (0..rows * cols)
            .map(|_| 0.05 + unit(&mut rng) as f32 * 4.0)
            .collect();
        let inputs = vec![(
            "x".to_string(),
            Array::from_vec(vec![rows, cols], values).unwrap(),
        )];
        let want = kfuse_interp::run(&graph, &inputs, &CustomOps::new()).unwrap();
        let (got, _) = build(&graph, Numerics::Fast)
            .run(&inputs, &CustomOps::new())
            .unwrap();
        same_outputs(op, &want, &got);
        let (w, g) = (
            want[0].1.as_slice::<f32>().unwrap(),
            got[0].1.as_slice::<f32>().unwrap(),
        );
        for (i, (&wv, &gv)) in w.iter().zip(g).enumerate() {
            assert!(
                ulps(wv, gv) <= 4,
                "{op}[{i}]: fast {gv:e}, reference {wv:e}"
            );
        }
    }
    // Row sums of 100,003 terms, within n * eps * sum |x_i|.
    let [rows, cols] = [3, 100_003];
    let text = format!(
        "%x = input() name=\"x\" : f32[{rows}, {cols}]\n%s = reduce_sum(%x) axes=[1]\n\
         %a = abs(%x)\n%m = reduce_sum(%a) axes=[1]\noutput \"s\" = %s\noutput \"m\" = %m\n"
    );
    let graph = parse_graph(&text).unwrap();
    let values: Vec<f32> = (0..rows * cols)
        .map(|_| unit(&mut rng) as f32 - 0.5)
        .collect();
    let inputs = vec![(
        "x".to_string(),
        Array::from_vec(vec![rows, cols], values).unwrap(),
    )];
    let want = kfuse_interp::run(&graph, &inputs, &CustomOps::new()).unwrap();
    let (got, _) = build(&graph, Numerics::Fast)
        .run(&inputs, &CustomOps::new())
        .unwrap();
    same_outputs("row sums", &want, &got);
    for r in 0..rows {
        let (w, g, m) = (
            want[0].1.get_f64(r),
            got[0].1.get_f64(r),
            want[1].1.get_f64(r),
        );
        let bound = cols as f64 * f64::from(f32::EPSILON) * m;
        assert!(
            (w - g).abs() <= bound,
            "row {r}: fast {g}, reference {w}, bound {bound}"
        );
    }
}
