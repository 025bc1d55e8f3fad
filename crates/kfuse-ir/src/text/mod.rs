//! The `.kf` text form: every graph prints and parses back to an equal graph.
//!
//! ```text
//! # Row softmax.
//! %x = input() name="x" : f32[4, 8]
//! %m = reduce_max(%x) axes=[1] keepdims=true
//! %d = sub(%x, %m)
//! %e = exp(%d)
//! %s = reduce_sum(%e) axes=[1] keepdims=true
//! %y = div(%e, %s) : f32[4, 8]
//! output "y" = %y
//! ```
//!
//! A statement defines values (`%name`, or `%a, %b` for ops with several results; `%a#1` names
//! result 1) from an op, its operands in parentheses, `key=value` attributes, and an optional
//! `: type, ...` annotation. The annotation is required where the op declares its result types
//! (`input`, `constant`, `iota`, `rng`, `custom`) and checked against inference elsewhere. The
//! printer numbers values by node (`%0`, `%1`, ...) and always writes the types.

pub mod lex;
mod parse;
mod print;

pub use parse::{parse_f64, parse_graph, ParseError};
pub use print::{float_text, print_graph, quote};

use crate::{
    Conv2dAttrs, DType, Layout, Op, PadMode, Pool2dAttrs, PoolKind, RngDist, Shape, TensorType,
};

/// An attribute value as written in the text form.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Attr {
    /// A numeric literal, kept as written so it converts exactly to the target dtype.
    Num(String),
    Ident(String),
    Str(String),
    List(Vec<Attr>),
}

impl Attr {
    fn int(v: usize) -> Attr {
        Attr::Num(v.to_string())
    }
    fn ints(vs: &[usize]) -> Attr {
        Attr::List(vs.iter().map(|&v| Attr::int(v)).collect())
    }
    fn bool(b: bool) -> Attr {
        Attr::Ident(b.to_string())
    }
    fn ident(s: &str) -> Attr {
        Attr::Ident(s.to_string())
    }
}

/// The attributes of `op`, in print order. Declared result types are printed as the annotation.
pub(crate) fn attrs_of(op: &Op) -> Vec<(&'static str, Attr)> {
    match op {
        Op::Input { name, .. } => vec![("name", Attr::Str(name.clone()))],
        Op::Constant { value } => vec![("value", print::array_attr(value))],
        Op::Iota { axis, .. } => vec![("axis", Attr::int(*axis))],
        Op::Rng { dist, seed, .. } => {
            vec![
                ("dist", Attr::ident(dist.name())),
                ("seed", Attr::Num(seed.to_string())),
            ]
        }
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Clamp | Op::MatMul => {
            vec![]
        }
        Op::Cast { to } => vec![("to", Attr::ident(to.name()))],
        Op::Reduce { axes, keepdims, .. } => {
            vec![
                ("axes", Attr::ints(axes)),
                ("keepdims", Attr::bool(*keepdims)),
            ]
        }
        Op::Reshape { shape } => vec![("shape", Attr::ints(shape.dims()))],
        Op::Permute { perm } => vec![("perm", Attr::ints(perm))],
        Op::Broadcast { shape } => vec![("shape", Attr::ints(shape.dims()))],
        Op::Slice { start, stop, step } => vec![
            ("start", Attr::ints(start)),
            ("stop", Attr::ints(stop)),
            ("step", Attr::ints(step)),
        ],
        Op::Pad {
            low,
            high,
            mode,
            value,
        } => vec![
            ("low", Attr::ints(low)),
            ("high", Attr::ints(high)),
            ("mode", Attr::ident(mode.name())),
            ("value", Attr::Num(print::float_text(value.value()))),
        ],
        Op::Concat { axis } => vec![("axis", Attr::int(*axis))],
        Op::Flip { axes } => vec![("axes", Attr::ints(axes))],
        Op::Conv2d(a) => vec![
            ("layout", Attr::ident(a.layout.name())),
            ("stride", Attr::ints(&a.stride)),
            ("padding", Attr::ints(&a.padding)),
            ("dilation", Attr::ints(&a.dilation)),
            ("groups", Attr::int(a.groups)),
        ],
        Op::Pool2d(a) => vec![
            ("kind", Attr::ident(a.kind.name())),
            ("layout", Attr::ident(a.layout.name())),
            ("window", Attr::ints(&a.window)),
            ("stride", Attr::ints(&a.stride)),
            ("padding", Attr::ints(&a.padding)),
            ("dilation", Attr::ints(&a.dilation)),
            ("count_include_pad", Attr::bool(a.count_include_pad)),
        ],
        Op::Gather { axis } | Op::ScatterAdd { axis } => vec![("axis", Attr::int(*axis))],
        Op::Sort { axis, descending } => {
            vec![
                ("axis", Attr::int(*axis)),
                ("descending", Attr::bool(*descending)),
            ]
        }
        Op::TopK { axis, k, largest } => vec![
            ("axis", Attr::int(*axis)),
            ("k", Attr::int(*k)),
            ("largest", Attr::bool(*largest)),
        ],
        Op::Custom { name, .. } => vec![("fn", Attr::Str(name.clone()))],
    }
}

/// Reads attributes by name, remembering which were used so leftovers can be reported.
pub(crate) struct AttrReader<'a> {
    op: &'a str,
    attrs: Vec<(String, Attr, bool)>,
}

impl<'a> AttrReader<'a> {
    pub(crate) fn new(op: &'a str, attrs: Vec<(String, Attr)>) -> Self {
        AttrReader {
            op,
            attrs: attrs.into_iter().map(|(k, v)| (k, v, false)).collect(),
        }
    }

    fn take(&mut self, key: &str) -> Result<Attr, String> {
        let op = self.op;
        let slot = self
            .attrs
            .iter_mut()
            .find(|(k, _, used)| k == key && !*used)
            .ok_or_else(|| format!("{op} needs attribute `{key}`"))?;
        slot.2 = true;
        Ok(slot.1.clone())
    }

    fn has(&self, key: &str) -> bool {
        self.attrs.iter().any(|(k, _, _)| k == key)
    }

    fn bad(&self, key: &str, want: &str, found: &Attr) -> String {
        format!(
            "attribute `{key}` of {}: expected {want}, found {}",
            self.op,
            print::attr_text(found)
        )
    }

    pub(crate) fn usize(&mut self, key: &str) -> Result<usize, String> {
        let a = self.take(key)?;
        match &a {
            Attr::Num(s) => s
                .parse::<usize>()
                .map_err(|_| self.bad(key, "a non-negative integer", &a)),
            _ => Err(self.bad(key, "a non-negative integer", &a)),
        }
    }

    pub(crate) fn u64(&mut self, key: &str) -> Result<u64, String> {
        let a = self.take(key)?;
        match &a {
            Attr::Num(s) => s
                .parse::<u64>()
                .map_err(|_| self.bad(key, "an unsigned 64-bit integer", &a)),
            _ => Err(self.bad(key, "an unsigned 64-bit integer", &a)),
        }
    }

    pub(crate) fn f64(&mut self, key: &str) -> Result<f64, String> {
        let a = self.take(key)?;
        match &a {
            Attr::Num(s) => parse::parse_f64(s).ok_or_else(|| self.bad(key, "a number", &a)),
            _ => Err(self.bad(key, "a number", &a)),
        }
    }

    pub(crate) fn usizes(&mut self, key: &str) -> Result<Vec<usize>, String> {
        let a = self.take(key)?;
        let want = "a list of non-negative integers";
        match &a {
            Attr::List(items) => items
                .iter()
                .map(|item| match item {
                    Attr::Num(s) => s.parse::<usize>().ok(),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| self.bad(key, want, &a)),
            _ => Err(self.bad(key, want, &a)),
        }
    }

    pub(crate) fn array<const N: usize>(&mut self, key: &str) -> Result<[usize; N], String> {
        let v = self.usizes(key)?;
        let n = v.len();
        v.try_into().map_err(|_| {
            format!(
                "attribute `{key}` of {}: expected {N} integers, found {n}",
                self.op
            )
        })
    }

    pub(crate) fn bool(&mut self, key: &str) -> Result<bool, String> {
        let a = self.take(key)?;
        match &a {
            Attr::Ident(s) if s == "true" => Ok(true),
            Attr::Ident(s) if s == "false" => Ok(false),
            _ => Err(self.bad(key, "true or false", &a)),
        }
    }

    pub(crate) fn string(&mut self, key: &str) -> Result<String, String> {
        let a = self.take(key)?;
        match a {
            Attr::Str(s) => Ok(s),
            other => Err(self.bad(key, "a quoted string", &other)),
        }
    }

    pub(crate) fn raw(&mut self, key: &str) -> Result<Attr, String> {
        self.take(key)
    }

    /// An identifier from a fixed set, converted by `from_name`.
    pub(crate) fn name<T>(
        &mut self,
        key: &str,
        from_name: fn(&str) -> Option<T>,
        choices: &str,
    ) -> Result<T, String> {
        let a = self.take(key)?;
        match &a {
            Attr::Ident(s) => from_name(s).ok_or_else(|| self.bad(key, choices, &a)),
            _ => Err(self.bad(key, choices, &a)),
        }
    }

    /// Fails if any attribute was not consumed.
    pub(crate) fn finish(self) -> Result<(), String> {
        match self.attrs.iter().find(|(_, _, used)| !used) {
            Some((k, _, _)) => Err(format!(
                "{} has no attribute `{k}` (or it is given twice)",
                self.op
            )),
            None => Ok(()),
        }
    }
}

/// Builds an op from its text name, attributes and annotated types.
pub(crate) fn op_from_text(
    name: &str,
    attrs: &mut AttrReader,
    types: &[TensorType],
) -> Result<Op, String> {
    let declared = |what: &str| -> Result<TensorType, String> {
        match types {
            [t] => Ok(t.clone()),
            _ => Err(format!(
                "{what} needs exactly one result type annotation (`: f32[2, 3]`)"
            )),
        }
    };
    if let Some(u) = crate::UnaryOp::from_name(name) {
        return Ok(Op::Unary(u));
    }
    if let Some(b) = crate::BinaryOp::from_name(name) {
        return Ok(Op::Binary(b));
    }
    if let Some(c) = crate::CompareOp::from_name(name) {
        return Ok(Op::Compare(c));
    }
    if let Some(op) = crate::ReduceOp::from_name(name) {
        let axes = attrs.usizes("axes")?;
        let keepdims = if attrs.has("keepdims") {
            attrs.bool("keepdims")?
        } else {
            false
        };
        return Ok(Op::Reduce { op, axes, keepdims });
    }
    let layout = |attrs: &mut AttrReader| attrs.name("layout", Layout::from_name, "nchw or nhwc");
    Ok(match name {
        "input" => Op::Input {
            name: attrs.string("name")?,
            ty: declared("input")?,
        },
        "constant" => {
            let ty = declared("constant")?;
            let raw = attrs.raw("value")?;
            Op::Constant {
                value: parse::array_from_attr(&raw, &ty)?,
            }
        }
        "iota" => Op::Iota {
            ty: declared("iota")?,
            axis: attrs.usize("axis")?,
        },
        "rng" => Op::Rng {
            ty: declared("rng")?,
            dist: attrs.name("dist", RngDist::from_name, "uniform or normal")?,
            seed: attrs.u64("seed")?,
        },
        "select" => Op::Select,
        "clamp" => Op::Clamp,
        "matmul" => Op::MatMul,
        "cast" => Op::Cast {
            to: attrs.name("to", DType::from_name, "a dtype name")?,
        },
        "reshape" => Op::Reshape {
            shape: Shape::new(attrs.usizes("shape")?),
        },
        "permute" => Op::Permute {
            perm: attrs.usizes("perm")?,
        },
        "broadcast" => Op::Broadcast {
            shape: Shape::new(attrs.usizes("shape")?),
        },
        "slice" => Op::Slice {
            start: attrs.usizes("start")?,
            stop: attrs.usizes("stop")?,
            step: attrs.usizes("step")?,
        },
        "pad" => Op::Pad {
            low: attrs.usizes("low")?,
            high: attrs.usizes("high")?,
            mode: attrs.name("mode", PadMode::from_name, "constant, edge or reflect")?,
            value: crate::Ieee64::new(if attrs.has("value") {
                attrs.f64("value")?
            } else {
                0.0
            }),
        },
        "concat" => Op::Concat {
            axis: attrs.usize("axis")?,
        },
        "flip" => Op::Flip {
            axes: attrs.usizes("axes")?,
        },
        "conv2d" => Op::Conv2d(Conv2dAttrs {
            layout: layout(attrs)?,
            stride: attrs.array("stride")?,
            padding: attrs.array("padding")?,
            dilation: attrs.array("dilation")?,
            groups: attrs.usize("groups")?,
        }),
        "pool2d" => Op::Pool2d(Pool2dAttrs {
            kind: attrs.name("kind", PoolKind::from_name, "max or avg")?,
            layout: layout(attrs)?,
            window: attrs.array("window")?,
            stride: attrs.array("stride")?,
            padding: attrs.array("padding")?,
            dilation: attrs.array("dilation")?,
            count_include_pad: attrs.bool("count_include_pad")?,
        }),
        "gather" => Op::Gather {
            axis: attrs.usize("axis")?,
        },
        "scatter_add" => Op::ScatterAdd {
            axis: attrs.usize("axis")?,
        },
        "sort" => Op::Sort {
            axis: attrs.usize("axis")?,
            descending: attrs.bool("descending")?,
        },
        "topk" => Op::TopK {
            axis: attrs.usize("axis")?,
            k: attrs.usize("k")?,
            largest: attrs.bool("largest")?,
        },
        "custom" => {
            if types.is_empty() {
                return Err("custom needs its result types annotated (`: f32[4], i64[4]`)".into());
            }
            Op::Custom {
                name: attrs.string("fn")?,
                outputs: types.to_vec(),
            }
        }
        other => return Err(format!("unknown op `{other}`")),
    })
}
