//! The memory planner reuses slots whose occupants are dead, never lets a step read and write
//! the same slot, and a runner gives the same results on repeated runs.

use kfuse_fusion::{FixedCostModel, FusePolicy};
use kfuse_interp::CustomOps;
use kfuse_ir::text::parse_graph;
use kfuse_ir::Array;
use kfuse_kernel::{Access, Step};
use kfuse_runtime::{compile, plan_memory};

#[test]
fn an_unfused_chain_needs_two_slots_and_no_step_aliases_itself() {
    let g = parse_graph(
        "%x = input() name=\"x\" : f32[1000]\n%a = exp(%x)\n%b = neg(%a)\n%c = sin(%b)\n%d = abs(%c)\n%e = sqrt(%d)\noutput \"e\" = %e\n",
    )
    .unwrap();
    let exe = compile(&g, FusePolicy::None, &FixedCostModel::default()).unwrap();
    let plan = plan_memory(&exe.program);
    assert_eq!(exe.program.steps.len(), 5);
    assert_eq!(plan.slots.len(), 2, "{plan:?}");
    assert_eq!(plan.slot_bytes(), 8000);
    for step in &exe.program.steps {
        let Step::Kernel { kernel, args } = step else {
            continue;
        };
        let slots = |access| {
            args.iter()
                .zip(&kernel.args)
                .filter(move |(_, a)| a.access == access)
                .filter_map(|(b, _)| plan.slot_of[b.0 as usize])
        };
        for w in slots(Access::Write) {
            assert!(
                !slots(Access::Read).any(|r| r == w),
                "a step reads and writes slot {w}"
            );
        }
    }
    let x = Array::from_vec(
        vec![1000],
        (0..1000)
            .map(|i| i as f32 / 100.0 - 5.0)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let inputs = [("x".to_string(), x)];
    let want = kfuse_interp::run(&g, &inputs, &CustomOps::new()).unwrap();
    let mut runner = exe.runner();
    for _ in 0..3 {
        runner.run(&inputs, &CustomOps::new()).unwrap();
        assert_eq!(runner.outputs(&inputs), want);
    }
}

#[test]
fn outputs_that_are_inputs_or_constants_are_returned_as_such() {
    let g = parse_graph("%x = input() name=\"x\" : f32[2]\n%c = constant() value=[7.0] : f32[]\noutput \"x\" = %x\noutput \"c\" = %c\n").unwrap();
    let exe = compile(&g, FusePolicy::Cost, &FixedCostModel::default()).unwrap();
    let x = Array::from_vec(vec![2], vec![1.0f32, 2.0]).unwrap();
    let (out, stats) = exe
        .run(&[("x".into(), x.clone())], &CustomOps::new())
        .unwrap();
    assert_eq!(out[0].1, x);
    assert_eq!(out[1].1, Array::scalar(7.0f32));
    assert_eq!(stats.kernels, 0);
}

#[test]
fn a_buffer_larger_than_the_machine_is_an_error_naming_its_node() {
    // Four terabytes: beyond what any machine this runs on has available, so the slot is
    // refused before anything is allocated.
    let g = parse_graph(
        "%x = input() name=\"x\" : f32[4]\n%i = iota() axis=0 : f32[1000000000000]\n\
         %p = pad(%x) low=[0] high=[999999999996] mode=constant value=0.0\n%s = add(%i, %p)\n\
         output \"s\" = %s\n",
    )
    .unwrap();
    let exe = compile(&g, FusePolicy::None, &FixedCostModel::default()).unwrap();
    let x = Array::from_vec(vec![4], vec![1.0f32; 4]).unwrap();
    let err = exe.run(&[("x".into(), x)], &CustomOps::new()).unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(
            err,
            kfuse_runtime::RunError::OutOfMemory {
                node: 1,
                op: "iota",
                ..
            }
        ),
        "{message}"
    );
    assert!(
        message.starts_with("node %1 (iota): f32[1000000000000] needs 4000000000000 bytes, more"),
        "{message}"
    );
}

#[test]
fn a_splat_constant_is_stored_once_compiled_or_refused_naming_its_node() {
    let g = parse_graph(
        "%c = constant() value=0.5 : f32[1000]\n%x = input() name=\"x\" : f32[1000]\n\
         %s = add(%x, %c)\noutput \"s\" = %s\n",
    )
    .unwrap();
    let exe = compile(&g, FusePolicy::None, &FixedCostModel::default()).unwrap();
    let x = Array::from_vec(vec![1000], vec![1.0f32; 1000]).unwrap();
    let (out, _) = exe.run(&[("x".into(), x)], &CustomOps::new()).unwrap();
    assert_eq!(out[0].1.as_slice::<f32>(), Some(&[1.5f32; 1000][..]));

    // Text caps a constant at 1 GiB; a graph built in code can hold a splat of any size, which
    // compiling must store, and cannot.
    let mut huge = kfuse_ir::Graph::new();
    let value = Array::splat(kfuse_ir::Shape::new(vec![1 << 60]), 1.0f32).unwrap();
    let c = huge.add(kfuse_ir::Op::Constant { value }, vec![]).unwrap();
    huge.add_output("c", c).unwrap();
    let err = compile(&huge, FusePolicy::None, &FixedCostModel::default()).unwrap_err();
    assert!(
        matches!(
            err,
            kfuse_runtime::RunError::OutOfMemory {
                node: 0,
                op: "constant",
                ..
            }
        ),
        "{err}"
    );
}
