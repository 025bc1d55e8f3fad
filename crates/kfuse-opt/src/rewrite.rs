//! Rebuilding a graph node by node with some nodes replaced.

use kfuse_ir::{Graph, IrError, NodeId, Op, Value};

use crate::OptError;

/// Copies `graph` in order. For each node, `replace(new_graph, old_id, mapped_operands)` may
/// return an op to add in its place (with no operands, such as a constant); otherwise the node
/// is copied. Returns `None` if nothing was replaced.
pub fn rebuild(
    pass: &'static str,
    graph: &Graph,
    mut replace: impl FnMut(&Graph, NodeId, &[Value]) -> Result<Option<Op>, OptError>,
) -> Result<Option<Graph>, OptError> {
    let invalid = |error: IrError| OptError::Invalid { pass, error };
    let mut out = Graph::new();
    let mut map: Vec<NodeId> = Vec::with_capacity(graph.nodes().len());
    let mut changed = false;
    for id in graph.node_ids() {
        let node = graph.node(id);
        let operands: Vec<Value> = node
            .operands
            .iter()
            .map(|v| Value {
                node: map[v.node.index()],
                result: v.result,
            })
            .collect();
        let new_id = match replace(&out, id, &operands)? {
            Some(op) => {
                changed = true;
                out.add_node(op, Vec::new()).map_err(invalid)?
            }
            None => out.add_node(node.op.clone(), operands).map_err(invalid)?,
        };
        map.push(new_id);
    }
    if !changed {
        return Ok(None);
    }
    for o in graph.outputs() {
        out.add_output(
            o.name.clone(),
            Value {
                node: map[o.value.node.index()],
                result: o.value.result,
            },
        )
        .map_err(invalid)?;
    }
    Ok(Some(out))
}

/// The nodes of `graph` marked in `keep`, in order, with the outputs (which must be kept).
pub fn keep(graph: &Graph, keep: &[bool]) -> Result<Graph, IrError> {
    let mut out = Graph::new();
    let mut map = vec![NodeId(u32::MAX); keep.len()];
    let moved = |map: &[NodeId], v: Value| Value {
        node: map[v.node.index()],
        result: v.result,
    };
    for id in graph.node_ids().filter(|id| keep[id.index()]) {
        let node = graph.node(id);
        let operands = node.operands.iter().map(|v| moved(&map, *v)).collect();
        map[id.index()] = out.add_node(node.op.clone(), operands)?;
    }
    for o in graph.outputs() {
        out.add_output(o.name.clone(), moved(&map, o.value))?;
    }
    Ok(out)
}
