//! The Tensor API's compiled path: programs built with the API, compiled by default, give the
//! reference interpreter's results (bit for bit in strict numerics, within the documented
//! bounds in fast ones), on sizes that take the vector and threaded paths, on NaN, ±inf, ±0 and
//! subnormal inputs, and on size-0 and size-1 shapes. A compiled program runs again with new
//! inputs, and fuses into the kernels it should.
//!
//! Kernels run as compiled C where a C compiler is found and on the tile interpreter otherwise;
//! the results are checked the same either way.

use kfuse::{
    where_, Array, Compiled, Context, DType, Error, FixedCostModel, Numerics, Options, Shape,
    Storage, Tensor, TensorType,
};
use kfuse_testkit::{bounded_array, random_array, strict_difference, Difference, Rng};

/// Builds a program's named outputs from its inputs.
type Builder = fn(&Context, &[Tensor]) -> Vec<(&'static str, Tensor)>;

/// A test program: its inputs' types and a function building its outputs from them.
struct Program {
    name: &'static str,
    inputs: Vec<(&'static str, TensorType)>,
    build: Builder,
}

impl Program {
    /// A fresh context holding the program, and its named outputs.
    fn build(&self) -> (Context, Vec<(&'static str, Tensor)>) {
        let cx = Context::new();
        let inputs: Vec<Tensor> = self
            .inputs
            .iter()
            .map(|(name, ty)| cx.input(name, ty.dtype, &ty.shape.0))
            .collect();
        let outputs = (self.build)(&cx, &inputs);
        (cx, outputs)
    }
}

fn f32_input(name: &'static str, dims: &[usize]) -> (&'static str, TensorType) {
    (name, TensorType::new(DType::F32, dims))
}

fn programs() -> Vec<Program> {
    vec![
        Program {
            // 81,920 elements: enough for the 16-lane vector bodies and the thread pool.
            name: "elementwise",
            inputs: vec![f32_input("x", &[256, 320]), f32_input("y", &[256, 320])],
            build: |_, t| {
                let (x, y) = (&t[0], &t[1]);
                let chain = ((x * y + 1.0).tanh() - x.abs().sqrt() * 0.5).exp()
                    + x.maximum(y) / (y.abs() + 1.0);
                let select = where_(&x.gt(y), x, -1.0).sigmoid();
                vec![("chain", chain), ("select", select)]
            },
        },
        Program {
            name: "softmax",
            inputs: vec![f32_input("x", &[64, 1000])],
            build: |_, t| {
                vec![
                    ("softmax", t[0].softmax(-1)),
                    ("log_softmax", t[0].log_softmax(-1)),
                ]
            },
        },
        Program {
            name: "dense",
            inputs: vec![f32_input("x", &[128, 64])],
            build: |cx, t| {
                let mut rng = Rng::new(7);
                let w = cx.constant(bounded_array(&mut rng, &Shape::new(vec![64, 96])));
                let b = cx.constant(bounded_array(&mut rng, &Shape::new(vec![96])));
                vec![("y", t[0].matmul(&w).add(&b).relu())]
            },
        },
        Program {
            name: "reductions",
            inputs: vec![f32_input("x", &[300, 257])],
            build: |_, t| {
                let x = &t[0];
                vec![
                    ("rows", x.sum(&[-1], false)),
                    ("columns", x.max(&[0], true)),
                    ("mean", x.mean_all()),
                    ("argmax", x.argmax(-1, false)),
                    ("min", x.min(&[0, 1], false)),
                ]
            },
        },
        Program {
            name: "empty",
            inputs: vec![f32_input("x", &[0, 5])],
            build: |_, t| {
                let x = &t[0];
                vec![
                    ("exp", x.exp() + 1.0),
                    ("rows", x.sum(&[1], false)),
                    ("columns", x.sum(&[0], false)),
                    ("column_max", x.max(&[0], false)),
                ]
            },
        },
        Program {
            name: "single",
            inputs: vec![f32_input("x", &[1, 1])],
            build: |_, t| {
                let x = &t[0];
                vec![
                    ("softmax", x.softmax(-1)),
                    ("sum", x.sum_all()),
                    ("square", x * x),
                ]
            },
        },
    ]
}

/// Inputs for `program`: edge values mixed in (`edges`) or values in [-2, 2].
fn inputs_for(program: &Program, seed: u64, edges: bool) -> Vec<(String, Array)> {
    let mut rng = Rng::new(seed);
    program
        .inputs
        .iter()
        .map(|(name, ty)| {
            let array = if edges {
                random_array(&mut rng, ty)
            } else {
                bounded_array(&mut rng, &ty.shape)
            };
            (name.to_string(), array)
        })
        .collect()
}

/// Element values as f64 (integers and bools too), for comparisons.
fn values(array: &Array) -> Vec<f64> {
    match array.storage() {
        Storage::F32(v) => v.iter().map(|&x| x as f64).collect(),
        Storage::F64(v) => v.clone(),
        Storage::I32(v) => v.iter().map(|&x| x as f64).collect(),
        Storage::I64(v) => v.iter().map(|&x| x as f64).collect(),
        Storage::Bool(v) => v.iter().map(|&x| x as u8 as f64).collect(),
        other => panic!("no comparison for {:?}", other.dtype()),
    }
}

/// Bit equality as strict numerics promise it: NaN matches NaN (signs and payloads aside), and
/// everything else, the sign of zero included, matches exactly.
fn assert_identical(got: &Array, want: &Array, what: &str) {
    match strict_difference(got, want) {
        None => {}
        Some(Difference::Type) => panic!("{what}: compiled {}, reference {}", got.ty(), want.ty()),
        Some(Difference::Element(i)) => panic!(
            "{what}[{i}]: compiled {:e}, reference {:e}",
            got.get_f64(i),
            want.get_f64(i)
        ),
    }
}

/// Closeness as fast numerics promise it: NaN where the reference has NaN, infinities equal,
/// others within `tolerance` relative to `max(1, |reference|)`, zeros of either sign equal.
fn assert_close(got: &Array, want: &Array, tolerance: f64, what: &str) {
    assert_eq!(got.ty(), want.ty(), "{what}");
    let (g, w) = (values(got), values(want));
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let ok = if b.is_nan() || a.is_nan() {
            a.is_nan() && b.is_nan()
        } else if b.is_infinite() || a.is_infinite() {
            a == b
        } else {
            (a - b).abs() <= tolerance * b.abs().max(1.0)
        };
        assert!(ok, "{what}[{i}]: compiled {a:e}, reference {b:e}");
    }
}

fn output_names<'a>(outputs: &'a [(&'static str, Tensor)]) -> Vec<(&'static str, &'a Tensor)> {
    outputs.iter().map(|(n, t)| (*n, t)).collect()
}

fn strict() -> Options {
    Options {
        numerics: Numerics::Strict,
        ..Options::default()
    }
}

#[test]
fn strict_compiled_programs_match_the_reference_bit_for_bit() {
    for (k, program) in programs().iter().enumerate() {
        let (cx, outputs) = program.build();
        let outputs = output_names(&outputs);
        let f = cx
            .compile_with(&outputs, &strict(), &FixedCostModel::default())
            .unwrap();
        // Two runs of one handle on different edge-rich inputs.
        for seed in [k as u64, 100 + k as u64] {
            let inputs = inputs_for(program, seed, true);
            let want = cx.run_reference(&outputs, &inputs).unwrap();
            let got = f.run(&inputs).unwrap();
            assert_eq!(got.len(), outputs.len());
            for ((name, _), (g, w)) in outputs.iter().zip(got.iter().zip(&want)) {
                assert_identical(g, w, &format!("{} {name} seed {seed}", program.name));
            }
        }
    }
}

#[test]
fn default_compiled_programs_match_the_reference_within_fast_bounds() {
    for (k, program) in programs().iter().enumerate() {
        let (cx, outputs) = program.build();
        let outputs = output_names(&outputs);
        let f = cx.compile(&outputs).unwrap();
        let mut runner = f.runner();
        for seed in [k as u64, 50 + k as u64] {
            let inputs = inputs_for(program, seed, false);
            let want = cx.run_reference(&outputs, &inputs).unwrap();
            for got in [f.run(&inputs).unwrap(), runner.run(&inputs).unwrap()] {
                for ((name, _), (g, w)) in outputs.iter().zip(got.iter().zip(&want)) {
                    assert_close(g, w, 1e-4, &format!("{} {name} seed {seed}", program.name));
                }
            }
        }
    }
}

/// NaN, ±inf and ±0 in fast numerics, on elementwise ops no reassociation can reorder: the
/// special values come out where the reference puts them.
#[test]
fn default_compiled_elementwise_ops_keep_special_values() {
    let cx = Context::new();
    let x = cx.input("x", DType::F32, &[70_000]);
    let outputs = [
        ("exp", x.exp()),
        ("relu", x.relu()),
        ("tanh", x.tanh()),
        ("square", &x * &x),
        ("isnan", x.isnan()),
        ("isinf", x.isinf()),
        ("positive", x.gt(0.0)),
    ];
    let outputs = output_names(&outputs);
    let f = cx.compile(&outputs).unwrap();
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1.5,
        -2.5,
    ];
    let data: Vec<f32> = (0..70_000).map(|i| specials[i % specials.len()]).collect();
    let inputs = [("x", Array::from_vec(vec![70_000], data).unwrap())];
    let want = cx.run_reference(&outputs, &inputs).unwrap();
    let got = f.run(&inputs).unwrap();
    for ((name, _), (g, w)) in outputs.iter().zip(got.iter().zip(&want)) {
        assert_close(g, w, 1e-6, name);
    }
    let isnan = got[4].as_slice::<bool>().unwrap();
    let isinf = got[5].as_slice::<bool>().unwrap();
    assert_eq!(
        &isnan[..7],
        &[true, false, false, false, false, false, false]
    );
    assert_eq!(
        &isinf[..7],
        &[false, true, true, false, false, false, false]
    );
}

fn kernels(cx: &Context, outputs: &[(&str, &Tensor)]) -> usize {
    cx.compile(outputs).unwrap().kernel_count()
}

#[test]
fn programs_fuse_into_the_expected_kernels() {
    let cx = Context::new();
    let [a, b, c] = ["a", "b", "c"].map(|n| cx.input(n, DType::F32, &[1000]));
    let sum = &a + &b + &c;
    assert_eq!(kernels(&cx, &[("y", &sum)]), 1, "a + b + c");
    let x = cx.input("x", DType::F32, &[64, 1000]);
    let f = cx.compile(&[("y", &x.softmax(-1))]).unwrap();
    assert_eq!(f.kernel_count(), 1, "softmax\n{}", f.explain());
    assert!(f.explain().starts_with("k0 fused"), "{}", f.explain());
    // The matmul takes its bias and ReLU into its own epilogue.
    let m = cx.input("m", DType::F32, &[128, 64]);
    let w = cx.constant(bounded_array(&mut Rng::new(1), &Shape::new(vec![64, 96])));
    let bias = cx.constant(bounded_array(&mut Rng::new(2), &Shape::new(vec![96])));
    let dense = m.matmul(&w).add(&bias).relu();
    assert_eq!(kernels(&cx, &[("y", &dense)]), 1, "matmul + bias + relu");
    // Two independent programs compiled together stay two kernels.
    assert_eq!(
        kernels(&cx, &[("sum", &sum), ("softmax", &x.softmax(-1))]),
        2
    );
}

/// `got` holds `(x * 3 - 1).relu()` of `x`, within the rounding fast numerics allow (the
/// multiply and subtract may fuse into one FMA).
fn assert_relu_of_affine(got: &Array, x: &[f32]) {
    let got = got.as_slice::<f32>().unwrap();
    assert_eq!(got.len(), x.len());
    for (i, (&g, &v)) in got.iter().zip(x).enumerate() {
        let want = (v as f64 * 3.0 - 1.0).max(0.0);
        assert!(
            (g as f64 - want).abs() <= 1e-6 * want.abs().max(1.0),
            "[{i}]: {g} for x = {v}, want {want}"
        );
    }
}

#[test]
fn a_compiled_program_runs_again_with_new_inputs() {
    let cx = Context::new();
    let x = cx.input("x", DType::F32, &[100_000]);
    let y = (&x * 3.0 - 1.0).relu();
    let f: Compiled = cx.compile(&[("y", &y)]).unwrap();
    assert_eq!(f.kernel_count(), 1);
    let first: Vec<f32> = (0..100_000).map(|i| i as f32 / 1000.0).collect();
    let second: Vec<f32> = (0..100_000).map(|i| 1.0 - i as f32).collect();
    // Owned pairs move their arrays in; a borrowed slice and String names work as well.
    let a = Array::from_vec(vec![100_000], first.clone()).unwrap();
    assert_relu_of_affine(&f.run([("x", a)]).unwrap()[0], &first);
    let b = vec![(
        "x".to_string(),
        Array::from_vec(vec![100_000], second.clone()).unwrap(),
    )];
    assert_relu_of_affine(&f.run(&b).unwrap()[0], &second);
    assert_relu_of_affine(&f.run(b).unwrap()[0], &second);
    // Context::run compiles and runs once, with the same forms of inputs.
    let c = Array::from_vec(vec![100_000], first.clone()).unwrap();
    assert_relu_of_affine(&cx.run(&[("y", &y)], &[("x", c)]).unwrap()[0], &first);
}

#[test]
fn outputs_come_back_in_the_order_given() {
    let cx = Context::new();
    let x = cx.input("x", DType::I64, &[3]);
    let constant = cx.tensor(&[7i64, 8, 9], &[3]);
    let doubled = &x * 2;
    let f = cx
        .compile(&[("doubled", &doubled), ("x", &x), ("constant", &constant)])
        .unwrap();
    let input = Array::from_vec(vec![3], vec![1i64, 2, 3]).unwrap();
    let out = f.run([("x", input)]).unwrap();
    let got: Vec<&[i64]> = out.iter().map(|a| a.as_slice::<i64>().unwrap()).collect();
    assert_eq!(got, vec![&[2i64, 4, 6][..], &[1, 2, 3], &[7, 8, 9]]);
}

#[test]
fn compiled_inputs_are_checked_as_the_interpreter_checks_them() {
    let cx = Context::new();
    let x = cx.input("x", DType::F32, &[2]);
    let unused = cx.input("unused", DType::I32, &[5]);
    let _ = &unused;
    let f = cx.compile(&[("y", &x.exp())]).unwrap();
    let good = Array::from_vec(vec![2], vec![0.0f32, 1.0]).unwrap();
    // An input of the context that the program does not read is accepted and ignored.
    let wrong_shape = Array::from_vec(vec![1], vec![0i32]).unwrap();
    let out = f
        .run([("x", good.clone()), ("unused", wrong_shape)])
        .unwrap();
    assert_eq!(out[0].as_slice::<f32>().unwrap()[0], 1.0);
    for (inputs, want) in [
        (
            vec![("x", good.clone()), ("typo", good.clone())],
            "\"typo\" is not an input",
        ),
        (vec![], "missing input \"x\""),
        (
            vec![("x", Array::from_vec(vec![3], vec![0.0f32; 3]).unwrap())],
            "input \"x\": expected f32[2], found f32[3]",
        ),
    ] {
        for err in [
            f.run(&inputs).unwrap_err(),
            cx.run_reference(&[("y", &x.exp())], &inputs).unwrap_err(),
        ] {
            assert!(matches!(err, Error::Run(_)), "{err:?}");
            assert!(err.to_string().contains(want), "{err}");
        }
    }
}

#[test]
fn building_errors_surface_at_compile_time() {
    let cx = Context::new();
    let x = cx.input("x", DType::F32, &[2, 3]);
    let line = line!() + 1;
    let bad = x.softmax(5);
    let err = match cx.compile(&[("y", &bad)]) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("softmax over axis 5 of a rank-2 tensor compiled"),
    };
    assert!(err.contains(&format!("compiled_api.rs:{line}:")), "{err}");
    assert!(
        err.ends_with("softmax: axis 5 is out of range for rank 2"),
        "{err}"
    );
    let other = Context::new().input("z", DType::F32, &[1]);
    let err = cx.run(&[("z", &other)], [("z", Array::scalar(0.0f32))]);
    assert!(
        err.unwrap_err()
            .to_string()
            .contains("belongs to another Context"),
        "the output of another context is refused"
    );
}

#[test]
fn explain_lists_each_kernel_and_the_graph() {
    let cx = Context::new();
    let x = cx.input("x", DType::F32, &[4, 8]);
    let s = x.exp().sum(&[1], false);
    let f = cx.compile(&[("s", &s)]).unwrap();
    let text = f.explain();
    assert_eq!(
        text.lines().filter(|l| l.starts_with('k')).count(),
        f.kernel_count()
    );
    assert!(
        text.contains("exp %1") && text.contains("reduce_sum %2"),
        "{text}"
    );
    assert!(kfuse::print_graph(f.graph()).contains("reduce_sum"));
    assert_eq!(f.tiers().len(), f.kernel_count());
}

/// One compiled program can serve several threads at once.
#[test]
fn a_compiled_program_runs_on_several_threads() {
    fn shareable<T: Send + Sync>(_: &T) {}
    let cx = Context::new();
    let x = cx.input("x", DType::F64, &[1000]);
    let f = cx.compile(&[("y", &(&x * 2.0))]).unwrap();
    shareable(&f);
    std::thread::scope(|scope| {
        for k in 0..4 {
            let f = &f;
            scope.spawn(move || {
                let input = Array::from_vec(vec![1000], vec![k as f64; 1000]).unwrap();
                let out = f.run([("x", input)]).unwrap();
                assert_eq!(
                    out[0].as_slice::<f64>().unwrap(),
                    &[2.0 * k as f64; 1000][..]
                );
            });
        }
    });
}
