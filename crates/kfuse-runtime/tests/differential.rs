//! Differential testing: random graphs over the whole op set, on inputs rich in NaN, infinities,
//! signed zeros and subnormals, compiled under every fusion policy and run on the tile
//! interpreter, give bit-identical results to the reference interpreter (NaNs match NaNs).

use kfuse_fusion::{FixedCostModel, FusePolicy};
use kfuse_interp::CustomOps;
use kfuse_ir::{Array, Graph};
use kfuse_runtime::compile;
use kfuse_testkit::{random_array, strict_difference, GraphGen, Rng};

/// Strict numerics' bit-identity: NaNs match NaNs whatever their signs and payloads.
fn same_bits(a: &Array, b: &Array) -> bool {
    strict_difference(a, b).is_none()
}

fn check(seed: u64, graph: &Graph, inputs: &[(String, Array)]) -> Result<bool, String> {
    let reference = kfuse_interp::run(graph, inputs, &CustomOps::new());
    for policy in [FusePolicy::None, FusePolicy::Greedy, FusePolicy::Cost] {
        let exe = compile(graph, policy, &FixedCostModel::default())
            .map_err(|e| format!("seed {seed} {policy:?}: {e}"))?;
        let got = exe.run(inputs, &CustomOps::new());
        match (&reference, &got) {
            (Ok(want), Ok((outputs, _))) => {
                for ((name, w), (_, g)) in want.iter().zip(outputs) {
                    if !same_bits(w, g) {
                        let program: String = exe
                            .program
                            .kernels()
                            .map(kfuse_kernel::text::print_kernel)
                            .collect();
                        return Err(format!(
                            "seed {seed} {policy:?}: output {name} differs\nreference {w:?}\ncompiled  {g:?}\ngraph:\n{}\n{}",
                            kfuse_ir::text::print_graph(graph),
                            program
                        ));
                    }
                }
            }
            (Err(_), Err(_)) => {}
            (want, got) => {
                return Err(format!(
                    "seed {seed} {policy:?}: reference {:?} but compiled {:?}\n{}",
                    want.as_ref().err(),
                    got.as_ref().err(),
                    kfuse_ir::text::print_graph(graph)
                ))
            }
        }
    }
    Ok(reference.is_ok())
}

#[test]
fn compiled_programs_match_the_interpreter_bit_for_bit() {
    let mut ran = 0;
    for seed in 0..2500u64 {
        let mut rng = Rng::new(seed);
        let n_inputs = 1 + rng.below(3);
        let mut gen = GraphGen::new(&mut rng);
        gen.allow_custom = false;
        let graph = gen.generate(n_inputs, 16);
        let mut data_rng = Rng::new(seed ^ 0xDA7A);
        let inputs: Vec<(String, Array)> = graph
            .inputs()
            .map(|(_, n, t)| (n.to_string(), random_array(&mut data_rng, t)))
            .collect();
        match check(seed, &graph, &inputs) {
            Ok(true) => ran += 1,
            Ok(false) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert!(ran > 1500, "only {ran} programs ran to completion");
}

#[test]
fn large_row_kernels_cross_tiles_and_fill_every_lane() {
    let programs = [
        // Softmax over rows of 2500 (three tiles per row).
        "%x = input() name=\"x\" : f32[3, 2500]\n%m = reduce_max(%x) axes=[1] keepdims=true\n%d = sub(%x, %m)\n%e = exp(%d)\n\
         %s = reduce_sum(%e) axes=[1] keepdims=true\n%y = div(%e, %s)\noutput \"y\" = %y\n",
        // Layer norm in f16 over 1500 columns, reducing a non-trailing axis too.
        "%x = input() name=\"x\" : f16[2, 1500]\n%mu = reduce_mean(%x) axes=[1] keepdims=true\n%d = sub(%x, %mu)\n%d2 = mul(%d, %d)\n\
         %v = reduce_mean(%d2) axes=[1] keepdims=true\n%r = rsqrt(%v)\n%y = mul(%d, %r)\n%c = reduce_sum(%x) axes=[0]\n\
         output \"y\" = %y\noutput \"c\" = %c\n",
        // A full reduction with a prologue, and arg reductions, over 5000 elements.
        "%x = input() name=\"x\" : f64[5000]\n%e = expm1(%x)\n%s = reduce_sum(%e) axes=[0]\n%a = argmax(%x) axes=[0]\n\
         %b = argmin(%e) axes=[0]\n%p = reduce_prod(%x) axes=[0]\noutput \"s\" = %s\noutput \"a\" = %a\noutput \"b\" = %b\noutput \"p\" = %p\n",
        // Pointwise with broadcasting and movement over 2 x 3000.
        "%x = input() name=\"x\" : f32[2, 3000]\n%w = input() name=\"w\" : f32[3000]\n%f = flip(%x) axes=[1]\n%y = mul(%f, %w)\n\
         %t = tanh(%y)\n%p = pad(%t) low=[0, 5] high=[1, 7] mode=reflect\noutput \"p\" = %p\n",
    ];
    for (k, text) in programs.iter().enumerate() {
        let graph = kfuse_ir::text::parse_graph(text).unwrap();
        for seed in 0..3 {
            let mut rng = Rng::new(1000 * k as u64 + seed);
            let inputs: Vec<(String, Array)> = graph
                .inputs()
                .map(|(_, n, t)| (n.to_string(), random_array(&mut rng, t)))
                .collect();
            assert!(
                check(seed, &graph, &inputs).unwrap_or_else(|e| panic!("program {k}: {e}")),
                "program {k} should run"
            );
        }
    }
}
