//! Text to graph.

use std::collections::HashMap;
use std::fmt;

use super::lex::{lex, Pos, Tok};
use super::{op_from_text, Attr, AttrReader};
use crate::{Array, DType, Graph, Shape, Storage, TensorType, Value};

/// A parse or type error at a source position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    pub line: u32,
    pub col: u32,
    pub message: String,
}

impl ParseError {
    /// The error prefixed with a file name, as `file:line:col: message`.
    pub fn in_file(&self, path: &str) -> String {
        format!("{path}:{}:{}: {}", self.line, self.col, self.message)
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.line, self.col, self.message)
    }
}

impl std::error::Error for ParseError {}

/// The deepest nesting of attribute lists the parser accepts.
const MAX_LIST_DEPTH: usize = 8;

/// Constants written in text are limited to this many bytes once expanded. A splat costs
/// nothing until it runs, but the graph passes may compute on a constant's elements, so the
/// bound keeps a few bytes of text from costing more than this at compile time.
const MAX_CONSTANT_BYTES: usize = 1 << 30;

/// Parses the `.kf` text form into a verified graph.
pub fn parse_graph(src: &str) -> Result<Graph, ParseError> {
    let toks = lex(src).map_err(|(pos, message)| ParseError {
        line: pos.line,
        col: pos.col,
        message,
    })?;
    let mut parser = Parser {
        toks,
        at: 0,
        graph: Graph::new(),
        names: HashMap::new(),
    };
    parser.program()?;
    Ok(parser.graph)
}

struct Parser {
    toks: Vec<(Tok, Pos)>,
    at: usize,
    graph: Graph,
    /// User value names: a name bound by a single-name definition names the node (`%a`, `%a#k`);
    /// one bound by a multi-name definition (`%v, %i = topk(...)`) names one result.
    names: HashMap<String, (crate::NodeId, Option<u32>)>,
}

type PResult<T> = Result<T, ParseError>;

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.at].0
    }

    fn pos(&self) -> Pos {
        self.toks[self.at].1
    }

    fn next(&mut self) -> (Tok, Pos) {
        let t = self.toks[self.at].clone();
        if self.at + 1 < self.toks.len() {
            self.at += 1;
        }
        t
    }

    fn err_at<T>(&self, pos: Pos, message: impl Into<String>) -> PResult<T> {
        Err(ParseError {
            line: pos.line,
            col: pos.col,
            message: message.into(),
        })
    }

    fn expected<T>(&self, what: &str) -> PResult<T> {
        self.err_at(
            self.pos(),
            format!("expected {what}, found {}", self.peek()),
        )
    }

    fn punct(&mut self, c: char) -> PResult<()> {
        if *self.peek() == Tok::Punct(c) {
            self.next();
            Ok(())
        } else {
            self.expected(&format!("`{c}`"))
        }
    }

    fn eat(&mut self, c: char) -> bool {
        if *self.peek() == Tok::Punct(c) {
            self.next();
            true
        } else {
            false
        }
    }

    fn program(&mut self) -> PResult<()> {
        loop {
            match self.peek().clone() {
                Tok::Eof => return Ok(()),
                Tok::Ident(kw) if kw == "output" => self.output()?,
                Tok::Value(..) => self.statement()?,
                _ => {
                    return self
                        .expected("a statement (`%name = op(...)` or `output \"name\" = %value`)")
                }
            }
        }
    }

    fn output(&mut self) -> PResult<()> {
        let pos = self.pos();
        self.next();
        let name = match self.next() {
            (Tok::Str(s), _) => s,
            (t, p) => {
                return self.err_at(
                    p,
                    format!("expected the output's name as a quoted string, found {t}"),
                )
            }
        };
        self.punct('=')?;
        let value = self.value_ref()?;
        self.graph.add_output(name, value).map_err(|e| ParseError {
            line: pos.line,
            col: pos.col,
            message: e.to_string(),
        })
    }

    fn value_ref(&mut self) -> PResult<Value> {
        match self.next() {
            (Tok::Value(name, result), pos) => {
                let (node, bound) = match self.names.get(&name) {
                    Some(&n) => n,
                    None => {
                        return self
                            .err_at(pos, format!("`%{name}` is not defined before this use"))
                    }
                };
                let result = match (bound, result) {
                    (Some(_), Some(_)) => {
                        return self.err_at(
                            pos,
                            format!("`%{name}` names a single result and cannot be indexed"),
                        )
                    }
                    (Some(r), None) => r,
                    (None, r) => r.unwrap_or(0),
                };
                let n_results = self.graph.node(node).types.len() as u32;
                if result >= n_results {
                    return self.err_at(
                        pos,
                        format!("`%{name}` has {n_results} result(s); #{result} does not exist"),
                    );
                }
                Ok(Value { node, result })
            }
            (t, pos) => self.err_at(pos, format!("expected a value (`%name`), found {t}")),
        }
    }

    fn statement(&mut self) -> PResult<()> {
        let start = self.pos();
        let mut defs = Vec::new();
        loop {
            match self.next() {
                (Tok::Value(name, None), pos) => defs.push((name, pos)),
                (t, pos) => {
                    return self.err_at(pos, format!("expected a value name to define, found {t}"))
                }
            }
            if !self.eat(',') {
                break;
            }
        }
        self.punct('=')?;
        let (op_name, op_pos) = match self.next() {
            (Tok::Ident(s), p) => (s, p),
            (t, p) => return self.err_at(p, format!("expected an op name, found {t}")),
        };
        self.punct('(')?;
        let mut operands = Vec::new();
        if !self.eat(')') {
            loop {
                operands.push(self.value_ref()?);
                if self.eat(')') {
                    break;
                }
                self.punct(',')?;
            }
        }
        let mut attrs = Vec::new();
        // An attribute is `key=value`; the lookahead keeps a following `output` statement out.
        while let Tok::Ident(key) = self.peek().clone() {
            if self.toks.get(self.at + 1).map(|t| &t.0) != Some(&Tok::Punct('=')) {
                break;
            }
            self.next();
            self.punct('=')?;
            attrs.push((key, self.attr_value(0)?));
        }
        let mut types = Vec::new();
        let annotation_pos = self.pos();
        if self.eat(':') {
            loop {
                types.push(self.tensor_type()?);
                if !self.eat(',') {
                    break;
                }
            }
        }
        let mut reader = AttrReader::new(&op_name, attrs);
        let op = op_from_text(&op_name, &mut reader, &types).map_err(|m| ParseError {
            line: op_pos.line,
            col: op_pos.col,
            message: m,
        })?;
        reader.finish().map_err(|m| ParseError {
            line: op_pos.line,
            col: op_pos.col,
            message: m,
        })?;
        let declared = op.declared_types().is_some();
        let node = self.graph.add_node(op, operands).map_err(|e| {
            let message = match e {
                crate::IrError::Type { op, error, .. } => {
                    format!("`%{}` ({op}): {error}", defs[0].0)
                }
                other => other.to_string(),
            };
            ParseError {
                line: start.line,
                col: start.col,
                message,
            }
        })?;
        let inferred = &self.graph.node(node).types;
        if !declared && !types.is_empty() && &types != inferred {
            let list = |ts: &[TensorType]| {
                ts.iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return self.err_at(
                annotation_pos,
                format!(
                    "annotated type {} but `%{}` has type {}",
                    list(&types),
                    defs[0].0,
                    list(inferred)
                ),
            );
        }
        if defs.len() != 1 && defs.len() != inferred.len() {
            return self.err_at(
                start,
                format!(
                    "{} names defined but {op_name} has {} results",
                    defs.len(),
                    inferred.len()
                ),
            );
        }
        let n_defs = defs.len();
        for (i, (name, pos)) in defs.into_iter().enumerate() {
            if self.names.contains_key(&name) {
                return self.err_at(pos, format!("`%{name}` is defined twice"));
            }
            let bound = if n_defs == 1 { None } else { Some(i as u32) };
            self.names.insert(name, (node, bound));
        }
        Ok(())
    }

    fn attr_value(&mut self, depth: usize) -> PResult<Attr> {
        // Lists nest for no op deeper than one level; the cap keeps hostile input from
        // exhausting the stack.
        if depth > MAX_LIST_DEPTH {
            return self.err_at(
                self.pos(),
                format!("attribute lists nest deeper than {MAX_LIST_DEPTH} levels"),
            );
        }
        match self.next() {
            (Tok::Num(s), _) => Ok(Attr::Num(s)),
            (Tok::Ident(s), _) => Ok(Attr::Ident(s)),
            (Tok::Str(s), _) => Ok(Attr::Str(s)),
            (Tok::Punct('['), _) => {
                let mut items = Vec::new();
                if self.eat(']') {
                    return Ok(Attr::List(items));
                }
                loop {
                    items.push(self.attr_value(depth + 1)?);
                    if self.eat(']') {
                        return Ok(Attr::List(items));
                    }
                    self.punct(',')?;
                }
            }
            (t, pos) => self.err_at(pos, format!("expected an attribute value, found {t}")),
        }
    }

    fn tensor_type(&mut self) -> PResult<TensorType> {
        let (dtype, pos) = match self.next() {
            (Tok::Ident(s), pos) => (s, pos),
            (t, pos) => {
                return self.err_at(
                    pos,
                    format!("expected a type such as `f32[2, 3]`, found {t}"),
                )
            }
        };
        let dtype = match DType::from_name(&dtype) {
            Some(d) => d,
            None => {
                return self.err_at(
                    pos,
                    format!(
                    "unknown dtype `{dtype}` (expected f32, f64, f16, bf16, i32, i64, u8 or bool)"
                ),
                )
            }
        };
        self.punct('[')?;
        let mut dims = Vec::new();
        if !self.eat(']') {
            loop {
                match self.next() {
                    (Tok::Num(s), p) => match s.parse::<usize>() {
                        Ok(d) => dims.push(d),
                        Err(_) => {
                            return self.err_at(
                                p,
                                format!(
                                    "expected a dimension (a non-negative integer), found `{s}`"
                                ),
                            )
                        }
                    },
                    (t, p) => return self.err_at(p, format!("expected a dimension, found {t}")),
                }
                if self.eat(']') {
                    break;
                }
                self.punct(',')?;
            }
        }
        if dims.len() > crate::shape::MAX_RANK {
            return self.err_at(
                pos,
                format!(
                    "rank {} exceeds the maximum of {}",
                    dims.len(),
                    crate::shape::MAX_RANK
                ),
            );
        }
        Ok(TensorType {
            dtype,
            shape: Shape::new(dims),
        })
    }
}

/// Parses a float literal: decimal, `inf`, `-inf`, `nan`.
pub fn parse_f64(s: &str) -> Option<f64> {
    match s {
        "nan" | "-nan" | "+nan" => Some(f64::NAN),
        "inf" | "+inf" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        _ if s
            .bytes()
            .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) =>
        {
            s.parse().ok()
        }
        _ => None,
    }
}

fn parse_f32(s: &str) -> Option<f32> {
    match s {
        "nan" | "-nan" | "+nan" => Some(f32::NAN),
        "inf" | "+inf" => Some(f32::INFINITY),
        "-inf" => Some(f32::NEG_INFINITY),
        _ if s
            .bytes()
            .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) =>
        {
            s.parse().ok()
        }
        _ => None,
    }
}

/// A constant's `value` attribute read as an array of type `ty`.
pub(crate) fn array_from_attr(attr: &Attr, ty: &TensorType) -> Result<Array, String> {
    let n = ty
        .shape
        .checked_n_elems()
        .filter(|n| n.saturating_mul(ty.dtype.size_bytes()) <= MAX_CONSTANT_BYTES)
        .ok_or_else(|| format!("constant of type {ty} is larger than the 1 GiB allowed in text"))?;
    let items: Vec<&Attr> = match attr {
        Attr::List(items) => items.iter().collect(),
        single => vec![single],
    };
    let splat = !matches!(attr, Attr::List(_));
    if !splat && items.len() != n {
        return Err(format!(
            "constant of type {ty} needs {n} values, found {}",
            items.len()
        ));
    }
    let text = |a: &Attr| -> Result<String, String> {
        match a {
            Attr::Num(s) | Attr::Ident(s) => Ok(s.clone()),
            other => Err(format!(
                "expected a number in a constant, found {}",
                super::print::attr_text(other)
            )),
        }
    };
    let texts = items.into_iter().map(text).collect::<Result<Vec<_>, _>>()?;
    let bad = |s: &str| format!("`{s}` is not a valid {} value", ty.dtype);
    fn conv<T: Clone>(
        texts: &[String],
        f: impl Fn(&str) -> Option<T>,
        bad: &dyn Fn(&str) -> String,
    ) -> Result<Vec<T>, String> {
        texts.iter().map(|s| f(s).ok_or_else(|| bad(s))).collect()
    }
    let storage = match ty.dtype {
        DType::F32 => Storage::F32(conv(&texts, parse_f32, &bad)?),
        DType::F64 => Storage::F64(conv(&texts, parse_f64, &bad)?),
        DType::F16 => Storage::F16(conv(
            &texts,
            |s| parse_f32(s).map(half::f16::from_f32),
            &bad,
        )?),
        DType::BF16 => Storage::BF16(conv(
            &texts,
            |s| parse_f32(s).map(half::bf16::from_f32),
            &bad,
        )?),
        DType::I32 => Storage::I32(conv(&texts, |s| s.parse().ok(), &bad)?),
        DType::I64 => Storage::I64(conv(&texts, |s| s.parse().ok(), &bad)?),
        DType::U8 => Storage::U8(conv(&texts, |s| s.parse().ok(), &bad)?),
        DType::Bool => Storage::Bool(conv(
            &texts,
            |s| match s {
                "true" => Some(true),
                "false" => Some(false),
                _ => None,
            },
            &bad,
        )?),
    };
    if splat {
        // One value stands for the whole shape: the array keeps just that value.
        return crate::with_storage!(storage, v => Array::splat(ty.shape.clone(), v[0]))
            .map_err(|e| e.to_string());
    }
    Array::new(ty.shape.clone(), storage).map_err(|e| e.to_string())
}
