//! Graph to text.

use std::fmt::Write;

use super::{attrs_of, Attr};
use crate::{Array, Graph, Storage, Value};

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

fn elem_text(array: &Array, i: usize) -> String {
    match array.storage() {
        Storage::F32(v) => float_text(v[i]),
        Storage::F64(v) => float_text(v[i]),
        Storage::F16(v) => float_text(v[i].to_f32()),
        Storage::BF16(v) => float_text(v[i].to_f32()),
        Storage::I32(v) => v[i].to_string(),
        Storage::I64(v) => v[i].to_string(),
        Storage::U8(v) => v[i].to_string(),
        Storage::Bool(v) => v[i].to_string(),
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
