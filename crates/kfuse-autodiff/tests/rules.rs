//! Every gradient rule checked against central finite differences in f64.

mod common;

use common::{check, Domain};
use kfuse_ir::UnaryOp;

fn shape_text(dims: &[usize]) -> String {
    let dims: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("[{}]", dims.join(", "))
}

#[test]
fn unary_ops_match_finite_differences() {
    for (i, op) in UnaryOp::ALL.iter().enumerate() {
        if *op == UnaryOp::Not {
            continue;
        }
        let domain = match op {
            UnaryOp::Log | UnaryOp::Log2 | UnaryOp::Sqrt | UnaryOp::Rsqrt => Domain::Positive,
            _ => Domain::Signed,
        };
        let src = format!(
            "%x = input() name=\"x\" : f64[2, 3]\n%y = {}(%x)\noutput \"y\" = %y\n",
            op.name()
        );
        check(&src, &["x"], domain, 100 + i as u64);
    }
}

const BROADCAST_PAIRS: &[(&[usize], &[usize])] = &[
    (&[2, 3], &[2, 3]),
    (&[2, 3], &[3]),
    (&[2, 1], &[1, 3]),
    (&[], &[2, 3]),
    (&[4, 1, 3], &[2, 1]),
];

#[test]
fn binary_ops_with_broadcasting_match_finite_differences() {
    for (k, op) in ["add", "sub", "mul", "div", "pow", "max", "min"]
        .iter()
        .enumerate()
    {
        for (j, (a, b)) in BROADCAST_PAIRS.iter().enumerate() {
            let domain = if matches!(*op, "pow" | "div" | "rem") {
                Domain::Positive
            } else {
                Domain::Signed
            };
            let src = format!(
                "%a = input() name=\"a\" : f64{}\n%b = input() name=\"b\" : f64{}\n\
                 %y = {op}(%a, %b)\noutput \"y\" = %y\n",
                shape_text(a),
                shape_text(b)
            );
            check(&src, &["a", "b"], domain, (k * 10 + j) as u64);
            check(&src, &["b"], domain, (k * 10 + j) as u64 + 500);
        }
    }
}

#[test]
fn select_routes_the_gradient_by_the_condition() {
    let src = "%c1 = input() name=\"c1\" : f64[2, 3]\n%c2 = input() name=\"c2\" : f64[3]\n\
               %c = gt(%c1, %c2)\n%a = input() name=\"a\" : f64[2, 3]\n\
               %b = input() name=\"b\" : f64[2, 1]\n%y = select(%c, %a, %b)\noutput \"y\" = %y\n";
    check(src, &["a", "b"], Domain::Signed, 1);
}

#[test]
fn clamp_matches_finite_differences() {
    let src = "%x = input() name=\"x\" : f64[3, 4]\n%lo = input() name=\"lo\" : f64[4]\n\
               %hi = input() name=\"hi\" : f64[3, 1]\n%y = clamp(%x, %lo, %hi)\noutput \"y\" = %y\n";
    for seed in 0..4 {
        check(src, &["x", "lo", "hi"], Domain::Signed, seed);
    }
}

#[test]
fn reductions_match_finite_differences() {
    let axes_cases: &[&[usize]] = &[&[0], &[1, 2], &[2], &[0, 1, 2]];
    for (k, op) in [
        "reduce_sum",
        "reduce_mean",
        "reduce_max",
        "reduce_min",
        "reduce_prod",
    ]
    .iter()
    .enumerate()
    {
        for (j, axes) in axes_cases.iter().enumerate() {
            for keepdims in [false, true] {
                let src = format!(
                    "%x = input() name=\"x\" : f64[2, 3, 4]\n\
                     %y = {op}(%x) axes={} keepdims={keepdims}\noutput \"y\" = %y\n",
                    shape_text(axes)
                );
                check(&src, &["x"], Domain::Signed, (k * 10 + j) as u64);
            }
        }
    }
}

#[test]
fn movement_ops_match_finite_differences() {
    let programs = [
        "%x = input() name=\"x\" : f64[2, 6]\n%y = reshape(%x) shape=[3, 1, 4]\n",
        "%x = input() name=\"x\" : f64[2, 3, 4]\n%y = permute(%x) perm=[2, 0, 1]\n",
        "%x = input() name=\"x\" : f64[3, 1]\n%y = broadcast(%x) shape=[2, 3, 4]\n",
        "%x = input() name=\"x\" : f64[7, 5]\n%y = slice(%x) start=[1, 0] stop=[7, 5] step=[2, 3]\n",
        "%x = input() name=\"x\" : f64[6, 4]\n%y = slice(%x) start=[2, 1] stop=[5, 4] step=[1, 1]\n",
        "%x = input() name=\"x\" : f64[9]\n%y = slice(%x) start=[0] stop=[9] step=[4]\n",
        "%x = input() name=\"x\" : f64[2, 3]\n%y = pad(%x) low=[1, 0] high=[2, 3] mode=constant value=0.5\n",
        "%x = input() name=\"x\" : f64[2, 3, 4]\n%y = flip(%x) axes=[0, 2]\n",
        "%x = input() name=\"x\" : f64[3, 4]\n%y = pad(%x) low=[2, 0] high=[1, 3] mode=edge value=0\n",
        "%x = input() name=\"x\" : f64[1, 2]\n%y = pad(%x) low=[2, 1] high=[3, 0] mode=edge value=0\n",
        "%x = input() name=\"x\" : f64[4, 5]\n%y = pad(%x) low=[3, 1] high=[2, 4] mode=reflect value=0\n",
        "%x = input() name=\"x\" : f64[3, 2]\n%y = pad(%x) low=[0, 1] high=[2, 0] mode=reflect value=0\n",
    ];
    for (i, program) in programs.iter().enumerate() {
        let src = format!("{program}output \"y\" = %y\n");
        check(&src, &["x"], Domain::Signed, i as u64);
    }
}

#[test]
fn concat_splits_the_gradient_among_operands() {
    let src = "%a = input() name=\"a\" : f64[2, 3]\n%b = input() name=\"b\" : f64[2, 1]\n\
               %c = input() name=\"c\" : f64[2, 2]\n%y = concat(%a, %b, %c) axis=1\n\
               output \"y\" = %y\n";
    check(src, &["a", "b", "c"], Domain::Signed, 3);
    check(src, &["b"], Domain::Signed, 4);
}

#[test]
fn matmul_with_batch_broadcasting_matches_finite_differences() {
    let cases: &[(&[usize], &[usize])] = &[
        (&[3, 4], &[4, 2]),
        (&[2, 3, 4], &[4, 5]),
        (&[3, 4], &[2, 4, 5]),
        (&[2, 1, 3, 4], &[3, 4, 2]),
    ];
    for (i, (a, b)) in cases.iter().enumerate() {
        let src = format!(
            "%a = input() name=\"a\" : f64{}\n%b = input() name=\"b\" : f64{}\n\
             %y = matmul(%a, %b)\noutput \"y\" = %y\n",
            shape_text(a),
            shape_text(b)
        );
        check(&src, &["a", "b"], Domain::Signed, i as u64);
    }
}

#[test]
fn values_with_several_consumers_sum_their_cotangents() {
    let src = "%x = input() name=\"x\" : f64[3]\n%s = sin(%x)\n%p = mul(%s, %x)\n\
               %e = exp(%x)\n%y = add(%p, %e)\noutput \"y\" = %y\n";
    check(src, &["x"], Domain::Signed, 9);
}

/// Checks a program whose integer `index` input is drawn from `0..bound`.
fn check_indexed(src: &str, wrt: &[&str], bound: usize, seed: u64) {
    let mut graph = kfuse_ir::text::parse_graph(src).unwrap();
    let y = graph
        .outputs()
        .iter()
        .find(|o| o.name == "y")
        .unwrap()
        .value;
    let loss = common::weighted_loss(&mut graph, y);
    let mut rng = kfuse_testkit::Rng::new(seed);
    let inputs: Vec<(String, kfuse_ir::Array)> = graph
        .inputs()
        .map(|(_, name, ty)| {
            let array = if ty.dtype == kfuse_ir::DType::I64 {
                let values: Vec<i64> = (0..ty.shape.n_elems())
                    .map(|_| rng.below(bound) as i64)
                    .collect();
                kfuse_ir::Array::from_vec(ty.shape.dims().to_vec(), values).unwrap()
            } else {
                common::random_input(&mut rng, ty, Domain::Signed)
            };
            (name.to_string(), array)
        })
        .collect();
    assert!(common::check_graph(&graph, loss, wrt, &inputs) > 0);
}

#[test]
fn gather_and_scatter_add_match_finite_differences() {
    let gather = "%x = input() name=\"x\" : f64[4, 3]\n%i = input() name=\"i\" : i64[5, 3]\n\
                  %y = gather(%x, %i) axis=0\noutput \"y\" = %y\n";
    let gather_axis1 = "%x = input() name=\"x\" : f64[2, 4]\n%i = input() name=\"i\" : i64[2, 6]\n\
                        %y = gather(%x, %i) axis=1\noutput \"y\" = %y\n";
    let scatter = "%x = input() name=\"x\" : f64[4, 3]\n%i = input() name=\"i\" : i64[5, 3]\n\
                   %s = input() name=\"s\" : f64[5, 3]\n%y = scatter_add(%x, %i, %s) axis=0\n\
                   output \"y\" = %y\n";
    for seed in 0..3 {
        check_indexed(gather, &["x"], 4, seed);
        check_indexed(gather_axis1, &["x"], 4, seed);
        check_indexed(scatter, &["x", "s"], 4, seed);
    }
}

#[test]
fn sort_and_topk_values_match_finite_differences() {
    let programs = [
        "%x = input() name=\"x\" : f64[3, 5]\n%y, %i = sort(%x) axis=1 descending=false\n",
        "%x = input() name=\"x\" : f64[4, 3]\n%y, %i = sort(%x) axis=0 descending=true\n",
        "%x = input() name=\"x\" : f64[3, 5]\n%y, %i = topk(%x) axis=1 k=2 largest=true\n",
        "%x = input() name=\"x\" : f64[6, 2]\n%y, %i = topk(%x) axis=0 k=3 largest=false\n",
    ];
    for (i, program) in programs.iter().enumerate() {
        let src = format!("{program}output \"y\" = %y\n");
        check(&src, &["x"], Domain::Signed, i as u64);
    }
}
