//! The graph: an arena of nodes in topological order.

use std::collections::HashSet;

use crate::{infer, IrError, Op, TensorType};

/// Index of a node in its graph's arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One result of a node. Most nodes have exactly one result (number 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value {
    pub node: NodeId,
    pub result: u32,
}

impl Value {
    /// Result 0 of `node`.
    pub fn of(node: NodeId) -> Value {
        Value { node, result: 0 }
    }
}

/// An op applied to operands, with its inferred result types.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub op: Op,
    pub operands: Vec<Value>,
    pub types: Vec<TensorType>,
}

/// A named graph output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    pub name: String,
    pub value: Value,
}

/// A tensor program. Nodes only refer to earlier nodes, so the arena order is a topological order;
/// every node's types come from [`infer`], so a `Graph` built through [`Graph::add`] is always
/// well typed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    nodes: Vec<Node>,
    outputs: Vec<Output>,
}

impl Graph {
    pub fn new() -> Graph {
        Graph::default()
    }

    /// Appends a node, inferring its result types. Returns its id.
    pub fn add_node(&mut self, op: Op, operands: Vec<Value>) -> Result<NodeId, IrError> {
        let id = u32::try_from(self.nodes.len()).map_err(|_| IrError::TooManyNodes)?;
        if id == u32::MAX {
            return Err(IrError::TooManyNodes);
        }
        for (i, v) in operands.iter().enumerate() {
            if self.try_ty(*v).is_none() {
                return Err(IrError::BadOperand {
                    node: id,
                    op: op.name(),
                    operand: i,
                    target: v.node.0,
                    result: v.result,
                });
            }
        }
        if let Op::Input { name, .. } = &op {
            if self.input_names().any(|n| n == name) {
                return Err(IrError::DuplicateInput(name.clone()));
            }
        }
        let operand_types: Vec<&TensorType> = operands.iter().map(|v| self.ty(*v)).collect();
        let types = infer::infer(&op, &operand_types).map_err(|error| IrError::Type {
            node: id,
            op: op.name(),
            error,
        })?;
        self.nodes.push(Node {
            op,
            operands,
            types,
        });
        Ok(NodeId(id))
    }

    /// Appends a single-result node and returns its value.
    pub fn add(&mut self, op: Op, operands: Vec<Value>) -> Result<Value, IrError> {
        self.add_node(op, operands).map(Value::of)
    }

    /// Marks `value` as an output called `name`.
    pub fn add_output(&mut self, name: impl Into<String>, value: Value) -> Result<(), IrError> {
        let name = name.into();
        if self.outputs.iter().any(|o| o.name == name) {
            return Err(IrError::DuplicateOutput(name));
        }
        if self.try_ty(value).is_none() {
            return Err(IrError::BadOutput {
                name,
                node: value.node.0,
                result: value.result,
            });
        }
        self.outputs.push(Output { name, value });
        Ok(())
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    /// Node ids in topological (arena) order.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    pub fn outputs(&self) -> &[Output] {
        &self.outputs
    }

    /// The type of a value. Panics if the value does not exist; see [`Graph::try_ty`].
    pub fn ty(&self, value: Value) -> &TensorType {
        &self.nodes[value.node.index()].types[value.result as usize]
    }

    /// The type of a value, or `None` if the graph has no such value.
    pub fn try_ty(&self, value: Value) -> Option<&TensorType> {
        self.nodes
            .get(value.node.index())?
            .types
            .get(value.result as usize)
    }

    /// The input nodes, in order, with their names and types.
    pub fn inputs(&self) -> impl Iterator<Item = (NodeId, &str, &TensorType)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| match &n.op {
                Op::Input { name, ty } => Some((NodeId(i as u32), name.as_str(), ty)),
                _ => None,
            })
    }

    fn input_names(&self) -> impl Iterator<Item = &str> {
        self.inputs().map(|(_, name, _)| name)
    }

    /// Checks every invariant: operands defined before use, types equal to inference, unique
    /// input and output names, outputs that exist. A graph built through [`Graph::add_node`]
    /// always passes; this guards graphs rewritten by passes.
    pub fn verify(&self) -> Result<(), IrError> {
        let mut check = Graph::new();
        for node in &self.nodes {
            let id = check.add_node(node.op.clone(), node.operands.clone())?;
            let inferred = &check.nodes[id.index()].types;
            if inferred != &node.types {
                let list = |ts: &[TensorType]| {
                    ts.iter()
                        .map(|t| t.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                return Err(IrError::TypeMismatch {
                    node: id.0,
                    op: node.op.name(),
                    recorded: list(&node.types),
                    inferred: list(inferred),
                });
            }
        }
        let mut names = HashSet::new();
        for out in &self.outputs {
            if !names.insert(out.name.as_str()) {
                return Err(IrError::DuplicateOutput(out.name.clone()));
            }
            if self.try_ty(out.value).is_none() {
                return Err(IrError::BadOutput {
                    name: out.name.clone(),
                    node: out.value.node.0,
                    result: out.value.result,
                });
            }
        }
        Ok(())
    }

    /// The part of this graph that computes `outputs`, with only the nodes they depend on,
    /// renumbered in the same relative order. Inputs nobody reads are dropped too.
    pub fn extract(&self, outputs: &[(String, Value)]) -> Result<Graph, IrError> {
        let mut needed = vec![false; self.nodes.len()];
        for (name, v) in outputs {
            if self.try_ty(*v).is_none() {
                return Err(IrError::BadOutput {
                    name: name.clone(),
                    node: v.node.0,
                    result: v.result,
                });
            }
            needed[v.node.index()] = true;
        }
        for i in (0..self.nodes.len()).rev() {
            if needed[i] {
                for v in &self.nodes[i].operands {
                    needed[v.node.index()] = true;
                }
            }
        }
        let mut remap = vec![NodeId(u32::MAX); self.nodes.len()];
        let mut out = Graph::new();
        let moved = |remap: &[NodeId], v: Value| Value {
            node: remap[v.node.index()],
            result: v.result,
        };
        for (i, node) in self.nodes.iter().enumerate().filter(|(i, _)| needed[*i]) {
            let operands = node.operands.iter().map(|v| moved(&remap, *v)).collect();
            remap[i] = out.add_node(node.op.clone(), operands)?;
        }
        for (name, v) in outputs {
            out.add_output(name.clone(), moved(&remap, *v))?;
        }
        Ok(out)
    }

    /// Direct mutable access for passes. Call [`Graph::verify`] afterwards.
    pub fn nodes_mut(&mut self) -> &mut Vec<Node> {
        &mut self.nodes
    }
}
