//! The interpreter's contract beyond single ops: inputs are checked, custom functions are called
//! and checked, random values do not depend on how a program is cut up, and no well-typed graph
//! on any input makes it panic.

use kfuse_interp::{run, run_with_limit, run_with_stats, CustomOps, InterpError};
use kfuse_ir::text::parse_graph;
use kfuse_ir::{AllocError, Array, Graph, MemoryLimit, TensorType};
use kfuse_testkit::{random_array, random_graph, Rng};

fn f32s(a: &Array) -> Vec<f32> {
    a.as_slice::<f32>().unwrap().to_vec()
}

#[test]
fn inputs_are_checked_by_name_and_type() {
    let g =
        parse_graph("%x = input() name=\"x\" : f32[2]\n%y = neg(%x)\noutput \"y\" = %y\n").unwrap();
    let good = Array::from_vec(vec![2], vec![1.0f32, -2.0]).unwrap();
    let out = run(&g, &[("x".into(), good.clone())], &CustomOps::new()).unwrap();
    assert_eq!(f32s(&out[0].1), vec![-1.0, 2.0]);

    let err = run(&g, &[], &CustomOps::new()).unwrap_err();
    assert_eq!(err.to_string(), "missing input \"x\" (expected f32[2])");
    let wrong = Array::from_vec(vec![3], vec![1.0f32, 2.0, 3.0]).unwrap();
    let err = run(&g, &[("x".into(), wrong)], &CustomOps::new()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "input \"x\": expected f32[2], found f32[3]"
    );
    let ints = Array::from_vec(vec![2], vec![1i32, 2]).unwrap();
    assert!(matches!(
        run(&g, &[("x".into(), ints)], &CustomOps::new()),
        Err(InterpError::InputType { .. })
    ));
    let err = run(
        &g,
        &[("x".into(), good.clone()), ("z".into(), good)],
        &CustomOps::new(),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "\"z\" is not an input of this program (its inputs: \"x\": f32[2])"
    );
}

#[test]
fn custom_functions_are_called_and_their_results_checked() {
    let g = parse_graph(
        "%x = input() name=\"x\" : f32[3]\n%s, %n = custom(%x) fn=\"sum_and_count\" : f32[], i64[]\n\
         output \"s\" = %s\noutput \"n\" = %n\n",
    )
    .unwrap();
    let mut ops = CustomOps::new();
    ops.register("sum_and_count", |args| {
        let v = args[0].as_slice::<f32>().ok_or("expected f32")?;
        Ok(vec![
            Array::scalar(v.iter().sum::<f32>()),
            Array::scalar(v.len() as i64),
        ])
    });
    let x = Array::from_vec(vec![3], vec![1.0f32, 2.0, 4.0]).unwrap();
    let out = run(&g, &[("x".into(), x.clone())], &ops).unwrap();
    assert_eq!(out[0].1, Array::scalar(7.0f32));
    assert_eq!(out[1].1, Array::scalar(3i64));

    let mut liar = CustomOps::new();
    liar.register("sum_and_count", |_| Ok(vec![Array::scalar(1.0f32)]));
    let err = run(&g, &[("x".into(), x.clone())], &liar).unwrap_err();
    assert!(
        err.to_string()
            .contains("returned f32[] but declared f32[], i64[]"),
        "{err}"
    );

    let mut failing = CustomOps::new();
    failing.register("sum_and_count", |_| Err("device on fire".into()));
    let err = run(&g, &[("x".into(), x)], &failing).unwrap_err();
    assert!(err.to_string().contains("failed: device on fire"), "{err}");
}

#[test]
fn random_values_depend_only_on_seed_and_index() {
    let g = parse_graph(
        "%u = rng() dist=uniform seed=9 : f32[4, 5]\n%n = rng() dist=normal seed=9 : f64[20]\n\
         %s = slice(%u) start=[2, 1] stop=[4, 5] step=[1, 2]\n%h = rng() dist=normal seed=3 : bf16[6]\n\
         output \"u\" = %u\noutput \"n\" = %n\noutput \"s\" = %s\noutput \"h\" = %h\n",
    )
    .unwrap();
    let out = run(&g, &[], &CustomOps::new()).unwrap();
    let u = f32s(&out[0].1);
    for (i, &v) in u.iter().enumerate() {
        assert_eq!(v, kfuse_math::uniform_f32(9, i as u64));
        assert!((0.0..1.0).contains(&v));
    }
    let n = out[1].1.as_slice::<f64>().unwrap();
    for (i, &v) in n.iter().enumerate() {
        assert_eq!(v, kfuse_math::normal_f64(9, i as u64));
    }
    // A slice of a random tensor is the same elements, however the program is cut.
    assert_eq!(f32s(&out[2].1), vec![u[11], u[13], u[16], u[18]]);
    let h = out[3].1.as_slice::<kfuse_ir::bf16>().unwrap();
    for (i, v) in h.iter().enumerate() {
        assert_eq!(
            *v,
            kfuse_ir::bf16::from_f32(kfuse_math::normal_f32(3, i as u64))
        );
    }
}

#[test]
fn impossible_allocations_are_errors_not_aborts() {
    let g = parse_graph(
        "%c = constant() value=1.0 : f32[]\n%b = broadcast(%c) shape=[1000000, 1000000, 1000000]\n\
         %s = reduce_sum(%b) axes=[0, 1, 2]\noutput \"s\" = %s\n",
    )
    .unwrap();
    let err = run(&g, &[], &CustomOps::new()).unwrap_err();
    assert!(
        matches!(err, InterpError::OutOfMemory { node: 1, .. }),
        "{err}"
    );
}

#[test]
fn results_beyond_the_memory_left_are_refused_naming_the_node() {
    // Two live 400-byte values leave 200 of 1000 bytes: the third result does not fit.
    let g = parse_graph(
        "%a = iota() axis=0 : f32[100]\n%b = iota() axis=0 : f32[100]\n%c = add(%a, %b)\n\
         output \"c\" = %c\n",
    )
    .unwrap();
    let custom = CustomOps::new();
    let err = run_with_limit(&g, &[], &custom, MemoryLimit::available(1000)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "node %2 (add): f32[100] needs 400 bytes, more than the 200 bytes this machine has \
         available"
    );
    assert!(matches!(
        err,
        InterpError::OutOfMemory {
            node: 2,
            op: "add",
            error: AllocError::OverLimit { bytes: 400, .. }
        }
    ));
    let (out, stats) = run_with_limit(&g, &[], &custom, MemoryLimit::available(1200)).unwrap();
    assert_eq!(out[0].1.get_f64(99), 198.0);
    assert_eq!(stats.peak_bytes, 1200);
}

#[test]
fn a_splat_constant_is_stored_when_reached_and_refused_when_too_large() {
    let mut g = Graph::new();
    let splat = Array::splat(kfuse_ir::Shape::new(vec![1 << 40]), 0.25f32).unwrap();
    let c = g
        .add(kfuse_ir::Op::Constant { value: splat }, vec![])
        .unwrap();
    let s = g
        .add(
            kfuse_ir::Op::Reduce {
                op: kfuse_ir::ReduceOp::Sum,
                axes: vec![0],
                keepdims: false,
            },
            vec![c],
        )
        .unwrap();
    g.add_output("s", s).unwrap();
    let custom = CustomOps::new();
    let err = run_with_limit(&g, &[], &custom, MemoryLimit::available(1 << 30)).unwrap_err();
    assert!(
        matches!(
            err,
            InterpError::OutOfMemory {
                node: 0,
                op: "constant",
                ..
            }
        ),
        "{err}"
    );
    let small = parse_graph(
        "%c = constant() value=0.25 : f32[64]\n%s = reduce_sum(%c) axes=[0]\n\
         output \"c\" = %c\noutput \"s\" = %s\n",
    )
    .unwrap();
    let out = run_with_limit(&small, &[], &custom, MemoryLimit::available(1 << 20))
        .unwrap()
        .0;
    assert_eq!(f32s(&out[0].1), vec![0.25; 64]);
    assert_eq!(f32s(&out[1].1), vec![16.0]);
}

#[test]
fn iota_of_every_dtype_is_a_cast_of_its_indices_across_blocks() {
    // More elements than one conversion block, so the blocks' seams are crossed.
    let n = (1 << 16) + 5;
    for dtype in ["f32", "f64", "f16", "bf16", "i32", "i64", "u8"] {
        let g = parse_graph(&format!(
            "%i = iota() axis=1 : i64[2, {n}]\n%c = cast(%i) to={dtype}\n\
             %x = iota() axis=1 : {dtype}[2, {n}]\noutput \"c\" = %c\noutput \"x\" = %x\n"
        ))
        .unwrap();
        let out = run(&g, &[], &CustomOps::new()).unwrap();
        assert!(out[0].1 == out[1].1, "{dtype}");
        // Row 1, column 65540: past the first block's end.
        let expected = if dtype == "u8" {
            65540.0 % 256.0
        } else {
            65540.0
        };
        if dtype != "f16" && dtype != "bf16" {
            assert_eq!(out[1].1.get_f64(n + 65540), expected, "{dtype}");
        }
    }
}

#[test]
fn empty_arrays_with_huge_dims_reduce_sort_and_concatenate() {
    // Each has no elements, but products of its other dims overflow `usize`.
    let g = parse_graph(
        "%x = iota() axis=0 : f32[0, 4611686018427387904]\n\
         %s = reduce_sum(%x) axes=[1]\n\
         %y = iota() axis=0 : f32[1099511627776, 0, 5]\n\
         %m = reduce_max(%y) axes=[2]\n\
         %z = iota() axis=0 : f32[2, 0, 4611686018427387904]\n\
         %t = reduce_sum(%z) axes=[1, 2]\n\
         %v, %i = sort(%z) axis=2 descending=false\n\
         %c = concat(%z, %z) axis=0\n\
         %w = iota() axis=0 : f32[2, 4611686018427387904, 0]\n\
         %p = matmul(%z, %w)\n\
         output \"s\" = %s\noutput \"m\" = %m\noutput \"t\" = %t\noutput \"i\" = %i\n\
         output \"c\" = %c\noutput \"p\" = %p\n",
    )
    .unwrap();
    let out = run(&g, &[], &CustomOps::new()).unwrap();
    assert_eq!(out[0].1.n_elems(), 0);
    assert_eq!(out[1].1.shape().dims(), &[1099511627776, 0]);
    assert_eq!(f32s(&out[2].1), vec![0.0, 0.0]);
    assert_eq!(out[3].1.n_elems(), 0);
    assert_eq!(out[4].1.shape().dims(), &[4, 0, 4611686018427387904]);
    assert_eq!(out[5].1.shape().dims(), &[2, 0, 0]);
}

#[test]
fn stats_count_nodes_and_bytes() {
    let g = parse_graph(
        "%x = input() name=\"x\" : f32[4]\n%a = exp(%x)\n%b = neg(%a)\n%dead = sin(%x)\n\
         output \"b\" = %b\n",
    )
    .unwrap();
    let x = Array::from_vec(vec![4], vec![0.0f32; 4]).unwrap();
    let (_, stats) = run_with_stats(&g, &[("x".into(), x)], &CustomOps::new()).unwrap();
    assert_eq!(stats.nodes, 4);
    assert_eq!(stats.bytes_materialized, 64);
    // x and exp(x) are freed as soon as neg and sin have read them.
    assert!(stats.peak_bytes <= 48, "{stats:?}");
}

/// Random inputs (rich in NaN, infinities, zeros and subnormals) for a graph.
fn random_inputs(graph: &Graph, rng: &mut Rng) -> Vec<(String, Array)> {
    graph
        .inputs()
        .map(|(_, name, ty)| (name.to_string(), random_array(rng, ty)))
        .collect()
}

#[test]
fn random_graphs_on_edge_value_inputs_never_panic() {
    let mut ok = 0;
    let mut rng = Rng::new(99);
    for seed in 0..600u64 {
        let graph = random_graph(seed, 16);
        let inputs = random_inputs(&graph, &mut rng);
        match run(&graph, &inputs, &CustomOps::new()) {
            Ok(outputs) => {
                ok += 1;
                for ((_, array), out) in outputs.iter().zip(graph.outputs()) {
                    let want: &TensorType = graph.ty(out.value);
                    assert_eq!(&array.ty(), want, "seed {seed}: output type");
                }
            }
            Err(InterpError::Runtime { op, message, .. }) => {
                // The only run-time failures are data-dependent indices and unregistered custom
                // functions (the generator never registers one).
                assert!(
                    matches!(op, "gather" | "scatter_add" | "custom"),
                    "seed {seed}: {op}: {message}"
                );
            }
            Err(e) => panic!("seed {seed}: {e}"),
        }
    }
    assert!(ok > 300, "only {ok} graphs ran to completion");
}
