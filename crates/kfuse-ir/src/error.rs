//! Errors of graph construction and verification.

use std::fmt;

/// Why an op rejects its operands or attributes: which operand (if one is to blame), what was
/// expected and what was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeError {
    /// The operand at fault, counted from 0; `None` when the attributes or the op as a whole are.
    pub operand: Option<usize>,
    pub expected: String,
    pub found: String,
}

impl TypeError {
    pub fn operand(index: usize, expected: impl Into<String>, found: impl fmt::Display) -> Self {
        TypeError {
            operand: Some(index),
            expected: expected.into(),
            found: found.to_string(),
        }
    }

    pub fn attr(expected: impl Into<String>, found: impl fmt::Display) -> Self {
        TypeError {
            operand: None,
            expected: expected.into(),
            found: found.to_string(),
        }
    }
}

impl fmt::Display for TypeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(i) = self.operand {
            write!(f, "operand {i}: ")?;
        }
        write!(f, "expected {}, found {}", self.expected, self.found)
    }
}

/// An invalid graph.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IrError {
    /// An op rejected its operands or attributes.
    #[error("node %{node} ({op}): {error}")]
    Type {
        node: u32,
        op: &'static str,
        error: TypeError,
    },
    /// A node refers to a value that is not defined before it.
    #[error("node %{node} ({op}): operand {operand} refers to %{target}#{result}, which is not defined before it")]
    BadOperand {
        node: u32,
        op: &'static str,
        operand: usize,
        target: u32,
        result: u32,
    },
    /// A node's recorded result types differ from what inference gives.
    #[error("node %{node} ({op}): recorded type {recorded} differs from inferred type {inferred}")]
    TypeMismatch {
        node: u32,
        op: &'static str,
        recorded: String,
        inferred: String,
    },
    /// Two inputs share a name.
    #[error("input name {0:?} is used twice")]
    DuplicateInput(String),
    /// Two outputs share a name.
    #[error("output name {0:?} is used twice")]
    DuplicateOutput(String),
    /// An output names a value that does not exist.
    #[error("output {name:?} refers to %{node}#{result}, which does not exist")]
    BadOutput {
        name: String,
        node: u32,
        result: u32,
    },
    /// The graph has more nodes than ids.
    #[error("graph has more than 2^32 - 1 nodes")]
    TooManyNodes,
}
