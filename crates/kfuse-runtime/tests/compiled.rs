//! The compiled C tier: strict mode is bit-identical to the reference interpreter (every unary op
//! over every f16 and bf16 value and sweeps of f32 and f64, binary ops, comparisons and casts on
//! edge values in every dtype, random graphs); fast mode stays within its documented bound; the
//! on-disk cache is hit on a second compile.

use std::path::PathBuf;

use kfuse_cpu::Numerics;
use kfuse_fusion::{FixedCostModel, FusePolicy};
use kfuse_interp::CustomOps;
use kfuse_ir::text::parse_graph;
use kfuse_ir::{Array, DType, Graph, Op, Storage, TensorType, UnaryOp, Value};
use kfuse_runtime::{compile_with, Backend, Executable, Options, Tier};
use kfuse_testkit::{random_array, strict_difference, Difference, GraphGen, Rng};

fn cache_dir() -> PathBuf {
    std::env::temp_dir().join(format!("kfuse-test-cache-{}", std::process::id()))
}

fn build(graph: &Graph, numerics: Numerics) -> Executable {
    build_in(graph, numerics, &cache_dir())
}

/// As [`build`], with the compile cache in `dir`. The graph passes are off: these tests are
/// about the kernels, and constant folding would take work away from them.
fn build_in(graph: &Graph, numerics: Numerics, dir: &std::path::Path) -> Executable {
    let options = Options {
        policy: FusePolicy::Cost,
        numerics,
        backend: Backend::Auto,
        cache_dir: dir.to_path_buf(),
        graph_passes: false,
        keep_layouts: false,
    };
    compile_with(graph, &options, &FixedCostModel::default()).expect("compiles")
}

/// As [`build`], with the graph passes on.
fn build_optimized(graph: &Graph, numerics: Numerics) -> Executable {
    let options = Options {
        policy: FusePolicy::Cost,
        numerics,
        backend: Backend::Auto,
        cache_dir: cache_dir(),
        graph_passes: true,
        keep_layouts: false,
    };
    compile_with(graph, &options, &FixedCostModel::default()).expect("compiles")
}

/// The first element where `got` differs from `want` under strict numerics' bit-identity: NaNs
/// match NaNs whatever their signs and payloads, everything else bit for bit.
fn same(got: &Array, want: &Array) -> Option<usize> {
    match strict_difference(got, want)? {
        Difference::Element(i) => Some(i),
        Difference::Type => panic!("compiled {} against reference {}", got.ty(), want.ty()),
    }
}

/// Runs compiled and reference and compares every output bit for bit.
fn check_strict(graph: &Graph, inputs: &[(String, Array)], what: &str) {
    let exe = build(graph, Numerics::Strict);
    for t in exe.tiers.iter().flatten() {
        if let Tier::Tile { reason } = t {
            panic!("{what}: a kernel fell back to the tile interpreter: {reason}");
        }
    }
    let (got, _) = exe
        .run(inputs, &CustomOps::new())
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let want = kfuse_interp::run(graph, inputs, &CustomOps::new()).unwrap();
    for ((name, w), (_, g)) in want.iter().zip(&got) {
        if let Some(i) = same(g, w) {
            let x: Vec<String> = inputs
                .iter()
                .map(|(n, a)| {
                    format!(
                        "{n}[{i}]={:e} ({:#x})",
                        a.get_f64(i.min(a.n_elems() - 1)),
                        a.get_bits(i.min(a.n_elems() - 1))
                    )
                })
                .collect();
            panic!(
                "{what}: output {name}[{i}]: compiled {:e} ({:#x}), reference {:e} ({:#x}); {}",
                g.get_f64(i),
                g.get_bits(i),
                w.get_f64(i),
                w.get_bits(i),
                x.join(", ")
            );
        }
    }
}

/// Runs `exe` and the reference interpreter on the same inputs: both fail, or all outputs agree
/// bit for bit.
fn assert_same_as_reference(
    seed: u64,
    graph: &Graph,
    inputs: &[(String, Array)],
    exe: &Executable,
) {
    match (
        kfuse_interp::run(graph, inputs, &CustomOps::new()),
        exe.run(inputs, &CustomOps::new()),
    ) {
        (Ok(w), Ok((g, _))) => {
            for ((name, w), (_, g)) in w.iter().zip(&g) {
                assert_eq!(
                    same(g, w),
                    None,
                    "seed {seed}: output {name}\n{}",
                    kfuse_ir::text::print_graph(graph)
                );
            }
        }
        (Err(_), Err(_)) => {}
        (w, g) => panic!(
            "seed {seed}: reference {:?}, compiled {:?}",
            w.err(),
            g.err()
        ),
    }
}

/// Every value of a 16-bit float type, or a sweep of f32 bit patterns and edge values.
fn sweep(dtype: DType) -> Array {
    let specials = [
        0.0f64,
        -0.0,
        1.0,
        -1.0,
        0.5,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        1e-45,
        88.72,
        -103.9,
        2e8,
        3.4e38,
        1e-300,
    ];
    match dtype {
        DType::F16 => Array::from_vec(
            vec![65536],
            (0..=u16::MAX).map(kfuse_ir::f16::from_bits).collect(),
        )
        .unwrap(),
        DType::BF16 => Array::from_vec(
            vec![65536],
            (0..=u16::MAX).map(kfuse_ir::bf16::from_bits).collect(),
        )
        .unwrap(),
        DType::F32 => {
            let mut v: Vec<f32> = specials.iter().map(|&x| x as f32).collect();
            v.extend((0..u32::MAX).step_by(16411).map(f32::from_bits));
            let n = v.len();
            Array::from_vec(vec![n], v).unwrap()
        }
        _ => {
            let mut v: Vec<f64> = specials.to_vec();
            let mut rng = Rng::new(64);
            v.extend((0..60_000).map(|_| f64::from_bits(rng.next_u64())));
            v.extend((0..60_000).map(|k| (k as f64 - 30_000.0) / 997.0));
            let n = v.len();
            Array::from_vec(vec![n], v).unwrap()
        }
    }
}

fn unary_graph(dtype: DType, ops: &[UnaryOp], n: usize) -> Graph {
    let mut g = Graph::new();
    let x = g
        .add(
            Op::Input {
                name: "x".into(),
                ty: TensorType::new(dtype, [n]),
            },
            vec![],
        )
        .unwrap();
    for &u in ops {
        let y = g.add(Op::Unary(u), vec![x]).unwrap();
        g.add_output(u.name(), y).unwrap();
    }
    g
}

const FLOAT_UNARY: &[UnaryOp] = &[
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Sign,
    UnaryOp::Exp,
    UnaryOp::Exp2,
    UnaryOp::Log,
    UnaryOp::Log2,
    UnaryOp::Log1p,
    UnaryOp::Expm1,
    UnaryOp::Sqrt,
    UnaryOp::Rsqrt,
    UnaryOp::Reciprocal,
    UnaryOp::Sin,
    UnaryOp::Cos,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Relu,
    UnaryOp::Gelu,
    UnaryOp::GeluTanh,
    UnaryOp::Erf,
    UnaryOp::Softplus,
    UnaryOp::Floor,
    UnaryOp::Ceil,
    UnaryOp::Round,
];

#[test]
fn every_unary_op_is_bit_exact_in_strict_mode() {
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        let x = sweep(dtype);
        let ops: Vec<UnaryOp> = FLOAT_UNARY
            .iter()
            .copied()
            .filter(|u| dtype != DType::F64 || !matches!(u, UnaryOp::Erf | UnaryOp::Gelu))
            .collect();
        let g = unary_graph(dtype, &ops, x.n_elems());
        check_strict(&g, &[("x".into(), x)], &format!("unary {dtype}"));
    }
}

#[test]
fn f64_erf_falls_back_to_the_tile_interpreter_and_says_why() {
    let g = unary_graph(DType::F64, &[UnaryOp::Erf], 8);
    let exe = build(&g, Numerics::Strict);
    match exe.tiers.iter().flatten().next() {
        Some(Tier::Tile { reason }) => assert!(reason.contains("libm crate's erf"), "{reason}"),
        other => panic!("expected the tile tier, got {:?}", other.map(|t| t.name())),
    }
    let x = Array::from_vec(
        vec![8],
        vec![0.0, -0.0, 0.5, -3.0, 7.0, f64::NAN, f64::INFINITY, 1e-310],
    )
    .unwrap();
    let (got, _) = exe
        .run(&[("x".into(), x.clone())], &CustomOps::new())
        .unwrap();
    let want = kfuse_interp::run(&g, &[("x".into(), x)], &CustomOps::new()).unwrap();
    assert_eq!(same(&got[0].1, &want[0].1), None);
}

/// Every pair from a list of edge values, as two arrays.
fn pairs(dtype: DType) -> (Array, Array) {
    let values: Vec<f64> = match dtype {
        DType::Bool => vec![0.0, 1.0],
        DType::U8 => vec![0.0, 1.0, 2.0, 7.0, 128.0, 255.0],
        DType::I32 | DType::I64 => vec![
            0.0,
            1.0,
            -1.0,
            2.0,
            -7.0,
            7.0,
            2147483647.0,
            -2147483648.0,
            40.0,
        ],
        _ => vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            2.5,
            -7.0,
            3.0,
            1e-40,
            1e30,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            0.1,
        ],
    };
    let n = values.len();
    let a: Vec<f64> = (0..n * n).map(|k| values[k / n]).collect();
    let b: Vec<f64> = (0..n * n).map(|k| values[k % n]).collect();
    let make = |v: Vec<f64>| {
        let f = Array::from_vec(vec![n * n], v).unwrap();
        kfuse_interp::elementwise::cast(&f, dtype)
    };
    let (a, mut b) = (make(a), make(b));
    if dtype == DType::I64 {
        // Exercise the extremes of i64 too.
        if let Storage::I64(v) = b.clone().into_storage() {
            let mut v = v;
            v[0] = i64::MIN;
            v[1] = i64::MAX;
            b = Array::from_vec(vec![v.len()], v).unwrap();
        }
    }
    (a, b)
}

#[test]
fn binary_ops_comparisons_and_casts_are_bit_exact() {
    for dtype in DType::ALL {
        let (a, b) = pairs(dtype);
        let n = a.n_elems();
        let ty = TensorType::new(dtype, [n]);
        let mut g = Graph::new();
        let x = g
            .add(
                Op::Input {
                    name: "a".into(),
                    ty: ty.clone(),
                },
                vec![],
            )
            .unwrap();
        let y = g
            .add(
                Op::Input {
                    name: "b".into(),
                    ty,
                },
                vec![],
            )
            .unwrap();
        let out = |g: &mut Graph, name: String, v: Result<Value, kfuse_ir::IrError>| {
            if let Ok(v) = v {
                g.add_output(name, v).unwrap();
            }
        };
        for &op in kfuse_ir::BinaryOp::ALL {
            let v = g.add(Op::Binary(op), vec![x, y]);
            out(&mut g, op.name().to_string(), v);
        }
        for &op in kfuse_ir::CompareOp::ALL {
            let v = g.add(Op::Compare(op), vec![x, y]);
            out(&mut g, op.name().to_string(), v);
        }
        for to in DType::ALL {
            let v = g.add(Op::Cast { to }, vec![x]);
            out(&mut g, format!("cast_{to}"), v);
        }
        let v = g.add(Op::Clamp, vec![x, y, x]);
        out(&mut g, "clamp".into(), v);
        check_strict(
            &g,
            &[("a".into(), a), ("b".into(), b)],
            &format!("binary {dtype}"),
        );
    }
}

/// Runs `text` (one input `x`) compiled in strict numerics and on the reference, bit for bit.
fn check_strict_text(text: &str, x: Array, what: &str) {
    let g = parse_graph(text).unwrap_or_else(|e| panic!("{what}: {e}\n{text}"));
    check_strict(&g, &[("x".into(), x)], what);
}

#[test]
fn float_to_integer_to_float_casts_give_positive_zero() {
    // A float cast to an integer truncates, so -0.5 becomes the integer 0, and an integer 0 cast
    // back is +0. C compilers may fold the two conversions into a float `trunc`, which keeps
    // the sign: -0.
    let values = [
        -0.5,
        -0.0,
        0.0,
        -0.99,
        0.75,
        -1.5,
        2.5,
        -1e-30,
        -7.0,
        f64::NAN,
    ];
    for (from, int, to) in [
        ("f32", "i32", "f32"),
        ("f32", "i64", "f32"),
        ("f64", "i32", "f64"),
        ("f64", "i64", "f64"),
        ("f32", "i32", "f64"),
        ("f64", "i64", "f32"),
        ("f16", "i32", "f16"),
        ("bf16", "i64", "bf16"),
        ("f32", "u8", "f32"),
    ] {
        let n = 64 * values.len();
        let text = format!(
            "%x = input() name=\"x\" : {from}[{n}]\n%i = cast(%x) to={int}\n\
             %y = cast(%i) to={to}\noutput \"y\" = %y\n"
        );
        let data: Vec<f64> = (0..n).map(|k| values[k % values.len()]).collect();
        let x = Array::from_vec(vec![n], data).unwrap();
        let x = kfuse_interp::elementwise::cast(&x, DType::from_name(from).unwrap());
        check_strict_text(&text, x, &format!("{from} -> {int} -> {to}"));
    }
}

#[test]
fn half_precision_casts_feeding_reductions_round_in_strict_mode() {
    // 1e5 is past f16's largest finite value, so it rounds to inf and the row sums to NaN; a
    // compiler that keeps the f16 value in wider precision (or drops the cast) gives a number.
    let row = [
        1e5f32, -1e5, 1.0001, 0.1, 3.0e-8, 65520.0, -2049.0, 0.33333334,
    ];
    let (rows, n) = (5, 48);
    let data: Vec<f32> = (0..rows * n)
        .map(|k| {
            let (r, j) = (k / n, k % n);
            // Row 0 holds the overflowing pair; later rows rotate the values and drop it, so
            // that their sums are finite and every rounding shows.
            let v = row[(j + r) % row.len()];
            if r > 0 && v.abs() == 1e5 {
                1.0 + j as f32 / 1024.0
            } else {
                v
            }
        })
        .collect();
    for half in ["f16", "bf16"] {
        let text = format!(
            "%x = input() name=\"x\" : f32[{rows}, {n}]\n%h = cast(%x) to={half}\n\
             %s = reduce_sum(%h) axes=[1]\n%w = cast(%h) to=f32\n%t = reduce_sum(%w) axes=[1]\n\
             %m = mul(%h, %h)\n%u = reduce_sum(%m) axes=[1]\n\
             output \"s\" = %s\noutput \"t\" = %t\noutput \"u\" = %u\n"
        );
        let x = Array::from_vec(vec![rows, n], data.clone()).unwrap();
        check_strict_text(&text, x, &format!("f32 -> {half} -> sum"));
    }
}

#[test]
fn half_precision_rounding_is_written_out_in_the_c_source() {
    // GCC 12 targeting AVX512-FP16 drops a C conversion float -> _Float16 -> float inside a
    // loop (the f16 row sums above came out 1.1006, not NaN, on such a CPU), and the machine
    // running this test may lack that extension. So the source itself must round in integer
    // steps: a `(_Float16)` conversion may only make a literal, whose value is exact.
    let text = "%x = input() name=\"x\" : f32[5, 48]\n%i = input() name=\"i\" : i32[5, 48]\n\
                %d = input() name=\"d\" : f64[5, 48]\n%h = cast(%x) to=f16\n\
                %s = reduce_sum(%h) axes=[1]\n%e = exp(%h)\n%c = constant() value=0.5 : f16[]\n\
                %m = mul(%e, %c)\n%j = cast(%i) to=f16\n%k = cast(%d) to=f16\n%a = add(%j, %k)\n\
                %b = cast(%h) to=bf16\n%g = cast(%b) to=f16\n\
                output \"s\" = %s\noutput \"m\" = %m\noutput \"a\" = %a\noutput \"g\" = %g\n";
    let g = parse_graph(text).unwrap();
    let mut narrowings = 0;
    for kernel in fused_kernels(&g) {
        let source = kfuse_cpu::c::render_function(&kernel, "k").unwrap();
        narrowings +=
            source.matches("kf_f32_to_f16(").count() + source.matches("kf_f64_to_f16(").count();
        for (at, _) in source.match_indices("(_Float16)") {
            let rest = &source[at + "(_Float16)".len()..];
            assert!(
                rest.starts_with("kf_f32_from_bits(0x"),
                "a C conversion to _Float16: {}\n{source}",
                &rest[..rest.len().min(60)]
            );
        }
    }
    assert!(narrowings >= 6, "{narrowings} narrowings");
}

#[test]
fn f64_to_half_precision_casts_round_once_in_compiled_code() {
    // Values on, just beside and a hair off the ties between neighbouring f16 and bf16 values,
    // where a conversion through f32 rounds twice and goes the wrong way.
    let mut rng = Rng::new(2050);
    let values = kfuse_testkit::narrowing_values(&mut rng, 20_000);
    let n = values.len();
    let text = format!(
        "%x = input() name=\"x\" : f64[{n}]\n%h = cast(%x) to=f16\n%b = cast(%x) to=bf16\n\
         output \"h\" = %h\noutput \"b\" = %b\n"
    );
    let x = Array::from_vec(vec![n], values).unwrap();
    check_strict_text(&text, x, "f64 -> f16, bf16");
}

#[test]
fn nan_results_are_nans_in_both_engines_and_the_rest_is_bit_exact() {
    // The engines may give a NaN of another sign or payload: the reference's IEEE maximum and
    // log return +NaN (0x7fc00000) where the compiled vector forms give the CPU's default NaN
    // (0xffc00000), and x86 arithmetic passes on whichever NaN operand comes first. Strict
    // numerics exclude exactly that (docs/numerics.md, "What bit-identical excludes"): every
    // NaN must be a NaN in both engines, and every other value, zeros' signs included, the
    // same bits.
    let n = 96;
    let mut text =
        format!("%x = input() name=\"x\" : f32[{n}]\n%y = input() name=\"y\" : f32[{n}]\n");
    for op in ["log", "log2", "relu", "sqrt", "neg", "abs", "sin"] {
        text += &format!("%{op} = {op}(%x)\noutput \"{op}\" = %{op}\n");
    }
    for op in ["add", "sub", "mul", "div", "max", "min", "rem"] {
        text += &format!("%{op} = {op}(%x, %y)\noutput \"{op}\" = %{op}\n");
    }
    text += "%x2 = reshape(%x) shape=[6, 16]\n%s = reduce_sum(%x2) axes=[1]\n\
             %mx = reduce_max(%x2) axes=[1]\noutput \"s\" = %s\noutput \"mx\" = %mx\n";
    let g = parse_graph(&text).unwrap();
    let x_values = [
        -1.0f32,
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
    ];
    let y_values = [
        f32::INFINITY,
        0.0,
        -1.0,
        f32::NAN,
        -0.0,
        -f32::NAN,
        2.0,
        f32::NEG_INFINITY,
    ];
    let xs: Vec<f32> = (0..n).map(|i| x_values[i % x_values.len()]).collect();
    let ys: Vec<f32> = (0..n).map(|i| y_values[i % y_values.len()]).collect();
    let inputs = [
        ("x".to_string(), Array::from_vec(vec![n], xs).unwrap()),
        ("y".to_string(), Array::from_vec(vec![n], ys).unwrap()),
    ];
    check_strict(&g, &inputs, "NaN results");
    // The outputs hold NaNs, zeros of both signs and infinities, so the comparison had each
    // case to decide.
    let want = kfuse_interp::run(&g, &inputs, &CustomOps::new()).unwrap();
    let all: Vec<f64> = want
        .iter()
        .flat_map(|(_, a)| (0..a.n_elems()).map(|i| a.get_f64(i)).collect::<Vec<_>>())
        .collect();
    assert!(all.iter().any(|v| v.is_nan()));
    assert!(all.iter().any(|v| *v == 0.0 && v.is_sign_negative()));
    assert!(all.iter().any(|v| v.is_infinite()));
}

#[test]
fn reductions_are_bit_exact_in_strict_mode() {
    let text = "%x = input() name=\"x\" : f32[37, 1029]\n%s = reduce_sum(%x) axes=[1]\n%p = reduce_prod(%x) axes=[1]\n\
                %mx = reduce_max(%x) axes=[1]\n%mn = reduce_min(%x) axes=[1]\n%me = reduce_mean(%x) axes=[1]\n\
                %am = argmax(%x) axes=[1]\n%an = argmin(%x) axes=[1]\n%c = reduce_sum(%x) axes=[0]\n\
                output \"s\" = %s\noutput \"p\" = %p\noutput \"mx\" = %mx\noutput \"mn\" = %mn\noutput \"me\" = %me\n\
                output \"am\" = %am\noutput \"an\" = %an\noutput \"c\" = %c\n";
    let g = parse_graph(text).unwrap();
    for seed in 0..3 {
        let mut rng = Rng::new(seed);
        let x = random_array(&mut rng, &TensorType::new(DType::F32, [37, 1029]));
        check_strict(&g, &[("x".into(), x)], "reductions");
    }
    for dtype in ["i32", "i64", "u8", "f64", "f16"] {
        let g = parse_graph(
            &text
                .replace("f32", dtype)
                .replace("%me = reduce_mean(%x) axes=[1]\n", "")
                .replace("output \"me\" = %me\n", ""),
        )
        .unwrap();
        let mut rng = Rng::new(9);
        let x = random_array(&mut rng, &g.inputs().next().unwrap().2.clone());
        check_strict(&g, &[("x".into(), x)], &format!("reductions {dtype}"));
    }
}

#[test]
fn max_and_min_rows_are_bit_exact_wherever_the_extreme_lies() {
    // Rows long enough for the compiled max/min's four accumulators (64 terms per step), then a
    // 16-wide step and a tail. Each row's extreme sits at a different position, so it falls to
    // every accumulator and lane: a large value, +-inf, a NaN, and zeros of both signs (max and
    // min must pick +0 and -0 wherever they are).
    for n in [64usize, 100, 1029] {
        let rows = 24;
        let text = format!(
            "%x = input() name=\"x\" : f32[{rows}, {n}]\n%mx = reduce_max(%x) axes=[1]\n\
             %mn = reduce_min(%x) axes=[1]\noutput \"mx\" = %mx\noutput \"mn\" = %mn\n"
        );
        let g = parse_graph(&text).unwrap();
        let mut rng = Rng::new(n as u64);
        let mut values = Vec::with_capacity(rows * n);
        for r in 0..rows {
            let at = (r * 37 + 11) % n;
            for j in 0..n {
                let base = (rng.below(2000) as f32 - 1000.0) / 1024.0;
                let v = match r % 6 {
                    0 => {
                        if j == at {
                            100.0 + r as f32
                        } else {
                            base
                        }
                    }
                    1 => {
                        if j == at {
                            -100.0 - r as f32
                        } else {
                            base
                        }
                    }
                    2 => {
                        if j == at {
                            f32::NAN
                        } else {
                            base
                        }
                    }
                    3 => {
                        if j == at {
                            f32::INFINITY
                        } else if j == (at + 1) % n {
                            f32::NEG_INFINITY
                        } else {
                            base
                        }
                    }
                    4 => {
                        if j == at {
                            0.0
                        } else {
                            -0.0
                        }
                    }
                    _ => {
                        if j == at {
                            -0.0
                        } else {
                            0.0
                        }
                    }
                };
                values.push(v);
            }
        }
        let x = Array::from_vec(vec![rows, n], values).unwrap();
        let inputs = [("x".to_string(), x)];
        check_strict(&g, &inputs, &format!("max/min rows of {n}"));
        // Fast numerics may reorder sums, but max and min have one answer in any order.
        let want = kfuse_interp::run(&g, &inputs, &CustomOps::new()).unwrap();
        let (fast, _) = build(&g, Numerics::Fast)
            .run(&inputs, &CustomOps::new())
            .unwrap();
        for ((name, w), (_, f)) in want.iter().zip(&fast) {
            assert_eq!(same(f, w), None, "fast {name}, rows of {n}");
        }
    }
}

#[test]
fn random_graphs_are_bit_exact_in_strict_mode() {
    let mut compiled_kernels = 0;
    let mut folded = 0;
    for seed in 0..40u64 {
        let mut rng = Rng::new(seed + 5000);
        let mut gen = GraphGen::new(&mut rng);
        gen.allow_custom = false;
        let graph = gen.generate(2, 14);
        let mut data = Rng::new(seed);
        let inputs: Vec<(String, Array)> = graph
            .inputs()
            .map(|(_, n, t)| (n.to_string(), random_array(&mut data, t)))
            .collect();
        let exe = build(&graph, Numerics::Strict);
        compiled_kernels += exe
            .tiers
            .iter()
            .flatten()
            .filter(|t| matches!(t, Tier::Compiled { .. }))
            .count();
        assert_same_as_reference(seed, &graph, &inputs, &exe);
        // The strict graph passes (constant folding, dead code) keep every bit too.
        let optimized = build_optimized(&graph, Numerics::Strict);
        folded += optimized.passes.len();
        assert_same_as_reference(seed, &graph, &inputs, &optimized);
    }
    assert!(folded > 0, "the strict passes never changed a random graph");
    assert!(
        compiled_kernels > 40,
        "only {compiled_kernels} kernels compiled"
    );
}

#[test]
fn a_second_compile_hits_the_cache() {
    let g = parse_graph(
        "%x = input() name=\"x\" : f32[1000]\n%y = tanh(%x)\n%z = mul(%y, %x)\noutput \"z\" = %z\n",
    )
    .unwrap();
    let _ = build(&g, Numerics::Fast);
    let again = build(&g, Numerics::Fast);
    assert!(matches!(
        again.tiers.iter().flatten().next(),
        Some(Tier::Compiled { cached: true, .. })
    ));
}

/// Compiles `text` with its leading size `{N}` set to `n`, into `dir`; checks every kernel
/// compiled and every output is bit-identical to the reference. Returns how many kernels hit the
/// cache.
fn cache_hits_at_size(text: &str, n: usize, dir: &std::path::Path) -> (usize, usize) {
    let g = parse_graph(&text.replace("{N}", &n.to_string())).unwrap();
    let exe = build_in(&g, Numerics::Strict, dir);
    let mut data = Rng::new(n as u64);
    let inputs: Vec<(String, Array)> = g
        .inputs()
        .map(|(_, name, t)| (name.to_string(), random_array(&mut data, t)))
        .collect();
    assert_same_as_reference(n as u64, &g, &inputs, &exe);
    let kernels: Vec<&Tier> = exe.tiers.iter().flatten().collect();
    let hits = kernels
        .iter()
        .filter(|t| match t {
            Tier::Compiled { cached, .. } => *cached,
            Tier::Tile { reason } => panic!("fell back to the tile interpreter: {reason}"),
        })
        .count();
    (hits, kernels.len())
}

#[test]
fn a_new_batch_size_reuses_the_compiled_kernels() {
    // The parallel loop ranges are run-time arguments, so the same program at another leading
    // size renders to the same C and hits the cache; results stay bit-exact.
    let programs = [
        // softmax rows
        "%x = input() name=\"x\" : f32[{N}, 300]\n%m = reduce_max(%x) axes=[1] keepdims=true\n\
         %d = sub(%x, %m)\n%e = exp(%d)\n%s = reduce_sum(%e) axes=[1] keepdims=true\n\
         %y = div(%e, %s)\noutput \"y\" = %y\n",
        // bias + GELU on rows (row-split pointwise kernel)
        "%x = input() name=\"x\" : f32[{N}, 96]\n%b = input() name=\"b\" : f32[96]\n\
         %y = add(%x, %b)\n%z = gelu_tanh(%y)\noutput \"z\" = %z\n",
        // flat pointwise chain with two outputs
        "%x = input() name=\"x\" : f32[{N}]\n%y = input() name=\"y\" : f32[{N}]\n\
         %t = mul(%x, %y)\n%a = add(%t, %x)\n%b = sub(%t, %y)\noutput \"a\" = %a\noutput \"b\" = %b\n",
    ];
    for (p, text) in programs.iter().enumerate() {
        let dir = cache_dir().join(format!("batch-{p}"));
        let _ = std::fs::remove_dir_all(&dir);
        let (hits, n) = cache_hits_at_size(text, 37, &dir);
        assert_eq!(hits, 0, "program {p}: a fresh cache has nothing to hit");
        assert!(n > 0);
        for size in [1, 5, 4099] {
            let (hits, n) = cache_hits_at_size(text, size, &dir);
            assert_eq!(
                hits, n,
                "program {p} at size {size}: {hits} of {n} kernels cached"
            );
        }
    }
    // A size the index arithmetic uses (flipping the leading axis) is part of the source, so
    // it compiles anew, and stays correct.
    let flip = "%x = input() name=\"x\" : f32[{N}, 8]\n%y = flip(%x) axes=[0]\n%z = neg(%y)\n\
                output \"z\" = %z\n";
    let dir = cache_dir().join("batch-flip");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(cache_hits_at_size(flip, 37, &dir).0, 0);
    assert_eq!(cache_hits_at_size(flip, 38, &dir).0, 0);
}

#[test]
fn large_outputs_stream_and_stay_bit_exact() {
    // Kernels writing at least STREAM_MIN_BYTES stream their stores. Final passes with vector
    // bodies store non-temporally straight from registers after a scalar head that aligns the
    // first output: a row kernel whose odd rows start at every alignment, a flat kernel of odd
    // length, transcendental ones. Scalar passes stage their contiguous stores and stream
    // them: several outputs of different widths (f32, f64, u8), partial staging blocks.
    let programs = [
        ("kf_vstore_nt(a", "%x = input() name=\"x\" : f32[1051, 4001]\n%m = reduce_max(%x) axes=[1] keepdims=true\n\
         %d = sub(%x, %m)\n%s = reduce_sum(%d) axes=[1] keepdims=true\n\
         %y = mul(%d, %s)\noutput \"y\" = %y\n"),
        ("kf_stream(a", "%x = input() name=\"x\" : f32[2100003]\n%y = input() name=\"y\" : f32[2100003]\n\
         %t = mul(%x, %y)\n%a = add(%t, %x)\n%b = cast(%t) to=f64\n%c = gt(%t, %y)\n\
         %u = cast(%c) to=u8\noutput \"a\" = %a\noutput \"b\" = %b\noutput \"u\" = %u\n"),
        ("kf_vstore_nt(a", "%x = input() name=\"x\" : f32[4200007]\n%t = tanh(%x)\noutput \"t\" = %t\n"),
        ("kf_vstore_nt(a", "%x = input() name=\"x\" : f32[1051, 4001]\n%e = exp(%x)\n%y = input() name=\"y\" : f32[4001]\n\
         %s = add(%e, %y)\n%l = log(%s)\noutput \"l\" = %l\n"),
    ];
    for (how, text) in programs {
        let g = parse_graph(text).unwrap();
        let exe = build(&g, Numerics::Strict);
        let streamed = exe.program.steps.iter().any(|step| match step {
            kfuse_kernel::Step::Kernel { kernel, .. } => kfuse_cpu::c::render(kernel)
                .map(|c| c.contains(how) && c.contains("kf_stream_fence();\n}"))
                .unwrap_or(false),
            _ => false,
        });
        assert!(streamed, "no kernel streams its stores:\n{text}");
        let mut data = Rng::new(5);
        let inputs: Vec<(String, Array)> = g
            .inputs()
            .map(|(_, n, t)| (n.to_string(), random_array(&mut data, t)))
            .collect();
        check_strict(&g, &inputs, text);
    }
}

#[test]
fn fast_mode_stays_within_its_error_bound() {
    // Elementwise chains: fast mode may contract into FMAs; results stay within 4 ULP of strict
    // for normal results. Sums may be reassociated: within n * eps * sum |x| of strict.
    let text = "%x = input() name=\"x\" : f32[64, 512]\n%a = exp(%x)\n%b = mul(%a, %x)\n%c = add(%b, %x)\n%t = tanh(%c)\n\
                %s = reduce_sum(%t) axes=[1]\noutput \"t\" = %t\noutput \"s\" = %s\n";
    let g = parse_graph(text).unwrap();
    let mut rng = Rng::new(77);
    let data: Vec<f32> = (0..64 * 512)
        .map(|_| ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0)
        .collect();
    let x = Array::from_vec(vec![64, 512], data.clone()).unwrap();
    let inputs = [("x".to_string(), x)];
    let (strict, _) = build(&g, Numerics::Strict)
        .run(&inputs, &CustomOps::new())
        .unwrap();
    let (fast, _) = build(&g, Numerics::Fast)
        .run(&inputs, &CustomOps::new())
        .unwrap();
    let (st, ft) = (
        strict[0].1.as_slice::<f32>().unwrap(),
        fast[0].1.as_slice::<f32>().unwrap(),
    );
    for (i, (&s, &f)) in st.iter().zip(ft).enumerate() {
        let ulp = (s.abs().max(f32::MIN_POSITIVE) * f32::EPSILON) as f64;
        assert!(
            ((s - f).abs() as f64) <= 4.0 * ulp,
            "t[{i}]: strict {s}, fast {f}"
        );
    }
    let (ss, fs) = (
        strict[1].1.as_slice::<f32>().unwrap(),
        fast[1].1.as_slice::<f32>().unwrap(),
    );
    for r in 0..64 {
        let abs_sum: f64 = st[r * 512..(r + 1) * 512]
            .iter()
            .map(|v| v.abs() as f64)
            .sum();
        let bound = 512.0 * f32::EPSILON as f64 * abs_sum;
        assert!(
            ((ss[r] - fs[r]).abs() as f64) <= bound,
            "row {r}: strict {}, fast {}",
            ss[r],
            fs[r]
        );
    }
}

/// Values around `center` in `dtype`: the neighbouring patterns on either side, and a spread
/// of `center * (1 + k / 256)` for |k| <= 64.
fn values_around(center: f64, dtype: DType) -> Array {
    let mut values = Vec::new();
    for k in -64i32..=64 {
        values.push(center * (1.0 + k as f64 / 256.0));
    }
    let near = match dtype {
        DType::F64 => (-2000i64..=2000)
            .map(|k| f64::from_bits((center.to_bits() as i64 + k) as u64))
            .collect::<Vec<_>>(),
        DType::F32 => (-2000i64..=2000)
            .map(|k| f32::from_bits(((center as f32).to_bits() as i64 + k) as u32) as f64)
            .collect(),
        // The 16-bit formats step through f32 patterns 2^16 apart.
        _ => (-64i64..=64)
            .map(|k| f32::from_bits(((center as f32).to_bits() as i64 + (k << 16)) as u32) as f64)
            .collect(),
    };
    values.extend(near);
    let x = Array::from_vec(vec![values.len()], values).unwrap();
    kfuse_interp::elementwise::cast(&x, dtype)
}

/// Units in the last place of `dtype` at `v`; subnormals count the smallest unit.
fn ulp_of(v: f64, dtype: DType) -> f64 {
    let (min_normal, eps) = match dtype {
        DType::F64 => (f64::MIN_POSITIVE, f64::EPSILON),
        DType::F32 => (f32::MIN_POSITIVE as f64, f32::EPSILON as f64),
        DType::F16 => (6.103515625e-5, 2f64.powi(-10)),
        _ => (f32::MIN_POSITIVE as f64, 2f64.powi(-7)),
    };
    v.abs().max(min_normal) * eps
}

/// How far, in units of the last place, fast numerics may take `op` at `x` from strict
/// (docs/numerics.md): 4 units, and for GELU's tanh form in f64 below zero `4 + 4 |u2|`, as its
/// tail `x e^u2` turns the absolute error of `u2` into a relative one.
fn fast_bound_units(op: UnaryOp, dtype: DType, x: f64) -> f64 {
    if op == UnaryOp::GeluTanh && dtype == DType::F64 && x < 0.0 {
        let u2 = 1.5957691216057308 * (x + 0.044715 * x * x * x);
        4.0 + 4.0 * u2.abs()
    } else {
        4.0
    }
}

/// Runs `ops` on `x` compiled in fast numerics and checks every result against the reference
/// within [`fast_bound_units`]; non-finite reference results must be matched exactly (NaN by
/// NaN). The values run twice: all at once, where the kernel runs 16-lane bodies if it has
/// them, and in runs of 15, where it runs the scalar loop, which the compiler rewrites on its
/// own terms. Returns one line per op and way that left the bound.
fn fast_unary_failures(dtype: DType, ops: &[UnaryOp], x: &Array, what: &str) -> Vec<String> {
    let n = x.n_elems();
    let g = unary_graph(dtype, ops, n);
    let inputs = [("x".to_string(), x.clone())];
    let want = kfuse_interp::run(&g, &inputs, &CustomOps::new()).unwrap();
    let (at_once, _) = build(&g, Numerics::Fast)
        .run(&inputs, &CustomOps::new())
        .unwrap();
    let at_once: Vec<Vec<f64>> = at_once
        .iter()
        .map(|(_, a)| (0..n).map(|i| a.get_f64(i)).collect())
        .collect();
    let short = build(&unary_graph(dtype, ops, 15), Numerics::Fast);
    let values: Vec<f64> = (0..n).map(|i| x.get_f64(i)).collect();
    let mut in_runs = vec![Vec::with_capacity(n); ops.len()];
    for run in values.chunks(15) {
        let mut part = run.to_vec();
        part.resize(15, run[0]);
        let part = Array::from_vec(vec![15], part).unwrap();
        let part = kfuse_interp::elementwise::cast(&part, dtype);
        let (out, _) = short
            .run(&[("x".to_string(), part)], &CustomOps::new())
            .unwrap();
        for (column, (_, o)) in in_runs.iter_mut().zip(&out) {
            column.extend((0..run.len()).map(|i| o.get_f64(i)));
        }
    }
    let mut failures = Vec::new();
    for (layout, results) in [("at once", at_once), ("in runs of 15", in_runs)] {
        for ((&op, fast), (_, want)) in ops.iter().zip(&results).zip(&want) {
            let (mut outside, mut worst) = (0, (0.0f64, 0.0f64, 0.0f64, 0.0f64));
            for (i, &fv) in fast.iter().enumerate() {
                let (xi, wv) = (values[i], want.get_f64(i));
                let off = (wv - fv).abs() / ulp_of(wv, dtype);
                let within = if wv.is_finite() {
                    fv.is_finite() && off <= fast_bound_units(op, dtype, xi)
                } else {
                    wv.is_nan() && fv.is_nan() || wv == fv
                };
                if !within {
                    outside += 1;
                    if off.is_nan() || off > worst.0 {
                        worst = (off, xi, fv, wv);
                    }
                }
            }
            if outside > 0 {
                let (off, xi, fv, wv) = worst;
                failures.push(format!(
                    "{} {dtype} {what} {layout}: {outside} of {n} outside, the worst {off:.1} \
                     ULP at {xi:e} (fast {fv:e}, strict {wv:e})",
                    op.name(),
                ));
            }
        }
    }
    failures
}

#[test]
fn fast_unary_ops_stay_within_the_documented_bound() {
    let mut failures = Vec::new();
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        let ops: Vec<UnaryOp> = FLOAT_UNARY
            .iter()
            .copied()
            .filter(|u| dtype != DType::F64 || !matches!(u, UnaryOp::Erf | UnaryOp::Gelu))
            .collect();
        failures.extend(fast_unary_failures(
            dtype,
            &ops,
            &sweep(dtype),
            "over the sweep",
        ));
    }
    assert!(failures.is_empty(), "outside the bound: {failures:#?}");
}

#[test]
fn fast_transcendentals_stay_within_the_bound_where_reassociation_bites() {
    // Each point once left the bound in fast mode: log1p(x) for small x, whose correction
    // (1 + x) - 1 was cancelled into x; softplus, through log1p(e^x); exp, expm1 and exp2 near
    // overflow, whose two-step scaling by 2^k became one by 2^128, and far from zero, whose
    // Cody-Waite reduction was reordered; sine and cosine of large arguments, the same; and the
    // far negative tail of GELU's tanh form in f64, e^u2 with |u2| in the hundreds.
    let cases: &[(UnaryOp, DType, f64)] = &[
        (UnaryOp::Log1p, DType::F32, 1e-7),
        (UnaryOp::Log1p, DType::F32, -3e-6),
        (UnaryOp::Log1p, DType::F32, 0.3),
        (UnaryOp::Log1p, DType::F32, -0.3),
        (UnaryOp::Log1p, DType::BF16, 2e-5),
        (UnaryOp::Softplus, DType::F32, -16.5),
        (UnaryOp::Softplus, DType::F32, -9.0),
        (UnaryOp::Softplus, DType::BF16, -16.5),
        (UnaryOp::Softplus, DType::F16, -9.0),
        (UnaryOp::Exp, DType::F32, 88.5),
        (UnaryOp::Exp, DType::F32, 88.7),
        (UnaryOp::Exp, DType::F32, -87.5),
        (UnaryOp::Expm1, DType::F32, 88.5),
        (UnaryOp::Expm1, DType::F32, 88.7),
        (UnaryOp::Exp2, DType::BF16, 127.5),
        (UnaryOp::Exp2, DType::F32, 127.9),
        (UnaryOp::Exp2, DType::F32, -126.5),
        (UnaryOp::Sigmoid, DType::F32, -88.5),
        (UnaryOp::Tanh, DType::F32, 44.0),
        (UnaryOp::Sin, DType::F32, 3.5854532e7),
        (UnaryOp::Cos, DType::F32, 1.79740096e8),
        (UnaryOp::GeluTanh, DType::F64, -20.63),
        (UnaryOp::GeluTanh, DType::F64, -5.0),
        (UnaryOp::GeluTanh, DType::F32, -9.5),
    ];
    let mut failures = Vec::new();
    for &(op, dtype, center) in cases {
        let x = values_around(center, dtype);
        failures.extend(fast_unary_failures(
            dtype,
            &[op],
            &x,
            &format!("around {center:e}"),
        ));
    }
    assert!(failures.is_empty(), "outside the bound: {failures:#?}");
}

#[test]
fn c_header_constants_match_the_rust_definitions() {
    // The erf tables exist twice (Rust and C); a digit typed wrong in either breaks strict mode
    // only for some inputs, so compare the tables directly.
    let header = kfuse_cpu::c::MATH_HEADER;
    let rust = include_str!("../../kfuse-math/src/erf.rs");
    let numbers = |text: &str, start: &str, end: &str| -> Vec<f64> {
        let body = &text[text.find(start).unwrap_or_else(|| panic!("{start}"))..];
        let body = &body[body.find('=').unwrap() + 1..];
        let body = &body[..body.find(end).unwrap()];
        let body = body.replace('_', "");
        body.split(|c: char| c == ',' || c.is_whitespace() || c == '{' || c == '[')
            .filter_map(|t| t.trim().parse::<f64>().ok())
            .collect()
    };
    for (c_name, rust_name) in [
        ("KF_ERF_SMALL[10] =", "const ERF_SMALL"),
        ("KF_ERFC_TAIL[17] =", "const ERFC_TAIL"),
        ("KF_EXP_TAYLOR[12] =", "const ERF_EXP_TAYLOR"),
    ] {
        let from_c = numbers(header, c_name, "};");
        let from_rust: Vec<f64> = numbers(rust, rust_name, "];");
        assert_eq!(from_c, from_rust, "{c_name} differs from {rust_name}");
    }
}

/// Compiles the kernels of `graphs` into shared translation units of 50 graphs each, so that
/// compiler start-up does not dominate, and makes them the executables' tiers. Returns how many
/// kernels compiled.
fn compile_in_batches(graphs: &mut [(u64, Graph, Executable)], numerics: Numerics) -> usize {
    let compiler = kfuse_cpu::Compiler::detect(cache_dir()).expect("a C compiler");
    let mut compiled = 0;
    for batch in graphs.chunks_mut(50) {
        let mut source = String::from(kfuse_cpu::c::MATH_HEADER);
        let mut names = Vec::new();
        for (g, (_, _, exe)) in batch.iter().enumerate() {
            for (s, step) in exe.program.steps.iter().enumerate() {
                if let kfuse_kernel::Step::Kernel { kernel, .. } = step {
                    let name = format!("k_{g}_{s}");
                    if let Ok(f) = kfuse_cpu::c::render_function(kernel, &name) {
                        source.push_str(&f);
                        names.push((g, s, name));
                    }
                }
            }
        }
        let (library, path, _) = compiler.compile_library(&source, numerics).unwrap();
        for (g, s, name) in names {
            let kernel =
                kfuse_cpu::CompiledKernel::from_library(library.clone(), &path, &name).unwrap();
            batch[g].2.tiers[s] = Some(Tier::Compiled {
                kernel,
                cached: false,
            });
            batch[g].2.numerics = numerics;
            compiled += 1;
        }
    }
    compiled
}

/// `count` random graphs (from `seed0`) of `GraphGen`, as adjusted by `setup`, lowered for
/// the tile tier; `compile_in_batches` then compiles them.
fn random_executables(
    seed0: u64,
    count: u64,
    setup: impl Fn(&mut GraphGen),
) -> Vec<(u64, Graph, Executable)> {
    (0..count)
        .map(|seed| {
            let mut rng = Rng::new(seed + seed0);
            let mut gen = GraphGen::new(&mut rng);
            gen.allow_custom = false;
            setup(&mut gen);
            let graph = gen.generate(2, 12);
            let options = Options {
                numerics: Numerics::Strict,
                backend: Backend::Tile,
                graph_passes: false,
                keep_layouts: false,
                ..Options::default()
            };
            let exe = compile_with(&graph, &options, &FixedCostModel::default()).unwrap();
            (seed, graph, exe)
        })
        .collect()
}

#[test]
fn a_thousand_random_graphs_compiled_in_batches_are_bit_exact() {
    let mut graphs = random_executables(90_000, 1000, |_| {});
    let compiled = compile_in_batches(&mut graphs, Numerics::Strict);
    assert!(compiled > 1000, "only {compiled} kernels compiled");
    for (seed, graph, exe) in &graphs {
        let mut data = Rng::new(*seed);
        let inputs: Vec<(String, Array)> = graph
            .inputs()
            .map(|(_, n, t)| (n.to_string(), random_array(&mut data, t)))
            .collect();
        assert_same_as_reference(*seed, graph, &inputs, exe);
    }
}

/// The largest magnitude of any value `graph` computes on `inputs`, and the most terms any of
/// its reductions or matmuls combines into one result.
fn magnitudes(graph: &Graph, inputs: &[(String, Array)]) -> (f64, usize) {
    let mut all = graph.clone();
    let mut terms = 1;
    for id in graph.node_ids() {
        let node = graph.node(id);
        for r in 0..node.types.len() as u32 {
            let _ = all.add_output(
                format!("v{}_{r}", id.0),
                Value {
                    node: id,
                    result: r,
                },
            );
        }
        match &node.op {
            Op::Reduce { axes, .. } => {
                let dims = graph.ty(node.operands[0]).shape.dims().to_vec();
                terms = terms.max(axes.iter().map(|&a| dims[a]).product::<usize>());
            }
            Op::MatMul => {
                let dims = graph.ty(node.operands[0]).shape.dims().to_vec();
                terms = terms.max(dims.last().copied().unwrap_or(1));
            }
            _ => {}
        }
    }
    let values = kfuse_interp::run(&all, inputs, &CustomOps::new()).unwrap();
    let scale = values
        .iter()
        .flat_map(|(_, a)| (0..a.n_elems()).map(move |i| a.get_f64(i).abs()))
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    (scale, terms)
}

#[test]
fn a_thousand_random_graphs_in_fast_mode_stay_near_the_reference() {
    // Fast mode reorders and contracts roundings, so it is checked by a tolerance, on graphs
    // whose ops keep a last-bit difference small (`GraphGen::fast_safe`). Each of the graph's
    // n ops adds a few roundings of at most eps * scale (scale: the largest intermediate
    // magnitude); a product multiplies an operand's error by at most scale; a combination of
    // k terms (sum, matmul) adds k of them. Bugs (a wrong element, op or bound) are errors of
    // the order of the values themselves, which graphs with scale <= 64 keep far above it.
    let mut graphs = random_executables(190_000, 1000, |g| g.fast_safe = true);
    let compiled = compile_in_batches(&mut graphs, Numerics::Fast);
    assert!(compiled > 1000, "only {compiled} kernels compiled");
    let (mut checked, mut elements) = (0, 0);
    for (seed, graph, exe) in &graphs {
        let mut data = Rng::new(*seed);
        let inputs: Vec<(String, Array)> = graph
            .inputs()
            .map(|(_, n, t)| {
                (
                    n.to_string(),
                    kfuse_testkit::bounded_array(&mut data, &t.shape),
                )
            })
            .collect();
        let (scale, terms) = magnitudes(graph, &inputs);
        let want = kfuse_interp::run(graph, &inputs, &CustomOps::new()).unwrap();
        let (got, _) = exe.run(&inputs, &CustomOps::new()).unwrap();
        let n = graph.nodes().len() as f64;
        let tol = 8.0 * f32::EPSILON as f64 * n * terms as f64 * scale.max(1.0).powi(2);
        for ((name, w), (_, g)) in want.iter().zip(&got) {
            for i in 0..w.n_elems() {
                let (a, b) = (w.get_f64(i), g.get_f64(i));
                assert!(
                    a.is_nan() == b.is_nan() && (a.is_nan() || a == b || (a - b).abs() <= tol),
                    "seed {seed}: output {name}[{i}]: fast {b:e}, reference {a:e}, tolerance {tol:e}\n{}",
                    kfuse_ir::text::print_graph(graph)
                );
            }
            elements += w.n_elems();
        }
        if scale <= 64.0 {
            checked += 1;
        }
    }
    assert!(
        checked >= 800 && elements > 10_000,
        "only {checked} graphs with scale <= 64, {elements} elements"
    );
}

#[test]
fn fast_matmul_runs_on_gemm_within_its_bound() {
    for dtype in ["f32", "f64"] {
        let text = format!(
            "%a = input() name=\"a\" : {dtype}[3, 1, 37, 129]\n%b = input() name=\"b\" : {dtype}[2, 129, 65]\n%c = matmul(%a, %b)\n\
             %r = relu(%c)\noutput \"c\" = %c\noutput \"r\" = %r\n"
        );
        let g = parse_graph(&text).unwrap();
        let mut rng = Rng::new(12);
        let inputs: Vec<(String, Array)> = g
            .inputs()
            .map(|(_, n, t)| {
                let v: Vec<f64> = (0..t.shape.n_elems())
                    .map(|_| (rng.below(2001) as f64 - 1000.0) / 250.0)
                    .collect();
                let a = Array::from_vec(t.shape.dims().to_vec(), v).unwrap();
                (n.to_string(), kfuse_interp::elementwise::cast(&a, t.dtype))
            })
            .collect();
        let want = kfuse_interp::run(&g, &inputs, &CustomOps::new()).unwrap();
        let (fast, _) = build(&g, Numerics::Fast)
            .run(&inputs, &CustomOps::new())
            .unwrap();
        let eps = if dtype == "f32" {
            f32::EPSILON as f64
        } else {
            f64::EPSILON
        };
        // |a| |b| summed over k bounds the error of any summation order: K eps sum |a_ik b_kj|.
        let (a, b) = (&inputs[0].1, &inputs[1].1);
        for i in 0..want[0].1.n_elems() {
            let (batch, row, col) = (i / (37 * 65), (i / 65) % 37, i % 65);
            let abs: f64 = (0..129)
                .map(|k| {
                    (a.get_f64(((batch / 2) * 37 + row) * 129 + k)
                        * b.get_f64(((batch % 2) * 129 + k) * 65 + col))
                    .abs()
                })
                .sum();
            let err = (fast[0].1.get_f64(i) - want[0].1.get_f64(i)).abs();
            assert!(
                err <= 129.0 * eps * abs,
                "{dtype} c[{i}]: {err} > {}",
                129.0 * eps * abs
            );
        }
        let (strict, _) = build(&g, Numerics::Strict)
            .run(&inputs, &CustomOps::new())
            .unwrap();
        assert_eq!(
            same(&strict[0].1, &want[0].1),
            None,
            "{dtype}: strict matmul stays the reference"
        );
    }
}

/// f32 values with edge cases mixed in: ±0, subnormals, tiny values, the thresholds of exp and
/// tanh, and with `nonfinite` NaN, ±inf and huge values too; the others are ordinary values
/// around 1. (Rows with a NaN or an infinity reduce to NaN whatever the order of their terms,
/// so reductions are checked on finite rows.)
fn edgy_f32(n: usize, seed: u64, nonfinite: bool) -> Vec<f32> {
    let huge = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, -3e38];
    let edges = [
        0.0,
        -0.0,
        f32::from_bits(1),
        -1e-40,
        1e-30,
        88.9,
        -104.0,
        9.5,
        0.6,
        -2.4e-4,
        1.0,
    ];
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| {
            if nonfinite && rng.chance(0.05) {
                huge[rng.below(huge.len())]
            } else if rng.chance(0.15) {
                edges[rng.below(edges.len())]
            } else {
                (rng.below(20_001) as f32 - 10_000.0) / 1_000.0
            }
        })
        .collect()
}

/// Vector bodies (16-lane blocks, two, four or eight per iteration as the chain is longer,
/// single blocks, a scalar remainder) against the reference interpreter, bit for bit, at widths
/// around every block boundary: elementwise chains with every op that has a 16-lane form, masks, selects and
/// casts, an operand broadcast along the inner axis and one along the outer; row softmax and
/// layer norm (reduction passes with vector bodies, next-row prefetches), and a sum of
/// softplus (a long-chain reduction pass).
#[test]
fn vector_bodies_are_bit_exact_at_every_width() {
    let elementwise = |rows: usize, n: usize| {
        format!(
            "%x = input() name=\"x\" : f32[{rows}, {n}]
%y = input() name=\"y\" : f32[{rows}, {n}]
%w = input() name=\"w\" : f32[{n}]
%r = input() name=\"r\" : f32[{rows}, 1]
%e = exp(%x)
%l = log(%y)
%t = tanh(%x)
%s = sigmoid(%y)
%sp = softplus(%x)
%l2 = log2(%x)
%e2 = exp2(%y)
%lp = log1p(%y)
%q = sqrt(%x)
%a = abs(%y)
%f = floor(%x)
%c = ceil(%y)
%rd = round(%x)
%re = relu(%y)
%ng = neg(%x)
%rc = reciprocal(%y)
%sn = sin(%x)
%cs = cos(%y)
%m1 = max(%x, %w)
%m2 = min(%y, %r)
%d = div(%x, %y)
%p = pow(%x, %y)
%lt = lt(%x, %y)
%ge = ge(%w, %r)
%both = and(%lt, %ge)
%sel = select(%both, %e, %l)
%cf = cast(%lt) to=f32
%cb = cast(%x) to=bool
%nb = not(%cb)
%sel2 = select(%nb, %t, %cf)
%u1 = add(%e, %l)
%u2 = mul(%u1, %t)
%u3 = sub(%u2, %s)
%u4 = add(%u3, %sp)
%u5 = mul(%l2, %e2)
%u6 = add(%lp, %q)
%u7 = sub(%a, %f)
%u8 = add(%c, %rd)
%u9 = mul(%re, %ng)
%v0 = add(%rc, %sn)
%v1 = add(%v0, %cs)
%v2 = add(%m1, %m2)
%v3 = mul(%d, %p)
%v4 = add(%sel, %sel2)
output \"u4\" = %u4
output \"u5\" = %u5
output \"u6\" = %u6
output \"u7\" = %u7
output \"u8\" = %u8
output \"u9\" = %u9
output \"v1\" = %v1
output \"v2\" = %v2
output \"v3\" = %v3
output \"v4\" = %v4
"
        )
    };
    let rows_program = |rows: usize, n: usize| {
        format!(
            "%x = input() name=\"x\" : f32[{rows}, {n}]
%y = input() name=\"y\" : f32[{rows}, {n}]
%w = input() name=\"w\" : f32[{n}]
%r = input() name=\"r\" : f32[{rows}, 1]
%m = reduce_max(%x) axes=[1] keepdims=true
%d = sub(%x, %m)
%e = exp(%d)
%s = reduce_sum(%e) axes=[1] keepdims=true
%sm = div(%e, %s)
%mu = reduce_mean(%y) axes=[1] keepdims=true
%dy = sub(%y, %mu)
%d2 = mul(%dy, %dy)
%var = reduce_mean(%d2) axes=[1] keepdims=true
%rs = rsqrt(%var)
%ln = mul(%dy, %rs)
%lnw = mul(%ln, %w)
%mn = reduce_min(%y) axes=[1] keepdims=true
%sh = sub(%y, %mn)
%z = add(%sh, %r)
%spx = softplus(%x)
%ssp = reduce_sum(%spx) axes=[1] keepdims=true
%lse = add(%z, %ssp)
output \"softmax\" = %sm
output \"layernorm\" = %lnw
output \"shifted\" = %lse
"
        )
    };
    let mut seed = 1;
    for n in [
        1, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65, 100, 127, 128, 129, 255, 256, 257, 1000,
    ] {
        for rows in [1, 3] {
            for (what, text, nonfinite) in [
                ("elementwise", elementwise(rows, n), true),
                ("rows", rows_program(rows, n), false),
            ] {
                let graph = parse_graph(&text).unwrap();
                let inputs: Vec<(String, Array)> = graph
                    .inputs()
                    .map(|(_, name, ty)| {
                        seed += 1;
                        let v = edgy_f32(ty.shape.n_elems(), seed, nonfinite);
                        (
                            name.to_string(),
                            Array::from_vec(ty.shape.dims().to_vec(), v).unwrap(),
                        )
                    })
                    .collect();
                check_strict(&graph, &inputs, &format!("{what} {rows}x{n}"));
            }
        }
    }
}

/// The fused kernels `graph` lowers to under the cost policy.
fn fused_kernels(graph: &Graph) -> Vec<kfuse_kernel::Kernel> {
    let partition = kfuse_fusion::partition(graph, FusePolicy::Cost, &FixedCostModel::default());
    kfuse_kernel::lower(graph, &partition)
        .unwrap()
        .steps
        .into_iter()
        .filter_map(|step| match step {
            kfuse_kernel::Step::Kernel { kernel, .. } => Some(kernel),
            _ => None,
        })
        .collect()
}

/// Inputs for every input of `graph` (f32 or f64) from [`edgy_f32`]'s values, edge values
/// included.
fn edgy_inputs(graph: &Graph, seed: u64) -> Vec<(String, Array)> {
    graph
        .inputs()
        .map(|(_, name, ty)| {
            let values = edgy_f32(ty.shape.n_elems(), seed, true);
            let dims = ty.shape.dims().to_vec();
            let array = if ty.dtype == DType::F64 {
                Array::from_vec(dims, values.iter().map(|&v| f64::from(v)).collect()).unwrap()
            } else {
                Array::from_vec(dims, values).unwrap()
            };
            (name.to_string(), array)
        })
        .collect()
}

/// Kernels that read an operand across the inner index with a stride of a line or more (a
/// transpose, a permute) run in tiles of outer by inner iterations (`c.rs`, `tiles`): bit-exact
/// at sizes that leave partial tiles on both axes, with 1 KiB-aliased strides (the small inner
/// tile), for f64, and for a 3-D permute, with edge values.
#[test]
fn transposed_reads_run_in_tiles_and_stay_bit_exact() {
    let transpose = |dtype: &str, rows: usize, cols: usize| {
        format!(
            "%x = input() name=\"x\" : {dtype}[{cols}, {rows}]
%y = input() name=\"y\" : {dtype}[{rows}, {cols}]
%b = input() name=\"b\" : {dtype}[{cols}]
%t = permute(%x) perm=[1, 0]
%e = exp(%t)
%s = mul(%e, %y)
%z = add(%s, %b)
%w = sub(%t, %y)
output \"z\" = %z
output \"w\" = %w
"
        )
    };
    let permute3 = "%x = input() name=\"x\" : f32[5, 67, 19]
%y = input() name=\"y\" : f32[19, 5, 67]
%t = permute(%x) perm=[2, 0, 1]
%z = mul(%t, %y)
output \"z\" = %z
";
    let mut programs = vec![permute3.to_string()];
    for (rows, cols) in [(1, 64), (17, 64), (33, 100), (40, 256), (64, 64), (3, 1000)] {
        programs.push(transpose("f32", rows, cols));
    }
    programs.push(transpose("f64", 21, 70));
    let mut tiled = 0;
    for (k, text) in programs.iter().enumerate() {
        let graph = parse_graph(text).unwrap();
        // The compiled kernel's C says whether it tiles.
        tiled += fused_kernels(&graph)
            .iter()
            .filter(|kernel| kfuse_cpu::c::render(kernel).unwrap().contains("jt +="))
            .count();
        let inputs = edgy_inputs(&graph, 100 + k as u64);
        check_strict(&graph, &inputs, &format!("program {k}:\n{text}"));
    }
    // Every program tiles but two: the one-row transpose (its strided read stays within one
    // line) and the 3-row one (a stride of 12 bytes is no transpose to speak of).
    assert_eq!(
        tiled,
        programs.len() - 2,
        "{tiled} of {} tiled",
        programs.len()
    );
}

/// Permutes whose strided operand is contiguous along an outer axis other than the one the
/// outer index steps (NHWC to NCHW and back, a batched transpose, a 5-D permute, two operands
/// permuted differently) run in tiles along that axis, transposed in registers (`c.rs`,
/// `RowAxis`): bit-exact with edge values, at sizes that leave partial blocks of rows and of
/// inner iterations, and large enough that the threads split the outer range mid-block.
#[test]
fn permutes_tiled_along_another_axis_stay_bit_exact() {
    let programs = [
        // NHWC to NCHW, fused with work: outer [n, c, h], contiguous along c (40 = 16 + 16 + 8).
        "%x = input() name=\"x\" : f32[5, 45, 67, 40]
%y = input() name=\"y\" : f32[5, 40, 45, 67]
%t = permute(%x) perm=[0, 3, 1, 2]
%e = exp(%t)
%z = mul(%e, %y)
output \"z\" = %z
",
        // NCHW to NHWC: contiguous along w (35 = 16 + 16 + 3), the last outer axis.
        "%x = input() name=\"x\" : f32[3, 64, 33, 35]
%t = permute(%x) perm=[0, 2, 3, 1]
%z = neg(%t)
output \"z\" = %z
",
        // A batched transpose (attention's K^T) of 48-wide rows: whole blocks only.
        "%x = input() name=\"x\" : f32[2, 3, 70, 48]
%t = permute(%x) perm=[0, 1, 3, 2]
output \"t\" = %t
",
        // 5-D, contiguous along the second outer axis (18 = 16 + 2).
        "%x = input() name=\"x\" : f32[2, 9, 20, 70, 18]
%t = permute(%x) perm=[0, 4, 2, 1, 3]
%z = tanh(%t)
output \"z\" = %z
",
        // Two operands, contiguous along different outer axes (c and h): the first is
        // transposed, the second read directly. Output rows of 64 or more elements throughout,
        // so that the kernels loop over rows (`kfuse_fusion::splits_rows`).
        "%x = input() name=\"x\" : f32[4, 20, 70, 33]
%w = input() name=\"w\" : f32[4, 33, 70, 20]
%a = permute(%x) perm=[0, 3, 1, 2]
%b = permute(%w) perm=[0, 1, 3, 2]
%z = sub(%a, %b)
output \"z\" = %z
",
    ];
    for (k, text) in programs.iter().enumerate() {
        let graph = parse_graph(text).unwrap();
        let along = fused_kernels(&graph)
            .iter()
            .filter(|kernel| kfuse_cpu::c::render(kernel).unwrap().contains("rb +="))
            .count();
        assert_eq!(
            along, 1,
            "program {k} does not tile along its row axis:\n{text}"
        );
        let inputs = edgy_inputs(&graph, 300 + k as u64);
        check_strict(&graph, &inputs, &format!("program {k}:\n{text}"));
    }
}

/// Random permutes of random 2-D and 3-D shapes (rows from 1 to 130 wide, so that some kernels
/// split rows and tile and others do not), fused with elementwise work and a second operand,
/// f32 and f64: compiled results are bit-exact, whether the kernel tiles or not.
#[test]
fn random_permutes_fused_with_elementwise_work_are_bit_exact() {
    let mut rng = Rng::new(4242);
    let mut tiled = 0;
    for k in 0..40u64 {
        let rank = 2 + rng.below(2);
        let dims: Vec<usize> = (0..rank).map(|_| 1 + rng.below(130)).collect();
        // A random permutation of the axes, not the identity.
        let mut perm: Vec<usize> = (0..rank).collect();
        while perm.iter().enumerate().all(|(i, &p)| i == p) {
            for i in (1..rank).rev() {
                perm.swap(i, rng.below(i + 1));
            }
        }
        let out: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
        let dtype = if rng.below(4) == 0 { "f64" } else { "f32" };
        let op = ["add", "mul", "sub", "max"][rng.below(4)];
        let unary = ["exp", "tanh", "neg", "abs"][rng.below(4)];
        let text = format!(
            "%x = input() name=\"x\" : {dtype}{dims:?}
%y = input() name=\"y\" : {dtype}{out:?}
%t = permute(%x) perm={perm:?}
%u = {unary}(%t)
%z = {op}(%u, %y)
output \"z\" = %z
"
        );
        let graph = parse_graph(&text).unwrap();
        tiled += fused_kernels(&graph)
            .iter()
            .filter(|kernel| kfuse_cpu::c::tile_shape(kernel).is_some())
            .count();
        let inputs = edgy_inputs(&graph, 7000 + k);
        check_strict(&graph, &inputs, &format!("random permute {k}:\n{text}"));
    }
    assert!(
        tiled >= 5,
        "only {tiled} of 40 random permutes ran in tiles"
    );
}

/// Random NHWC programs after the layout assignment (every region forced to NCHW), compiled in
/// strict numerics: the layout changes at the regions' edges, composed with the programs' own
/// permutes, the kernels' rows over several axes, and the tiled permutes (`RowAxis`) stay bit
/// for bit with the reference interpreter, with edge values and without. (The rewrite itself is
/// exact on the reference: `kfuse-opt`'s `layout_assignment_is_exact_on_random_nhwc_programs`.)
#[test]
fn nhwc_programs_in_nchw_stay_bit_exact() {
    let every_region = kfuse_opt::ConvLayout {
        flops_per_second: 1.0,
        bytes_per_second: f64::INFINITY,
    };
    let mut rewritten = 0;
    for seed in 0..16u64 {
        let mut rng = Rng::new(700 + seed);
        let text = kfuse_testkit::random_nhwc_program(&mut rng, 20, 16);
        let graph = parse_graph(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let pipeline = kfuse_opt::Pipeline::new(vec![
            Box::new(every_region.clone()),
            Box::new(kfuse_opt::DeadCode),
        ]);
        let (nchw, trail) = pipeline.run(&graph).unwrap();
        rewritten += usize::from(trail[0].1.is_some());
        let inputs: Vec<(String, Array)> = if seed % 2 == 0 {
            graph
                .inputs()
                .map(|(_, name, ty)| (name.to_string(), kfuse_testkit::random_array(&mut rng, ty)))
                .collect()
        } else {
            kfuse_testkit::grid_inputs(&graph, seed, 2.0, 64)
        };
        check_strict(&nchw, &inputs, &format!("seed {seed}:\n{text}"));
    }
    assert!(rewritten >= 8, "{rewritten} of 16 programs rewritten");
}
