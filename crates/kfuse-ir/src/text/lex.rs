//! Tokens of the `.kf` text form, with positions.

use std::fmt;

#[derive(Clone, Debug, PartialEq)]
pub enum Tok {
    /// `%name` with an optional `#k` result index.
    Value(String, Option<u32>),
    Ident(String),
    /// A numeric literal as written (sign included), or `inf`, `-inf`, `nan`.
    Num(String),
    Str(String),
    Punct(char),
    Eof,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Value(name, None) => write!(f, "`%{name}`"),
            Tok::Value(name, Some(k)) => write!(f, "`%{name}#{k}`"),
            Tok::Ident(s) => write!(f, "`{s}`"),
            Tok::Num(s) => write!(f, "number `{s}`"),
            Tok::Str(s) => write!(f, "string {s:?}"),
            Tok::Punct(c) => write!(f, "`{c}`"),
            Tok::Eof => f.write_str("end of input"),
        }
    }
}

/// A 1-based source position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pos {
    pub line: u32,
    pub col: u32,
}

pub fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '.'
}

/// Splits `src` into tokens; an error carries the position and the message.
pub fn lex(src: &str) -> Result<Vec<(Tok, Pos)>, (Pos, String)> {
    let chars: Vec<char> = src.chars().collect();
    let mut toks = Vec::new();
    let (mut i, mut line, mut col) = (0usize, 1u32, 1u32);
    let advance = |i: &mut usize, line: &mut u32, col: &mut u32, n: usize| {
        for _ in 0..n {
            if chars[*i] == '\n' {
                *line += 1;
                *col = 1;
            } else {
                *col += 1;
            }
            *i += 1;
        }
    };
    while i < chars.len() {
        let c = chars[i];
        let pos = Pos { line, col };
        if c.is_whitespace() {
            advance(&mut i, &mut line, &mut col, 1);
        } else if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                advance(&mut i, &mut line, &mut col, 1);
            }
        } else if c == '%' {
            let start = i + 1;
            let mut j = start;
            while j < chars.len() && is_name_char(chars[j]) {
                j += 1;
            }
            if j == start {
                return Err((pos, "expected a value name after `%`".into()));
            }
            let name: String = chars[start..j].iter().collect();
            let mut result = None;
            if j + 1 < chars.len() && chars[j] == '#' && chars[j + 1].is_ascii_digit() {
                let mut k = j + 1;
                while k < chars.len() && chars[k].is_ascii_digit() {
                    k += 1;
                }
                let digits: String = chars[j + 1..k].iter().collect();
                let n = digits
                    .parse::<u32>()
                    .map_err(|_| (pos, format!("result index `{digits}` is too large")))?;
                result = Some(n);
                j = k;
            }
            let n = j - i;
            advance(&mut i, &mut line, &mut col, n);
            toks.push((Tok::Value(name, result), pos));
        } else if c == '"' {
            let mut s = String::new();
            let mut j = i + 1;
            loop {
                match chars.get(j) {
                    None | Some('\n') => return Err((pos, "unterminated string".into())),
                    Some('"') => break,
                    Some('\\') => {
                        match chars.get(j + 1) {
                            Some('n') => s.push('\n'),
                            Some('t') => s.push('\t'),
                            Some('\\') => s.push('\\'),
                            Some('"') => s.push('"'),
                            _ => {
                                return Err((
                                    pos,
                                    "unknown escape in string (use \\n, \\t, \\\\ or \\\")".into(),
                                ))
                            }
                        }
                        j += 2;
                    }
                    Some(&ch) => {
                        s.push(ch);
                        j += 1;
                    }
                }
            }
            let n = j + 1 - i;
            advance(&mut i, &mut line, &mut col, n);
            toks.push((Tok::Str(s), pos));
        } else if c.is_ascii_digit()
            || ((c == '-' || c == '+')
                && chars
                    .get(i + 1)
                    .is_some_and(|d| d.is_ascii_alphanumeric() || *d == '.'))
            || (c == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
        {
            let mut j = i + 1;
            while j < chars.len()
                && (chars[j].is_ascii_alphanumeric()
                    || chars[j] == '.'
                    || ((chars[j] == '-' || chars[j] == '+') && matches!(chars[j - 1], 'e' | 'E')))
            {
                j += 1;
            }
            let text: String = chars[i..j].iter().collect();
            let n = j - i;
            advance(&mut i, &mut line, &mut col, n);
            toks.push((Tok::Num(text), pos));
        } else if c.is_ascii_alphabetic() || c == '_' {
            let mut j = i;
            while j < chars.len() && (chars[j].is_ascii_alphanumeric() || chars[j] == '_') {
                j += 1;
            }
            let text: String = chars[i..j].iter().collect();
            let n = j - i;
            advance(&mut i, &mut line, &mut col, n);
            let tok = if text == "inf" || text == "nan" {
                Tok::Num(text)
            } else {
                Tok::Ident(text)
            };
            toks.push((tok, pos));
        } else if "()[],=:".contains(c) {
            advance(&mut i, &mut line, &mut col, 1);
            toks.push((Tok::Punct(c), pos));
        } else {
            return Err((pos, format!("unexpected character {c:?}")));
        }
    }
    toks.push((Tok::Eof, Pos { line, col }));
    Ok(toks)
}
