//! Rebuilding a graph node by node: the one mechanism every pass uses to copy, replace and drop
//! nodes.

use kfuse_ir::{Graph, IrError, NodeId, Op, TensorType, Value};

use crate::OptError;

/// Builds a new graph from an old one node by node: a pass copies the nodes it keeps, adds
/// replacements for the ones it rewrites, and maps each old result to its new value.
pub struct Rewriter<'g> {
    pass: &'static str,
    graph: &'g Graph,
    out: Graph,
    map: Vec<Option<Value>>,
}

impl<'g> Rewriter<'g> {
    pub fn new(pass: &'static str, graph: &'g Graph) -> Rewriter<'g> {
        Rewriter {
            pass,
            graph,
            out: Graph::new(),
            map: vec![None; graph.nodes().len()],
        }
    }

    fn invalid(&self, error: IrError) -> OptError {
        OptError::Invalid {
            pass: self.pass,
            error,
        }
    }

    /// The new value of an old one (whose node was copied or replaced already).
    pub fn moved(&self, v: Value) -> Value {
        let m = self.map[v.node.index()].expect("operands are mapped before use");
        Value {
            node: m.node,
            result: v.result,
        }
    }

    /// The op that now computes old value `v` (a constant, for instance, once folded).
    pub fn new_op(&self, v: Value) -> &Op {
        &self.out.node(self.moved(v).node).op
    }

    /// The type of new value `v`.
    pub fn ty(&self, v: Value) -> &TensorType {
        self.out.ty(v)
    }

    /// Adds a new node.
    pub fn add(&mut self, op: Op, operands: Vec<Value>) -> Result<Value, OptError> {
        self.out.add(op, operands).map_err(|e| self.invalid(e))
    }

    /// Copies old node `id` with its operands mapped.
    pub fn copy(&mut self, id: NodeId) -> Result<(), OptError> {
        let node = self.graph.node(id);
        let operands = node.operands.iter().map(|v| self.moved(*v)).collect();
        let new_id = self
            .out
            .add_node(node.op.clone(), operands)
            .map_err(|e| self.invalid(e))?;
        self.map[id.index()] = Some(Value::of(new_id));
        Ok(())
    }

    /// Records that old node `id`'s result is now `value`.
    pub fn replace(&mut self, id: NodeId, value: Value) {
        self.map[id.index()] = Some(value);
    }

    /// The new graph, with the old graph's outputs mapped.
    pub fn finish(mut self) -> Result<Graph, OptError> {
        for o in self.graph.outputs() {
            let v = self.moved(o.value);
            self.out
                .add_output(o.name.clone(), v)
                .map_err(|e| OptError::Invalid {
                    pass: self.pass,
                    error: e,
                })?;
        }
        Ok(self.out)
    }
}
