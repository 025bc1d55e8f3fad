//! Partition tests as text: each file in `tests/partition` is a program whose first line names
//! the policy (`# partition: cost|greedy|none`); the expected partition follows the marker.
//! Partitions use the deterministic `FixedCostModel`. Re-bless with `KFUSE_BLESS=1`.

use std::path::Path;

use kfuse_fusion::{partition, print_partition, FixedCostModel, FusePolicy};
use kfuse_ir::text::parse_graph;

#[test]
fn partitions() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/partition");
    let n = kfuse_testkit::run_filetests(&dir, |header, input| {
        let policy = header
            .strip_prefix("# partition: ")
            .and_then(FusePolicy::from_name)
            .ok_or_else(|| format!("bad header {header:?}"))?;
        let graph = parse_graph(input).map_err(|e| e.to_string())?;
        Ok(print_partition(
            &graph,
            &partition(&graph, policy, &FixedCostModel::default()),
        ))
    });
    assert!(n >= 15);
}
