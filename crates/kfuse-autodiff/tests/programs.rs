//! Whole programs: an MLP with softmax cross-entropy, random differentiable chains, ties, the
//! text round trip and the errors.

mod common;

use common::{check_graph, random_input, uniform, weighted_loss, Domain};
use kfuse_autodiff::{grad, AutodiffError};
use kfuse_interp::{run, CustomOps};
use kfuse_ir::text::{parse_graph, print_graph};
use kfuse_ir::{Array, BinaryOp, DType, Graph, Op, ReduceOp, TensorType, UnaryOp, Value};
use kfuse_testkit::Rng;

const MLP: &str = "\
%x = input() name=\"x\" : f64[4, 3]
%w1 = input() name=\"w1\" : f64[3, 5]
%b1 = input() name=\"b1\" : f64[5]
%w2 = input() name=\"w2\" : f64[5, 3]
%b2 = input() name=\"b2\" : f64[3]
%labels = input() name=\"labels\" : f64[4, 3]
%h = matmul(%x, %w1)
%hb = add(%h, %b1)
%a = relu(%hb)
%o = matmul(%a, %w2)
%logits = add(%o, %b2)
%m = reduce_max(%logits) axes=[1] keepdims=true
%z = sub(%logits, %m)
%e = exp(%z)
%s = reduce_sum(%e) axes=[1] keepdims=true
%ls = log(%s)
%logp = sub(%z, %ls)
%picked = mul(%logp, %labels)
%row = reduce_sum(%picked) axes=[1]
%mean = reduce_mean(%row) axes=[0]
%loss = neg(%mean)
output \"loss\" = %loss
";

fn input(graph: &Graph, name: &str) -> Value {
    Value::of(graph.inputs().find(|(_, n, _)| *n == name).unwrap().0)
}

fn loss_of(graph: &Graph) -> Value {
    graph
        .outputs()
        .iter()
        .find(|o| o.name == "loss")
        .unwrap()
        .value
}

#[test]
fn mlp_with_softmax_cross_entropy_matches_finite_differences() {
    let graph = parse_graph(MLP).unwrap();
    let mut rng = Rng::new(7);
    let mut inputs = Vec::new();
    for (_, name, ty) in graph.inputs() {
        let array = if name == "labels" {
            let mut one_hot = vec![0.0f64; 12];
            for row in 0..4 {
                one_hot[row * 3 + rng.below(3)] = 1.0;
            }
            Array::from_vec(vec![4, 3], one_hot).unwrap()
        } else {
            random_input(&mut rng, ty, Domain::Signed)
        };
        inputs.push((name.to_string(), array));
    }
    let compared = check_graph(&graph, loss_of(&graph), &["w1", "b1", "w2", "b2"], &inputs);
    assert_eq!(compared, 15 + 5 + 15 + 3);
}

#[test]
fn the_joint_program_prints_and_parses_back() {
    let graph = parse_graph(MLP).unwrap();
    let joint = grad(
        &graph,
        loss_of(&graph),
        &[input(&graph, "w1"), input(&graph, "b2")],
    )
    .unwrap();
    let text = print_graph(&joint);
    let parsed = parse_graph(&text).unwrap();
    assert_eq!(parsed, joint);
    let names: Vec<&str> = joint.outputs().iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["loss", "grad_w1", "grad_b2"]);
}

#[test]
fn the_backward_half_has_no_dead_nodes() {
    let graph = parse_graph(MLP).unwrap();
    let joint = grad(&graph, loss_of(&graph), &[input(&graph, "b2")]).unwrap();
    let outputs: Vec<(String, Value)> = joint
        .outputs()
        .iter()
        .map(|o| (o.name.clone(), o.value))
        .collect();
    let live = joint.extract(&outputs).unwrap();
    assert_eq!(
        live.nodes().len(),
        joint.nodes().len(),
        "{}",
        print_graph(&joint)
    );
}

#[test]
fn binary_max_gives_ties_to_the_first_operand() {
    let src = "%a = input() name=\"a\" : f64[3]\n%b = input() name=\"b\" : f64[3]\n\
               %m = max(%a, %b)\n%n = min(%a, %b)\n%t = add(%m, %n)\n\
               %loss = reduce_sum(%m) axes=[0]\noutput \"loss\" = %loss\n";
    let graph = parse_graph(src).unwrap();
    let joint = grad(
        &graph,
        loss_of(&graph),
        &[input(&graph, "a"), input(&graph, "b")],
    )
    .unwrap();
    let same = Array::from_vec(vec![3], vec![1.0f64, -2.0, 0.5]).unwrap();
    let inputs = vec![("a".to_string(), same.clone()), ("b".to_string(), same)];
    let out = run(&joint, &inputs, &CustomOps::new()).unwrap();
    let get = |name: &str| out.iter().find(|(n, _)| n == name).unwrap().1.clone();
    assert_eq!(
        get("grad_a"),
        Array::from_vec(vec![3], vec![1.0f64; 3]).unwrap()
    );
    assert_eq!(
        get("grad_b"),
        Array::from_vec(vec![3], vec![0.0f64; 3]).unwrap()
    );
}

#[test]
fn reduce_max_splits_ties_evenly() {
    let src = "%x = input() name=\"x\" : f64[4]\n%loss = reduce_max(%x) axes=[0]\n\
               output \"loss\" = %loss\n";
    let graph = parse_graph(src).unwrap();
    let joint = grad(&graph, loss_of(&graph), &[input(&graph, "x")]).unwrap();
    let x = Array::from_vec(vec![4], vec![3.0f64, 1.0, 3.0, -1.0]).unwrap();
    let out = run(&joint, &[("x".to_string(), x)], &CustomOps::new()).unwrap();
    let expected = Array::from_vec(vec![4], vec![0.5f64, 0.0, 0.5, 0.0]).unwrap();
    assert_eq!(out.iter().find(|(n, _)| n == "grad_x").unwrap().1, expected);
}

#[test]
fn a_float_cast_passes_the_gradient_back_in_the_operand_dtype() {
    let src = "%x = input() name=\"x\" : f64[3]\n%c = cast(%x) to=f32\n\
               %loss = reduce_sum(%c) axes=[0]\noutput \"loss\" = %loss\n";
    let graph = parse_graph(src).unwrap();
    let joint = grad(&graph, loss_of(&graph), &[input(&graph, "x")]).unwrap();
    let x = Array::from_vec(vec![3], vec![0.25f64, 2.0, -1.0]).unwrap();
    let out = run(&joint, &[("x".to_string(), x)], &CustomOps::new()).unwrap();
    let expected = Array::from_vec(vec![3], vec![1.0f64; 3]).unwrap();
    assert_eq!(out.iter().find(|(n, _)| n == "grad_x").unwrap().1, expected);
}

fn error_of(src: &str, wrt: &[&str]) -> AutodiffError {
    let graph = parse_graph(src).unwrap();
    let wrt: Vec<Value> = wrt.iter().map(|n| input(&graph, n)).collect();
    grad(&graph, loss_of(&graph), &wrt).unwrap_err()
}

#[test]
fn a_loss_that_is_not_a_scalar_is_an_error_naming_it() {
    let src = "%x = input() name=\"x\" : f64[3]\n%loss = exp(%x)\noutput \"loss\" = %loss\n";
    let error = error_of(src, &["x"]);
    assert!(matches!(
        error,
        AutodiffError::LossNotScalar { node: 1, .. }
    ));
    assert!(error.to_string().contains("%1"), "{error}");
}

#[test]
fn a_gradient_with_respect_to_an_integer_is_an_error_naming_it() {
    let src = "%i = input() name=\"i\" : i64[3]\n%x = cast(%i) to=f64\n\
               %loss = reduce_sum(%x) axes=[0]\noutput \"loss\" = %loss\n";
    let error = error_of(src, &["i"]);
    assert!(matches!(
        error,
        AutodiffError::NotDifferentiable { node: 0, .. }
    ));
    assert!(error.to_string().contains("%0 (input)"), "{error}");
}

#[test]
fn a_comparison_between_the_input_and_the_loss_is_an_error_naming_it() {
    let src = "%x = input() name=\"x\" : f64[3]\n%z = input() name=\"z\" : f64[3]\n\
               %c = gt(%x, %z)\n%f = cast(%c) to=f64\n\
               %loss = reduce_sum(%f) axes=[0]\noutput \"loss\" = %loss\n";
    let error = error_of(src, &["x"]);
    assert!(error.to_string().contains("%2 (gt)"), "{error}");
    // Through the condition of a select, a comparison is fine.
    let fine = "%x = input() name=\"x\" : f64[3]\n%z = input() name=\"z\" : f64[3]\n\
                %c = gt(%x, %z)\n%s = select(%c, %x, %z)\n\
                %loss = reduce_sum(%s) axes=[0]\noutput \"loss\" = %loss\n";
    let graph = parse_graph(fine).unwrap();
    grad(&graph, loss_of(&graph), &[input(&graph, "x")]).unwrap();
}

#[test]
fn an_op_without_a_rule_is_an_unsupported_error_naming_it() {
    let src = "%x = input() name=\"x\" : f64[1, 1, 3, 3]\n\
               %p = pool2d(%x) kind=max layout=nchw window=[2, 2] stride=[1, 1] \
               padding=[0, 0, 0, 0] dilation=[1, 1] count_include_pad=false\n\
               %loss = reduce_sum(%p) axes=[0, 1, 2, 3]\noutput \"loss\" = %loss\n";
    let error = error_of(src, &["x"]);
    assert_eq!(error.to_string(), "node %1 (pool2d) has no gradient rule");
}

#[test]
fn asking_twice_for_one_gradient_is_an_error() {
    let src = "%x = input() name=\"x\" : f64[3]\n%loss = reduce_sum(%x) axes=[0]\n\
               output \"loss\" = %loss\n";
    let error = error_of(src, &["x", "x"]);
    assert_eq!(error, AutodiffError::OutputNameTaken("grad_x".into()));
}

/// A random chain of elementwise, broadcasting and reducing ops on f64 inputs.
fn random_program(rng: &mut Rng) -> Graph {
    let mut graph = Graph::new();
    let dims = [1 + rng.below(3), 1 + rng.below(3), 1 + rng.below(3)];
    let ty = TensorType::new(DType::F64, dims.to_vec());
    let mut current = graph
        .add(
            Op::Input {
                name: "in0".into(),
                ty,
            },
            vec![],
        )
        .unwrap();
    let mut n_inputs = 1;
    for _ in 0..2 + rng.below(5) {
        let shape = graph.ty(current).shape.dims().to_vec();
        current = match rng.below(3) {
            0 => {
                let op = rng.pick(&[
                    UnaryOp::Sin,
                    UnaryOp::Tanh,
                    UnaryOp::Sigmoid,
                    UnaryOp::Softplus,
                    UnaryOp::Gelu,
                    UnaryOp::Erf,
                    UnaryOp::Neg,
                    UnaryOp::Cos,
                ]);
                graph.add(Op::Unary(op), vec![current]).unwrap()
            }
            1 => {
                // A new input whose shape broadcasts against the current one.
                let mut other: Vec<usize> = shape
                    .iter()
                    .map(|&d| if rng.chance(0.4) { 1 } else { d })
                    .collect();
                let drop = rng.below(other.len() + 1);
                other.drain(..drop);
                let name = format!("in{n_inputs}");
                n_inputs += 1;
                let ty = TensorType::new(DType::F64, other);
                let operand = graph.add(Op::Input { name, ty }, vec![]).unwrap();
                let op = rng.pick(&[BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Max]);
                let (a, b) = if rng.chance(0.5) {
                    (current, operand)
                } else {
                    (operand, current)
                };
                graph.add(Op::Binary(op), vec![a, b]).unwrap()
            }
            _ => {
                let op = rng.pick(&[ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max]);
                let axis = rng.below(shape.len());
                graph
                    .add(
                        Op::Reduce {
                            op,
                            axes: vec![axis],
                            keepdims: true,
                        },
                        vec![current],
                    )
                    .unwrap()
            }
        };
    }
    graph.add_output("y", current).unwrap();
    graph
}

#[test]
fn random_differentiable_programs_match_finite_differences() {
    let mut rng = Rng::new(2024);
    for _ in 0..200 {
        let mut graph = random_program(&mut rng);
        let y = graph.outputs()[0].value;
        let loss = weighted_loss(&mut graph, y);
        let names: Vec<String> = graph
            .inputs()
            .map(|(_, n, _)| n.to_string())
            .filter(|n| n != "loss_weights")
            .collect();
        let inputs: Vec<(String, Array)> = graph
            .inputs()
            .map(|(_, name, ty)| {
                let values: Vec<f64> = (0..ty.shape.n_elems())
                    .map(|_| uniform(&mut rng, -1.0, 1.0))
                    .collect();
                (
                    name.to_string(),
                    Array::from_vec(ty.shape.dims().to_vec(), values).unwrap(),
                )
            })
            .collect();
        let wrt: Vec<&str> = names.iter().map(String::as_str).collect();
        check_graph(&graph, loss, &wrt, &inputs);
    }
}

#[test]
fn an_argmax_feeding_a_gather_index_is_not_on_the_path() {
    let src = "%x = input() name=\"x\" : f64[4, 3]\n%i = argmax(%x) axes=[0] keepdims=true\n\
               %g = gather(%x, %i) axis=0\n%loss = reduce_sum(%g) axes=[0, 1]\n\
               output \"loss\" = %loss\n";
    let graph = parse_graph(src).unwrap();
    let joint = grad(&graph, loss_of(&graph), &[input(&graph, "x")]).unwrap();
    let x = Array::from_vec(vec![4, 3], (0..12).map(|i| ((i * 5) % 7) as f64).collect()).unwrap();
    let out = run(&joint, &[("x".to_string(), x)], &CustomOps::new()).unwrap();
    let got = &out.iter().find(|(n, _)| n == "grad_x").unwrap().1;
    // Column maxima of [[0,5,3],[1,6,4],[2,0,5],[3,1,6]] sit in rows 3, 1 and 3.
    let mut want = vec![0.0f64; 12];
    want[9] = 1.0;
    want[4] = 1.0;
    want[11] = 1.0;
    assert_eq!(*got, Array::from_vec(vec![4, 3], want).unwrap());
}
