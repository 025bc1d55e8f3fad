//! Gradient checking against central finite differences in f64 on the reference interpreter.

#![allow(dead_code)]

use kfuse_autodiff::grad;
use kfuse_interp::{run, CustomOps};
use kfuse_ir::text::parse_graph;
use kfuse_ir::{Array, BinaryOp, Graph, Op, ReduceOp, TensorType, Value};
use kfuse_testkit::Rng;

/// Where random input values are drawn from.
#[derive(Clone, Copy, Debug)]
pub enum Domain {
    /// Magnitudes in `[0.1, 1]` with either sign, away from the kinks at 0.
    Signed,
    /// Values in `[0.5, 2]`, for `log`, `sqrt` and the like.
    Positive,
}

pub fn uniform(rng: &mut Rng, lo: f64, hi: f64) -> f64 {
    let unit = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    lo + (hi - lo) * unit
}

pub fn random_input(rng: &mut Rng, ty: &TensorType, domain: Domain) -> Array {
    let n = ty.shape.n_elems();
    let values: Vec<f64> = (0..n)
        .map(|_| match domain {
            Domain::Signed => {
                let m = uniform(rng, 0.1, 1.0);
                if rng.chance(0.5) {
                    m
                } else {
                    -m
                }
            }
            Domain::Positive => uniform(rng, 0.5, 2.0),
        })
        .collect();
    Array::from_vec(ty.shape.dims().to_vec(), values).unwrap()
}

/// `loss = reduce_sum(y * weights)` with a random `weights` input, so that every element of `y`
/// gets a different cotangent.
pub fn weighted_loss(graph: &mut Graph, y: Value) -> Value {
    let ty = graph.ty(y).clone();
    let weights = graph
        .add(
            Op::Input {
                name: "loss_weights".into(),
                ty: ty.clone(),
            },
            vec![],
        )
        .unwrap();
    let product = graph
        .add(Op::Binary(BinaryOp::Mul), vec![y, weights])
        .unwrap();
    graph
        .add(
            Op::Reduce {
                op: ReduceOp::Sum,
                axes: (0..ty.shape.rank()).collect(),
                keepdims: false,
            },
            vec![product],
        )
        .unwrap()
}

fn output<'a>(outputs: &'a [(String, Array)], name: &str) -> &'a Array {
    &outputs.iter().find(|(n, _)| n == name).unwrap().1
}

fn input_value(graph: &Graph, name: &str) -> Value {
    let (id, _, _) = graph.inputs().find(|(_, n, _)| *n == name).unwrap();
    Value::of(id)
}

/// Checks the gradients of `loss` in `graph` with respect to the inputs `wrt` against central
/// finite differences, on the given input values. Returns the number of elements compared.
pub fn check_graph(graph: &Graph, loss: Value, wrt: &[&str], inputs: &[(String, Array)]) -> usize {
    let wrt_values: Vec<Value> = wrt.iter().map(|n| input_value(graph, n)).collect();
    let joint = grad(graph, loss, &wrt_values).unwrap_or_else(|e| panic!("grad failed: {e}"));
    joint.verify().unwrap();
    let results = run(&joint, inputs, &CustomOps::new()).unwrap();
    let mut probe = graph.clone();
    if !probe.outputs().iter().any(|o| o.value == loss) {
        probe.add_output("loss", loss).unwrap();
    }
    let loss_name = probe
        .outputs()
        .iter()
        .find(|o| o.value == loss)
        .unwrap()
        .name
        .clone();
    let eval = |inputs: &[(String, Array)]| -> f64 {
        let out = run(&probe, inputs, &CustomOps::new()).unwrap();
        output(&out, &loss_name).get_f64(0)
    };
    let h = 1e-5;
    let mut compared = 0;
    for name in wrt {
        let analytic = output(&results, &format!("grad_{name}"));
        let index = inputs.iter().position(|(n, _)| n == name).unwrap();
        let base = inputs[index].1.clone();
        assert_eq!(
            analytic.shape(),
            base.shape(),
            "gradient of {name} has the wrong shape"
        );
        for i in 0..base.n_elems() {
            let shifted = |delta: f64| {
                let mut values: Vec<f64> = (0..base.n_elems()).map(|j| base.get_f64(j)).collect();
                values[i] += delta;
                let mut changed = inputs.to_vec();
                changed[index].1 = Array::from_vec(base.shape().dims().to_vec(), values).unwrap();
                eval(&changed)
            };
            let numeric = (shifted(h) - shifted(-h)) / (2.0 * h);
            let exact = analytic.get_f64(i);
            assert!(
                (exact - numeric).abs() <= 1e-6 * (1.0 + numeric.abs()),
                "d loss / d {name}[{i}]: autodiff {exact}, finite differences {numeric}\n{}",
                kfuse_ir::text::print_graph(&joint)
            );
            compared += 1;
        }
    }
    compared
}

/// Parses `src` (f64 programs whose output `y` is the value to differentiate), forms a weighted
/// scalar loss of `y`, draws random inputs from `domain` and checks the gradients with respect
/// to `wrt`.
pub fn check(src: &str, wrt: &[&str], domain: Domain, seed: u64) {
    let mut graph = parse_graph(src).unwrap_or_else(|e| panic!("{e:?}\n{src}"));
    let y = graph
        .outputs()
        .iter()
        .find(|o| o.name == "y")
        .unwrap()
        .value;
    let loss = weighted_loss(&mut graph, y);
    let mut rng = Rng::new(seed);
    let inputs: Vec<(String, Array)> = graph
        .inputs()
        .map(|(_, name, ty)| {
            let domain = if name == "loss_weights" {
                Domain::Signed
            } else {
                domain
            };
            (name.to_string(), random_input(&mut rng, ty, domain))
        })
        .collect();
    let compared = check_graph(&graph, loss, wrt, &inputs);
    assert!(compared > 0);
}
