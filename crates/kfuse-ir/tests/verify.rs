//! The verifier catches graphs that passes corrupted in place.

use kfuse_ir::text::parse_graph;
use kfuse_ir::{DType, IrError, NodeId, TensorType, Value};

fn graph() -> kfuse_ir::Graph {
    parse_graph(
        "%x = input() name=\"x\" : f32[2]\n%y = exp(%x)\n%z = add(%y, %x)\noutput \"z\" = %z\n",
    )
    .unwrap()
}

#[test]
fn a_well_formed_graph_verifies() {
    graph().verify().unwrap();
}

#[test]
fn wrong_recorded_types_are_caught() {
    let mut g = graph();
    g.nodes_mut()[1].types = vec![TensorType::new(DType::F64, [2])];
    assert_eq!(
        g.verify().unwrap_err(),
        IrError::TypeMismatch {
            node: 1,
            op: "exp",
            recorded: "f64[2]".into(),
            inferred: "f32[2]".into()
        }
    );
}

#[test]
fn forward_references_and_missing_results_are_caught() {
    let mut g = graph();
    g.nodes_mut()[1].operands[0] = Value {
        node: NodeId(2),
        result: 0,
    };
    assert!(matches!(
        g.verify(),
        Err(IrError::BadOperand {
            node: 1,
            operand: 0,
            target: 2,
            ..
        })
    ));
    let mut g = graph();
    g.nodes_mut()[2].operands[1] = Value {
        node: NodeId(0),
        result: 1,
    };
    assert!(matches!(
        g.verify(),
        Err(IrError::BadOperand {
            node: 2,
            operand: 1,
            target: 0,
            result: 1,
            ..
        })
    ));
}

#[test]
fn ops_given_the_wrong_operands_are_caught() {
    let mut g = graph();
    g.nodes_mut()[2].operands.pop();
    let err = g.verify().unwrap_err().to_string();
    assert_eq!(err, "node %2 (add): expected 2 operands, found 1");
}

#[test]
fn extract_keeps_only_what_outputs_need() {
    let g = parse_graph(
        "%x = input() name=\"x\" : f32[2]\n%u = input() name=\"unused\" : f32[1]\n%y = exp(%x)\n%dead = sin(%x)\n\
         output \"y\" = %y\n",
    )
    .unwrap();
    let y = g.outputs()[0].value;
    let small = g.extract(&[("y".into(), y)]).unwrap();
    assert_eq!(
        kfuse_ir::text::print_graph(&small),
        "%0 = input() name=\"x\" : f32[2]\n%1 = exp(%0) : f32[2]\noutput \"y\" = %1\n"
    );
    assert!(g
        .extract(&[(
            "bad".into(),
            Value {
                node: NodeId(9),
                result: 0
            }
        )])
        .is_err());
}
