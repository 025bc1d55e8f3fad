//! The kernel text form. A kernel prints as a header, its arguments, and one line per
//! instruction; parsing the text gives back an equal kernel.
//!
//! ```text
//! kernel k0 outer=[64] inner=[128]
//! arg 0 : f32[64, 128] read
//! arg 1 : f32[64, 128] write
//! %0 = inner_index() : i64
//! %1 = outer_index() : i64
//! %2 = const() value=128 : i64
//! %3 = imul(%1, %2) : i64
//! %4 = iadd(%3, %0) : i64
//! %5 = load(%4) arg=0 : f32
//! %6 = reduce(%5) op=reduce_max : f32
//! %7 = sub(%5, %6) : f32
//! store(%4, %7) arg=1 : f32
//! ```

use std::fmt::Write;

use kfuse_ir::text::lex::{lex, Pos, Tok};
use kfuse_ir::text::{float_text, parse_f64};
use kfuse_ir::{BinaryOp, CompareOp, DType, ReduceOp, Shape, TensorType, UnaryOp};

use crate::ir::{Access, Arg, IndexOp, Inst, InstId, InstKind, Kernel};

fn const_text(bits: u64, dtype: DType) -> String {
    match dtype {
        DType::F32 => float_text(f32::from_bits(bits as u32)),
        DType::F64 => float_text(f64::from_bits(bits)),
        DType::F16 => float_text(kfuse_ir::f16::from_bits(bits as u16).to_f32()),
        DType::BF16 => float_text(kfuse_ir::bf16::from_bits(bits as u16).to_f32()),
        DType::I32 => (bits as u32 as i32).to_string(),
        DType::I64 => (bits as i64).to_string(),
        DType::U8 => (bits as u8).to_string(),
        DType::Bool => (bits != 0).to_string(),
    }
}

fn const_bits(text: &str, dtype: DType) -> Option<u64> {
    Some(match dtype {
        DType::F32 => (parse_f64(text)? as f32).to_bits() as u64,
        DType::F64 => parse_f64(text)?.to_bits(),
        DType::F16 => kfuse_ir::f16::from_f32(parse_f64(text)? as f32).to_bits() as u64,
        DType::BF16 => kfuse_ir::bf16::from_f32(parse_f64(text)? as f32).to_bits() as u64,
        DType::I32 => text.parse::<i32>().ok()? as u32 as u64,
        DType::I64 => text.parse::<i64>().ok()? as u64,
        DType::U8 => text.parse::<u8>().ok()? as u64,
        DType::Bool => match text {
            "true" => 1,
            "false" => 0,
            _ => return None,
        },
    })
}

fn dims(d: &[usize]) -> String {
    Shape::new(d.to_vec()).to_string()
}

/// Prints a kernel in the text form.
pub fn print_kernel(kernel: &Kernel) -> String {
    let mut s = String::new();
    writeln!(
        s,
        "kernel {} outer={} inner={}",
        kernel.name,
        dims(&kernel.outer),
        dims(&kernel.inner)
    )
    .unwrap();
    for (i, arg) in kernel.args.iter().enumerate() {
        let access = match arg.access {
            Access::Read => "read",
            Access::Write => "write",
        };
        writeln!(s, "arg {i} : {} {access}", arg.ty).unwrap();
    }
    for (i, inst) in kernel.insts.iter().enumerate() {
        let ops = |ids: &[InstId]| {
            ids.iter()
                .map(|o| format!("%{}", o.0))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (name, operands, attr) = match inst.kind {
            InstKind::OuterIndex => ("outer_index".to_string(), vec![], String::new()),
            InstKind::InnerIndex => ("inner_index".to_string(), vec![], String::new()),
            InstKind::Const(bits) => (
                "const".to_string(),
                vec![],
                format!(" value={}", const_text(bits, inst.dtype)),
            ),
            InstKind::Index(op, a, b) => (op.name().to_string(), vec![a, b], String::new()),
            InstKind::Unary(u, a) => (u.name().to_string(), vec![a], String::new()),
            InstKind::Binary(b, x, y) => (b.name().to_string(), vec![x, y], String::new()),
            InstKind::Compare(c, x, y) => (c.name().to_string(), vec![x, y], String::new()),
            InstKind::Select(c, x, y) => ("select".to_string(), vec![c, x, y], String::new()),
            InstKind::Cast(a) => ("cast".to_string(), vec![a], String::new()),
            InstKind::Load { arg, offset } => {
                ("load".to_string(), vec![offset], format!(" arg={arg}"))
            }
            InstKind::Reduce { op, value } => (
                "reduce".to_string(),
                vec![value],
                format!(" op={}", op.name()),
            ),
            InstKind::Store { arg, offset, value } => (
                "store".to_string(),
                vec![offset, value],
                format!(" arg={arg}"),
            ),
        };
        if matches!(inst.kind, InstKind::Store { .. }) {
            writeln!(s, "{name}({}){attr} : {}", ops(&operands), inst.dtype).unwrap();
        } else {
            writeln!(
                s,
                "%{i} = {name}({}){attr} : {}",
                ops(&operands),
                inst.dtype
            )
            .unwrap();
        }
    }
    s
}

/// A kernel text error with its position.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{col}: {message}")]
pub struct KernelParseError {
    pub line: u32,
    pub col: u32,
    pub message: String,
}

struct P {
    toks: Vec<(Tok, Pos)>,
    at: usize,
}

impl P {
    fn peek(&self) -> &Tok {
        &self.toks[self.at].0
    }
    fn next(&mut self) -> (Tok, Pos) {
        let t = self.toks[self.at].clone();
        if self.at + 1 < self.toks.len() {
            self.at += 1;
        }
        t
    }
    fn fail<T>(&self, pos: Pos, m: impl Into<String>) -> Result<T, KernelParseError> {
        Err(KernelParseError {
            line: pos.line,
            col: pos.col,
            message: m.into(),
        })
    }
    fn expect(&mut self, want: Tok) -> Result<(), KernelParseError> {
        let (t, p) = self.next();
        if t == want {
            Ok(())
        } else {
            self.fail(p, format!("expected {want}, found {t}"))
        }
    }
    fn ident(&mut self) -> Result<String, KernelParseError> {
        match self.next() {
            (Tok::Ident(s), _) => Ok(s),
            (t, p) => self.fail(p, format!("expected a name, found {t}")),
        }
    }
    fn number(&mut self) -> Result<usize, KernelParseError> {
        match self.next() {
            (Tok::Num(s), p) => s
                .parse()
                .or_else(|_| self.fail(p, format!("expected a non-negative integer, found `{s}`"))),
            (t, p) => self.fail(p, format!("expected a number, found {t}")),
        }
    }
    fn dims(&mut self) -> Result<Vec<usize>, KernelParseError> {
        self.expect(Tok::Punct('['))?;
        let mut d = Vec::new();
        if *self.peek() == Tok::Punct(']') {
            self.next();
            return Ok(d);
        }
        loop {
            d.push(self.number()?);
            match self.next() {
                (Tok::Punct(']'), _) => return Ok(d),
                (Tok::Punct(','), _) => {}
                (t, p) => return self.fail(p, format!("expected `,` or `]`, found {t}")),
            }
        }
    }
    fn dtype(&mut self) -> Result<DType, KernelParseError> {
        let pos = self.toks[self.at].1;
        let name = self.ident()?;
        DType::from_name(&name)
            .map_or_else(|| self.fail(pos, format!("unknown dtype `{name}`")), Ok)
    }
    fn keyword(&mut self, word: &str) -> Result<(), KernelParseError> {
        let pos = self.toks[self.at].1;
        let got = self.ident()?;
        if got == word {
            Ok(())
        } else {
            self.fail(pos, format!("expected `{word}`, found `{got}`"))
        }
    }
}

/// Parses one kernel in the text form.
pub fn parse_kernel(text: &str) -> Result<Kernel, KernelParseError> {
    let toks = lex(text).map_err(|(p, m)| KernelParseError {
        line: p.line,
        col: p.col,
        message: m,
    })?;
    let mut p = P { toks, at: 0 };
    p.keyword("kernel")?;
    let name = p.ident()?;
    p.keyword("outer")?;
    p.expect(Tok::Punct('='))?;
    let outer = p.dims()?;
    p.keyword("inner")?;
    p.expect(Tok::Punct('='))?;
    let inner = p.dims()?;
    let mut args = Vec::new();
    while *p.peek() == Tok::Ident("arg".into()) {
        p.next();
        let pos = p.toks[p.at].1;
        if p.number()? != args.len() {
            return p.fail(pos, "arguments are numbered 0, 1, ... in order");
        }
        p.expect(Tok::Punct(':'))?;
        let dtype = p.dtype()?;
        let shape = p.dims()?;
        let pos = p.toks[p.at].1;
        let access = match p.ident()?.as_str() {
            "read" => Access::Read,
            "write" => Access::Write,
            other => return p.fail(pos, format!("expected read or write, found `{other}`")),
        };
        args.push(Arg {
            ty: TensorType::new(dtype, shape),
            access,
        });
    }
    let mut insts: Vec<Inst> = Vec::new();
    loop {
        let (tok, pos) = p.next();
        let (is_store, op_name) = match tok {
            Tok::Eof => break,
            Tok::Value(name, None) => {
                if name != insts.len().to_string() {
                    return p.fail(
                        pos,
                        format!(
                            "expected `%{}` (instructions are numbered in order)",
                            insts.len()
                        ),
                    );
                }
                p.expect(Tok::Punct('='))?;
                (false, p.ident()?)
            }
            Tok::Ident(s) if s == "store" => (true, s),
            t => return p.fail(pos, format!("expected an instruction, found {t}")),
        };
        p.expect(Tok::Punct('('))?;
        let mut operands = Vec::new();
        if *p.peek() == Tok::Punct(')') {
            p.next();
        } else {
            loop {
                match p.next() {
                    (Tok::Value(n, None), vp) => match n.parse::<u32>() {
                        Ok(i) if (i as usize) < insts.len() => operands.push(InstId(i)),
                        _ => return p.fail(vp, format!("`%{n}` is not an earlier instruction")),
                    },
                    (t, tp) => return p.fail(tp, format!("expected an operand, found {t}")),
                }
                match p.next() {
                    (Tok::Punct(')'), _) => break,
                    (Tok::Punct(','), _) => {}
                    (t, tp) => return p.fail(tp, format!("expected `,` or `)`, found {t}")),
                }
            }
        }
        let mut attr: Option<(String, Tok, Pos)> = None;
        if let Tok::Ident(key) = p.peek().clone() {
            p.next();
            p.expect(Tok::Punct('='))?;
            let (v, vp) = p.next();
            attr = Some((key, v, vp));
        }
        p.expect(Tok::Punct(':'))?;
        let dtype = p.dtype()?;
        let n = operands.len();
        let arity = |want: usize| -> Result<(), KernelParseError> {
            if n == want {
                Ok(())
            } else {
                Err(KernelParseError {
                    line: pos.line,
                    col: pos.col,
                    message: format!("{op_name} takes {want} operand(s), found {n}"),
                })
            }
        };
        let attr_num = |attr: &Option<(String, Tok, Pos)>,
                        key: &str|
         -> Result<u32, KernelParseError> {
            match attr {
                Some((k, Tok::Num(v), vp)) if k == key => v.parse().map_err(|_| KernelParseError {
                    line: vp.line,
                    col: vp.col,
                    message: format!("bad {key}"),
                }),
                _ => Err(KernelParseError {
                    line: pos.line,
                    col: pos.col,
                    message: format!("{op_name} needs `{key}=N`"),
                }),
            }
        };
        let kind = if is_store {
            arity(2)?;
            InstKind::Store {
                arg: attr_num(&attr, "arg")?,
                offset: operands[0],
                value: operands[1],
            }
        } else if let Some(op) = IndexOp::from_name(&op_name) {
            arity(2)?;
            InstKind::Index(op, operands[0], operands[1])
        } else if let Some(u) = UnaryOp::from_name(&op_name) {
            arity(1)?;
            InstKind::Unary(u, operands[0])
        } else if let Some(b) = BinaryOp::from_name(&op_name) {
            arity(2)?;
            InstKind::Binary(b, operands[0], operands[1])
        } else if let Some(c) = CompareOp::from_name(&op_name) {
            arity(2)?;
            InstKind::Compare(c, operands[0], operands[1])
        } else {
            match op_name.as_str() {
                "outer_index" => InstKind::OuterIndex,
                "inner_index" => InstKind::InnerIndex,
                "select" => {
                    arity(3)?;
                    InstKind::Select(operands[0], operands[1], operands[2])
                }
                "cast" => {
                    arity(1)?;
                    InstKind::Cast(operands[0])
                }
                "load" => {
                    arity(1)?;
                    InstKind::Load {
                        arg: attr_num(&attr, "arg")?,
                        offset: operands[0],
                    }
                }
                "reduce" => {
                    arity(1)?;
                    let op = match &attr {
                        Some((k, Tok::Ident(v), _)) if k == "op" => ReduceOp::from_name(v),
                        _ => None,
                    };
                    let Some(op) = op else {
                        return p.fail(pos, "reduce needs `op=reduce_sum` (or another reduction)");
                    };
                    InstKind::Reduce {
                        op,
                        value: operands[0],
                    }
                }
                "const" => {
                    let bits = match &attr {
                        Some((k, Tok::Num(v) | Tok::Ident(v), _)) if k == "value" => {
                            const_bits(v, dtype)
                        }
                        _ => None,
                    };
                    let Some(bits) = bits else {
                        return p.fail(
                            pos,
                            format!("const needs a `value=` that is a valid {dtype}"),
                        );
                    };
                    InstKind::Const(bits)
                }
                other => return p.fail(pos, format!("unknown instruction `{other}`")),
            }
        };
        insts.push(Inst { kind, dtype });
    }
    let kernel = Kernel {
        name,
        outer,
        inner,
        args,
        insts,
    };
    kernel.verify().map_err(|message| KernelParseError {
        line: 1,
        col: 1,
        message,
    })?;
    Ok(kernel)
}
