//! Printing then parsing is the identity on random graphs, and no text, however malformed, makes
//! the parser panic.

use kfuse_ir::text::{parse_graph, print_graph};
use kfuse_testkit::{mutate_text, random_graph, Rng};

#[test]
fn print_then_parse_is_the_identity_on_random_graphs() {
    let mut ops_seen = std::collections::BTreeSet::new();
    for seed in 0..1500u64 {
        let graph = random_graph(seed, 24);
        for node in graph.nodes() {
            ops_seen.insert(node.op.name());
        }
        let text = print_graph(&graph);
        let parsed = parse_graph(&text).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{text}"));
        assert!(parsed == graph, "seed {seed}: parsed graph differs\n{text}");
        assert_eq!(
            print_graph(&parsed),
            text,
            "seed {seed}: printing is not stable"
        );
        parsed
            .verify()
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
    // The generator must reach (nearly) the whole op set for this test to mean anything.
    assert!(
        ops_seen.len() >= 60,
        "only {} ops generated: {ops_seen:?}",
        ops_seen.len()
    );
}

#[test]
fn mutated_program_text_never_panics_the_parser() {
    let mut rng = Rng::new(0xF022);
    let mut rejected = 0;
    for seed in 0..400u64 {
        let text = print_graph(&random_graph(seed, 12));
        for _ in 0..10 {
            let mutated = mutate_text(&mut rng, &text);
            match parse_graph(&mutated) {
                Ok(g) => {
                    g.verify().expect("an accepted graph verifies");
                    // Whatever parses must print and parse back to itself.
                    assert!(parse_graph(&print_graph(&g)).unwrap() == g);
                }
                Err(e) => {
                    rejected += 1;
                    assert!(e.line >= 1 && e.col >= 1 && !e.message.is_empty());
                }
            }
        }
    }
    assert!(
        rejected > 1000,
        "mutations should mostly be rejected, got {rejected}"
    );
}

#[test]
fn random_bytes_never_panic_the_parser() {
    let mut rng = Rng::new(7);
    for _ in 0..3000 {
        let len = rng.below(64);
        let bytes: Vec<u8> = (0..len)
            .map(|_| rng.pick(b"%=()[],:#\"abcf3216x0.e-+ \n\tinputconstant"))
            .collect();
        let text = String::from_utf8_lossy(&bytes);
        let _ = parse_graph(&text);
    }
}

#[test]
fn deeply_nested_lists_are_an_error_not_a_stack_overflow() {
    let text = format!(
        "%x = input() name=\"x\" : f32[2]\n%y = reshape(%x) shape={}\n",
        "[".repeat(200_000)
    );
    let err = parse_graph(&text).unwrap_err();
    assert!(err.message.contains("nest deeper than 8 levels"), "{err}");
}
