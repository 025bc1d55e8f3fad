//! Partition tests as text: each file in `tests/partition` is a program whose first line names
//! the policy (`# partition: cost|greedy|none`), optionally followed by kernel limits other than
//! the defaults (`instructions=64`, `transcendentals=4`); the expected partition follows the
//! marker. Partitions use the deterministic `FixedCostModel`. Re-bless with `KFUSE_BLESS=1`.

use std::path::Path;

use kfuse_fusion::{partition, print_partition, FixedCostModel, FusePolicy};
use kfuse_ir::text::parse_graph;

/// The policy and cost model a test file's header names.
fn header_settings(header: &str) -> Result<(FusePolicy, FixedCostModel), String> {
    let bad = || format!("bad header {header:?}");
    let mut words = header
        .strip_prefix("# partition: ")
        .ok_or_else(bad)?
        .split(' ');
    let policy = words
        .next()
        .and_then(FusePolicy::from_name)
        .ok_or_else(bad)?;
    let mut cost = FixedCostModel::default();
    for word in words {
        let (key, value) = word.split_once('=').ok_or_else(bad)?;
        let value: usize = value.parse().map_err(|_| bad())?;
        match key {
            "instructions" => cost.limits.instructions = value,
            "transcendentals" => cost.limits.transcendentals = value,
            _ => return Err(bad()),
        }
    }
    Ok((policy, cost))
}

#[test]
fn partitions() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/partition");
    let n = kfuse_testkit::run_filetests(&dir, |header, input| {
        let (policy, cost) = header_settings(header)?;
        let graph = parse_graph(input).map_err(|e| e.to_string())?;
        Ok(print_partition(&graph, &partition(&graph, policy, &cost)))
    });
    assert!(n >= 15);
}
