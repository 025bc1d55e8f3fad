//! `einsum`: Einstein summation written as the ops kfuse already compiles well.
//!
//! An equation such as `"bij,bjk->bik"` becomes, per pair of operands, a permute and reshape of
//! each to `[batch, rows, contracted]` and `[batch, contracted, columns]`, one batched matmul,
//! and a reshape back; letters that appear in one operand only and not in the output are summed
//! first, a letter repeated within one operand takes the diagonal, and a final permute puts the
//! result in the output's order. More than two operands contract left to right.

use std::collections::HashMap;
use std::panic::Location;

use kfuse_ir::DType;

use crate::{where_, Context, Tensor};

/// A parsed equation: the letters naming each operand's axes, and the output's.
#[derive(Debug, PartialEq)]
struct Equation {
    inputs: Vec<Vec<char>>,
    output: Vec<char>,
}

/// Parses `equation` for `n_operands` operands. Without `->`, the output is every letter that
/// appears exactly once, in alphabetical (ASCII) order, as numpy does.
fn parse(equation: &str, n_operands: usize) -> Result<Equation, String> {
    let text: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    if text.contains('.') {
        return Err(format!(
            "{equation:?}: '...' (broadcast axes) is not supported; name every axis with a letter"
        ));
    }
    let (lhs, rhs) = match text.split_once("->") {
        Some((lhs, rhs)) => (lhs, Some(rhs)),
        None => (text.as_str(), None),
    };
    let inputs: Vec<Vec<char>> = lhs.split(',').map(|s| s.chars().collect()).collect();
    if inputs.len() != n_operands {
        return Err(format!(
            "{equation:?} names {} operand(s), {n_operands} given",
            inputs.len()
        ));
    }
    let mut letters = lhs
        .chars()
        .filter(|&c| c != ',')
        .chain(rhs.unwrap_or("").chars());
    if let Some(c) = letters.find(|c| !c.is_ascii_alphabetic()) {
        return Err(format!(
            "{equation:?}: {c:?} is not an axis letter (a-z, A-Z)"
        ));
    }
    let count = |c: char| inputs.iter().flatten().filter(|&&d| d == c).count();
    let output: Vec<char> = match rhs {
        Some(rhs) => {
            let output: Vec<char> = rhs.chars().collect();
            for (k, &c) in output.iter().enumerate() {
                if output[..k].contains(&c) {
                    return Err(format!("{equation:?}: '{c}' appears twice in the output"));
                }
                if count(c) == 0 {
                    return Err(format!(
                        "{equation:?}: the output's '{c}' names no axis of an operand"
                    ));
                }
            }
            output
        }
        None => {
            let mut once: Vec<char> = inputs
                .iter()
                .flatten()
                .copied()
                .filter(|&c| count(c) == 1)
                .collect();
            once.sort_unstable();
            once
        }
    };
    Ok(Equation { inputs, output })
}

/// An operand during contraction: a tensor and the letter naming each of its axes.
#[derive(Clone)]
struct Labeled {
    tensor: Tensor,
    letters: Vec<char>,
}

/// Sums the axes whose letters `keep` rejects.
#[track_caller]
fn sum_out(operand: Labeled, keep: impl Fn(char) -> bool) -> Labeled {
    let axes: Vec<isize> = (0..operand.letters.len())
        .filter(|&i| !keep(operand.letters[i]))
        .map(|i| i as isize)
        .collect();
    if axes.is_empty() {
        return operand;
    }
    Labeled {
        tensor: operand.tensor.sum(&axes, false),
        letters: operand.letters.into_iter().filter(|&c| keep(c)).collect(),
    }
}

/// Replaces each letter repeated within the operand by the diagonal along its axes
/// (`"ii->i"`): a select keeps the elements whose two coordinates agree, and a sum over the
/// second axis collects them. The select (rather than a product with an identity matrix) keeps
/// NaN and infinities off the diagonal out of the result.
#[track_caller]
fn take_diagonals(mut operand: Labeled) -> Labeled {
    loop {
        let letters = &operand.letters;
        let repeat = (1..letters.len()).find_map(|q| {
            letters[..q]
                .iter()
                .position(|&c| c == letters[q])
                .map(|p| (p, q))
        });
        let Some((p, q)) = repeat else {
            return operand;
        };
        let dims = operand.tensor.dims();
        let cx = operand.tensor.context().clone();
        let same = cx
            .iota(DType::I64, &dims, p)
            .eq(cx.iota(DType::I64, &dims, q));
        operand.tensor = where_(&same, &operand.tensor, 0).sum(&[q as isize], false);
        operand.letters.remove(q);
    }
}

/// Permutes `operand` so that its letters come in `order` (a permutation of them).
#[track_caller]
fn arrange(operand: &Labeled, order: &[char]) -> Tensor {
    let mut perm = Vec::with_capacity(order.len());
    for c in order {
        perm.push(operand.letters.iter().position(|d| d == c).unwrap_or(0) as isize);
    }
    operand.tensor.permute(&perm)
}

/// Contracts two operands into one holding the letters in `keep` that either has: shared kept
/// letters are batch axes, shared others are summed by the matmul.
#[track_caller]
fn contract(a: Labeled, b: Labeled, keep: &[char], sizes: &HashMap<char, usize>) -> Labeled {
    let b_letters = b.letters.clone();
    let a = sum_out(a, |c| keep.contains(&c) || b_letters.contains(&c));
    let a_letters = a.letters.clone();
    let b = sum_out(b, |c| keep.contains(&c) || a_letters.contains(&c));
    let shared = |c: &&char| b.letters.contains(c);
    let batch: Vec<char> = a
        .letters
        .iter()
        .filter(shared)
        .filter(|c| keep.contains(c))
        .copied()
        .collect();
    let summed: Vec<char> = a
        .letters
        .iter()
        .filter(shared)
        .filter(|c| !keep.contains(c))
        .copied()
        .collect();
    let rows: Vec<char> = a
        .letters
        .iter()
        .filter(|c| !b.letters.contains(c))
        .copied()
        .collect();
    let columns: Vec<char> = b
        .letters
        .iter()
        .filter(|c| !a.letters.contains(c))
        .copied()
        .collect();
    let size = |letters: &[char]| -> isize {
        letters
            .iter()
            .map(|c| sizes.get(c).copied().unwrap_or(1))
            .product::<usize>() as isize
    };
    let (nb, nm, nk, nn) = (size(&batch), size(&rows), size(&summed), size(&columns));
    let left =
        arrange(&a, &[batch.clone(), rows.clone(), summed.clone()].concat()).reshape(&[nb, nm, nk]);
    let right =
        arrange(&b, &[batch.clone(), summed, columns.clone()].concat()).reshape(&[nb, nk, nn]);
    let letters = [batch, rows, columns].concat();
    let dims: Vec<isize> = letters
        .iter()
        .map(|c| sizes.get(c).copied().unwrap_or(1) as isize)
        .collect();
    Labeled {
        tensor: left.bmm(&right).reshape(&dims),
        letters,
    }
}

/// Einstein summation (numpy `einsum`) over any number of operands: `"ij,jk->ik"` is a matrix
/// product, `"bij,bkj->bik"` a batched product with the second transposed, `"ij->ji"` a
/// transpose, `"ii->"` a trace, `"i,j->ij"` an outer product, `"ij->"` a sum. Without `->`,
/// the output is the letters that appear once, in alphabetical order.
///
/// Every axis must be named by a letter of the same size in each operand that has it: `...`
/// (broadcast axes) and size-1 broadcasting are not supported and give an error naming the
/// equation.
///
/// ```
/// let cx = kfuse::Context::new();
/// let a = cx.tensor(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
/// let b = cx.tensor(&[5.0f32, 6.0, 7.0, 8.0], &[2, 2]);
/// let c = kfuse::einsum("ij,jk->ik", &[&a, &b]);
/// assert_eq!(c.to_vec::<f32>().unwrap(), vec![19.0, 22.0, 43.0, 50.0]);
/// assert_eq!(kfuse::einsum("ii", &[&a]).to_vec::<f32>().unwrap(), vec![5.0]);
/// ```
#[track_caller]
pub fn einsum(equation: &str, operands: &[&Tensor]) -> Tensor {
    let loc = Location::caller();
    let Some(first) = operands.first() else {
        return Context::new().error(loc, "einsum: no operands given");
    };
    if let Some(failed) = operands.iter().find(|t| !t.is_ok()) {
        return (*failed).clone();
    }
    let fail = |message: String| first.context().error(loc, format!("einsum: {message}"));
    let parsed = match parse(equation, operands.len()) {
        Ok(parsed) => parsed,
        Err(message) => return fail(message),
    };
    let mut sizes: HashMap<char, usize> = HashMap::new();
    for (k, (operand, letters)) in operands.iter().zip(&parsed.inputs).enumerate() {
        let dims = operand.dims();
        if dims.len() != letters.len() {
            return fail(format!(
                "{equation:?}: operand {k} has rank {} but is given {} letter(s)",
                dims.len(),
                letters.len()
            ));
        }
        for (&c, &d) in letters.iter().zip(&dims) {
            match sizes.get(&c) {
                Some(&seen) if seen != d => {
                    return fail(format!(
                        "{equation:?}: '{c}' is {seen} long in one place and {d} in operand {k}"
                    ))
                }
                _ => {
                    sizes.insert(c, d);
                }
            }
        }
    }
    let mut labeled = Vec::with_capacity(operands.len());
    for (operand, letters) in operands.iter().zip(&parsed.inputs) {
        labeled.push(take_diagonals(Labeled {
            tensor: (*operand).clone(),
            letters: letters.clone(),
        }));
    }
    let mut result = labeled[0].clone();
    for i in 1..labeled.len() {
        let mut keep = parsed.output.clone();
        keep.extend(
            labeled[i + 1..]
                .iter()
                .flat_map(|l| l.letters.iter().copied()),
        );
        result = contract(result, labeled[i].clone(), &keep, &sizes);
    }
    let output = &parsed.output;
    let result = sum_out(result, |c| output.contains(&c));
    arrange(&result, output)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equations_parse_with_numpy_rules() {
        let eq = parse("ij, jk", 2).unwrap();
        assert_eq!(eq.inputs, vec![vec!['i', 'j'], vec!['j', 'k']]);
        assert_eq!(eq.output, vec!['i', 'k']);
        assert_eq!(parse("ba", 1).unwrap().output, vec!['a', 'b']);
        assert_eq!(parse("ii", 1).unwrap().output, Vec::<char>::new());
        assert_eq!(parse("ij->", 1).unwrap().output, Vec::<char>::new());
        let cases = [
            ("...i->i", 1, "'...' (broadcast axes) is not supported"),
            ("ij,jk->ik", 1, "names 2 operand(s), 1 given"),
            ("i1->i", 1, "'1' is not an axis letter"),
            ("ij->ii", 1, "'i' appears twice in the output"),
            ("ij->k", 1, "the output's 'k' names no axis"),
        ];
        for (text, n, want) in cases {
            let err = parse(text, n).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
        }
    }
}
