//! Graph to text.

use std::fmt::Write;

use super::{attrs_of, Attr};
use crate::{bf16, f16, Array, DType, Graph, Value};

/// Prints a graph in the `.kf` text form. Parsing the result gives an equal graph.
pub fn print_graph(graph: &Graph) -> String {
    let mut out = String::new();
    for id in graph.node_ids() {
        let node = graph.node(id);
        let operands: Vec<String> = node.operands.iter().map(|v| value_text(*v)).collect();
        write!(
            out,
            "%{} = {}({})",
            id.0,
            node.op.name(),
            operands.join(", ")
        )
        .unwrap();
        for (key, attr) in attrs_of(&node.op) {
            write!(out, " {key}={}", attr_text(&attr)).unwrap();
        }
        let types: Vec<String> = node.types.iter().map(|t| t.to_string()).collect();
        writeln!(out, " : {}", types.join(", ")).unwrap();
    }
    for output in graph.outputs() {
        writeln!(
            out,
            "output {} = {}",
            quote(&output.name),
            value_text(output.value)
        )
        .unwrap();
    }
    out
}

fn value_text(v: Value) -> String {
    if v.result == 0 {
        format!("%{}", v.node.0)
    } else {
        format!("%{}#{}", v.node.0, v.result)
    }
}

pub fn quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\n' => q.push_str("\\n"),
            '\t' => q.push_str("\\t"),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

pub fn attr_text(attr: &Attr) -> String {
    match attr {
        Attr::Num(s) | Attr::Ident(s) => s.clone(),
        Attr::Str(s) => quote(s),
        Attr::List(items) => {
            let parts: Vec<String> = items.iter().map(attr_text).collect();
            format!("[{}]", parts.join(", "))
        }
    }
}

/// The shortest text that parses back to the same float (`nan`, `inf`, `-inf`, `-0.0`, ...).
pub fn float_text<F: Into<f64> + std::fmt::Debug + Copy>(x: F) -> String {
    let wide: f64 = x.into();
    if wide.is_nan() {
        "nan".into()
    } else if wide.is_infinite() {
        if wide > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{x:?}")
    }
}

/// Element `i` as text, read from its bits so that a splat is never expanded.
fn elem_text(array: &Array, i: usize) -> String {
    let bits = array.get_bits(i);
    match array.dtype() {
        DType::F32 => float_text(f32::from_bits(bits as u32)),
        DType::F64 => float_text(f64::from_bits(bits)),
        DType::F16 => float_text(f16::from_bits(bits as u16).to_f32()),
        DType::BF16 => float_text(bf16::from_bits(bits as u16).to_f32()),
        DType::I32 => (bits as u32 as i32).to_string(),
        DType::I64 => (bits as i64).to_string(),
        DType::U8 => (bits as u8).to_string(),
        DType::Bool => (bits != 0).to_string(),
    }
}

/// A constant's value: one element when all are equal, else the flat row-major list.
pub(crate) fn array_attr(array: &Array) -> Attr {
    let elem = |i| {
        let text = elem_text(array, i);
        if text == "true" || text == "false" {
            Attr::Ident(text)
        } else {
            Attr::Num(text)
        }
    };
    if array.n_elems() > 1 && array.is_splat() {
        elem(0)
    } else {
        Attr::List((0..array.n_elems()).map(elem).collect())
    }
}
