//! The tile interpreter: runs kernel IR without compiling, evaluating inner-level instructions
//! over tiles of the inner space as typed columns. It is the instant-start tier and the fallback
//! where no C compiler exists. Elementwise semantics are the reference interpreter's own code, so
//! results match it bit for bit.

use kfuse_interp::elem::Elem;
use kfuse_interp::elementwise;
use kfuse_ir::{Array, DType, Element, ReduceOp, Shape, Storage};
use kfuse_kernel::{InstId, InstKind, Kernel, Level};

/// Inner elements evaluated per tile.
pub const TILE: usize = 1024;

/// A value during execution: one element per lane of the current tile (inner level) or a single
/// element (outer level, broadcast over the tile).
type Column = Array;

fn column(v: Storage) -> Column {
    let n = v.len();
    Array::new(Shape::new(vec![n]), v).expect("column fills its shape")
}

fn i64s(c: &Column) -> &[i64] {
    c.as_slice::<i64>().expect("index values are i64")
}

/// Runs `kernel` over outer indices `outer` and inner indices `inner` (the whole inner space for
/// kernels with reductions). `reads[i]` is argument `i` when it is read, `writes[i]` when written.
pub fn run_kernel(
    kernel: &Kernel,
    reads: &[Option<&Storage>],
    writes: &mut [Option<&mut Storage>],
    outer: std::ops::Range<usize>,
    inner: std::ops::Range<usize>,
) -> Result<(), String> {
    let levels = kernel.levels();
    let n = kernel.insts.len();
    // For each reduction, the inner-level instructions its pass evaluates; for the final pass,
    // those the inner-level stores need.
    let needs = |roots: &[InstId]| -> Vec<bool> {
        let mut need = vec![false; n];
        let mut stack: Vec<InstId> = roots.to_vec();
        while let Some(i) = stack.pop() {
            if need[i.index()] || levels[i.index()] != Level::Inner {
                continue;
            }
            need[i.index()] = true;
            stack.extend(kernel.insts[i.index()].operands());
        }
        need
    };
    let reductions: Vec<(usize, Vec<bool>)> = (0..n)
        .filter_map(|i| match kernel.insts[i].kind {
            InstKind::Reduce { value, .. } => Some((i, needs(&[value]))),
            _ => None,
        })
        .collect();
    let inner_stores: Vec<InstId> = (0..n)
        .filter(|&i| {
            matches!(kernel.insts[i].kind, InstKind::Store { .. }) && levels[i] == Level::Inner
        })
        .map(|i| InstId(i as u32))
        .collect();
    let final_pass = needs(&inner_stores);
    let mut values: Vec<Option<Column>> = vec![None; n];
    for o in outer {
        let mut next_reduction = 0;
        for i in 0..n {
            if levels[i] == Level::Inner {
                continue;
            }
            let inst = kernel.insts[i];
            if let InstKind::Reduce { op, value } = inst.kind {
                let (_, need) = &reductions[next_reduction];
                next_reduction += 1;
                let result = reduce_pass(
                    kernel,
                    need,
                    &mut values,
                    reads,
                    o,
                    kernel.inner_len(),
                    op,
                    value,
                    inst.dtype,
                )?;
                values[i] = Some(result);
                continue;
            }
            values[i] = eval(kernel, i, &values, reads, writes, o, 0, 1)?;
        }
        let mut start = inner.start;
        while start < inner.end {
            let len = TILE.min(inner.end - start);
            for i in 0..n {
                if final_pass[i] {
                    values[i] = eval(kernel, i, &values, reads, writes, o, start, len)?;
                }
            }
            start += len;
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn reduce_pass(
    kernel: &Kernel,
    need: &[bool],
    values: &mut [Option<Column>],
    reads: &[Option<&Storage>],
    o: usize,
    inner_len: usize,
    op: ReduceOp,
    value: InstId,
    dtype: DType,
) -> Result<Column, String> {
    let value_dtype = kernel.insts[value.index()].dtype;
    let mut acc = Accumulator::new(
        op,
        if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) {
            value_dtype
        } else {
            dtype
        },
    );
    let mut start = 0;
    while start < inner_len {
        let len = TILE.min(inner_len - start);
        for i in 0..kernel.insts.len() {
            if need[i] {
                values[i] = eval(kernel, i, values, reads, &mut [], o, start, len)?;
            }
        }
        let v = values[value.index()]
            .as_ref()
            .expect("reduced value computed");
        acc.add(v, start, len);
        start += len;
    }
    Ok(acc.finish())
}

/// Evaluates instruction `i` for one tile: `len` inner indices from `start` (or the outer
/// level when `len` is 1 and the instruction is outer-level).
#[allow(clippy::too_many_arguments)]
fn eval(
    kernel: &Kernel,
    i: usize,
    values: &[Option<Column>],
    reads: &[Option<&Storage>],
    writes: &mut [Option<&mut Storage>],
    o: usize,
    start: usize,
    len: usize,
) -> Result<Option<Column>, String> {
    let inst = kernel.insts[i];
    let get = |id: InstId| {
        values[id.index()]
            .as_ref()
            .expect("operands are evaluated first")
    };
    let shape_of =
        |cols: &[&Column]| Shape::new(vec![cols.iter().map(|c| c.n_elems()).max().unwrap_or(1)]);
    Ok(Some(match inst.kind {
        InstKind::OuterIndex => column(Storage::I64(vec![o as i64])),
        InstKind::InnerIndex => column(Storage::I64(
            (start..start + len).map(|j| j as i64).collect(),
        )),
        InstKind::Const(bits) => constant(bits, inst.dtype),
        InstKind::Index(op, a, b) => {
            let (x, y) = (i64s(get(a)), i64s(get(b)));
            let n = x.len().max(y.len());
            let pick = |v: &[i64], k: usize| if v.len() == 1 { v[0] } else { v[k] };
            column(Storage::I64(
                (0..n).map(|k| op.apply(pick(x, k), pick(y, k))).collect(),
            ))
        }
        InstKind::Unary(u, a) => elementwise::unary(u, get(a)),
        InstKind::Binary(b, x, y) => {
            let (x, y) = (get(x), get(y));
            elementwise::binary(b, x, y, &shape_of(&[x, y]))
        }
        InstKind::Compare(c, x, y) => {
            let (x, y) = (get(x), get(y));
            elementwise::compare(c, x, y, &shape_of(&[x, y]))
        }
        InstKind::Select(c, x, y) => {
            let (c, x, y) = (get(c), get(x), get(y));
            elementwise::select(c, x, y, &shape_of(&[c, x, y]))
        }
        InstKind::Cast(a) => elementwise::cast(get(a), inst.dtype),
        InstKind::Load { arg, offset } => {
            let src =
                reads.get(arg as usize).copied().flatten().ok_or_else(|| {
                    format!("kernel {}: argument {arg} is not readable", kernel.name)
                })?;
            gather(src, i64s(get(offset)))
                .map_err(|e| format!("kernel {}: argument {arg}: {e}", kernel.name))?
        }
        InstKind::Store { arg, offset, value } => {
            let dst = writes
                .get_mut(arg as usize)
                .and_then(|w| w.as_deref_mut())
                .ok_or_else(|| format!("kernel {}: argument {arg} is not writable", kernel.name))?;
            scatter(dst, i64s(get(offset)), get(value))
                .map_err(|e| format!("kernel {}: argument {arg}: {e}", kernel.name))?;
            return Ok(None);
        }
        InstKind::Reduce { .. } => unreachable!("reductions run in their own pass"),
    }))
}

fn constant(bits: u64, dtype: DType) -> Column {
    let storage = match dtype {
        DType::F32 => Storage::F32(vec![f32::from_bits(bits as u32)]),
        DType::F64 => Storage::F64(vec![f64::from_bits(bits)]),
        DType::F16 => Storage::F16(vec![kfuse_ir::f16::from_bits(bits as u16)]),
        DType::BF16 => Storage::BF16(vec![kfuse_ir::bf16::from_bits(bits as u16)]),
        DType::I32 => Storage::I32(vec![bits as u32 as i32]),
        DType::I64 => Storage::I64(vec![bits as i64]),
        DType::U8 => Storage::U8(vec![bits as u8]),
        DType::Bool => Storage::Bool(vec![bits != 0]),
    };
    column(storage)
}

fn gather(src: &Storage, offsets: &[i64]) -> Result<Column, String> {
    fn pick<T: Copy>(v: &[T], offsets: &[i64]) -> Result<Vec<T>, String> {
        offsets
            .iter()
            .map(|&o| {
                usize::try_from(o)
                    .ok()
                    .and_then(|o| v.get(o).copied())
                    .ok_or_else(|| format!("load at offset {o} outside its {} elements", v.len()))
            })
            .collect()
    }
    let s = match src {
        Storage::F32(v) => Storage::F32(pick(v, offsets)?),
        Storage::F64(v) => Storage::F64(pick(v, offsets)?),
        Storage::F16(v) => Storage::F16(pick(v, offsets)?),
        Storage::BF16(v) => Storage::BF16(pick(v, offsets)?),
        Storage::I32(v) => Storage::I32(pick(v, offsets)?),
        Storage::I64(v) => Storage::I64(pick(v, offsets)?),
        Storage::U8(v) => Storage::U8(pick(v, offsets)?),
        Storage::Bool(v) => Storage::Bool(pick(v, offsets)?),
    };
    Ok(column(s))
}

fn scatter(dst: &mut Storage, offsets: &[i64], value: &Column) -> Result<(), String> {
    fn put<T: Element>(v: &mut [T], offsets: &[i64], value: &Column) -> Result<(), String> {
        let src = value
            .as_slice::<T>()
            .ok_or("stored value has the wrong dtype")?;
        let n = v.len();
        for (k, &o) in offsets.iter().enumerate() {
            let slot = usize::try_from(o)
                .ok()
                .and_then(|o| v.get_mut(o))
                .ok_or_else(|| format!("store at offset {o} outside its {n} elements"))?;
            *slot = if src.len() == 1 { src[0] } else { src[k] };
        }
        Ok(())
    }
    match dst {
        Storage::F32(v) => put(v, offsets, value),
        Storage::F64(v) => put(v, offsets, value),
        Storage::F16(v) => put(v, offsets, value),
        Storage::BF16(v) => put(v, offsets, value),
        Storage::I32(v) => put(v, offsets, value),
        Storage::I64(v) => put(v, offsets, value),
        Storage::U8(v) => put(v, offsets, value),
        Storage::Bool(v) => put(v, offsets, value),
    }
}

/// Reduction state in the documented order: 16 partials for sums and products, a running
/// extreme for max/min, the first extreme's index for arg reductions.
enum Accumulator {
    F32(Lanes<f32>),
    F64(Lanes<f64>),
    I32(Lanes<i32>),
    I64(Lanes<i64>),
    U8(Lanes<u8>),
    ArgF32(ArgBest<f32>),
    ArgF64(ArgBest<f64>),
    ArgI32(ArgBest<i32>),
    ArgI64(ArgBest<i64>),
    ArgU8(ArgBest<u8>),
}

/// The first extreme seen so far and its inner index; the first NaN wins outright.
struct ArgBest<T> {
    max: bool,
    best: Option<(T, usize)>,
}

impl<T: Elem> ArgBest<T> {
    fn add(&mut self, values: &[T], start: usize, len: usize) {
        for k in 0..len {
            let x = if values.len() == 1 {
                values[0]
            } else {
                values[k]
            };
            let better = match self.best {
                None => true,
                Some((b, _)) if b.is_nan() => false,
                Some((b, _)) => x.is_nan() || if self.max { x > b } else { x < b },
            };
            if better {
                self.best = Some((x, start + k));
            }
        }
    }

    fn index(&self) -> i64 {
        self.best.map_or(0, |b| b.1 as i64)
    }
}

struct Lanes<T> {
    op: ReduceOp,
    partials: [T; kfuse_interp::reduce::LANES],
}

impl<T: Elem> Lanes<T> {
    fn new(op: ReduceOp) -> Self {
        let identity = match op {
            ReduceOp::Sum => T::from_i64(0),
            ReduceOp::Prod => T::from_i64(1),
            ReduceOp::Max => T::lowest(),
            _ => T::highest(),
        };
        Lanes {
            op,
            partials: [identity; kfuse_interp::reduce::LANES],
        }
    }

    fn combine(op: ReduceOp, a: T, b: T) -> T {
        match op {
            ReduceOp::Sum => a.add(b),
            ReduceOp::Prod => a.mul(b),
            ReduceOp::Max => a.ieee_max(b),
            _ => a.ieee_min(b),
        }
    }

    fn add(&mut self, values: &[T], start: usize, len: usize) {
        for k in 0..len {
            let v = if values.len() == 1 {
                values[0]
            } else {
                values[k]
            };
            let lane = (start + k) % kfuse_interp::reduce::LANES;
            self.partials[lane] = Self::combine(self.op, self.partials[lane], v);
        }
    }

    fn finish(self) -> T {
        let op = self.op;
        let mut p = self.partials;
        let mut width = p.len();
        while width > 1 {
            width /= 2;
            for i in 0..width {
                p[i] = Self::combine(op, p[2 * i], p[2 * i + 1]);
            }
        }
        p[0]
    }
}

impl Accumulator {
    /// `dtype` is the reduction's result type, or for arg reductions the reduced values' type.
    fn new(op: ReduceOp, dtype: DType) -> Self {
        let max = op == ReduceOp::ArgMax;
        match (op, dtype) {
            (ReduceOp::ArgMax | ReduceOp::ArgMin, DType::F32) => {
                Accumulator::ArgF32(ArgBest { max, best: None })
            }
            (ReduceOp::ArgMax | ReduceOp::ArgMin, DType::F64) => {
                Accumulator::ArgF64(ArgBest { max, best: None })
            }
            (ReduceOp::ArgMax | ReduceOp::ArgMin, DType::I32) => {
                Accumulator::ArgI32(ArgBest { max, best: None })
            }
            (ReduceOp::ArgMax | ReduceOp::ArgMin, DType::I64) => {
                Accumulator::ArgI64(ArgBest { max, best: None })
            }
            (ReduceOp::ArgMax | ReduceOp::ArgMin, DType::U8) => {
                Accumulator::ArgU8(ArgBest { max, best: None })
            }
            (_, DType::F32) => Accumulator::F32(Lanes::new(op)),
            (_, DType::F64) => Accumulator::F64(Lanes::new(op)),
            (_, DType::I32) => Accumulator::I32(Lanes::new(op)),
            (_, DType::I64) => Accumulator::I64(Lanes::new(op)),
            (_, DType::U8) => Accumulator::U8(Lanes::new(op)),
            (_, other) => unreachable!("lowering never reduces {other}"),
        }
    }

    fn add(&mut self, v: &Column, start: usize, len: usize) {
        match self {
            Accumulator::F32(l) => l.add(v.as_slice().expect("f32"), start, len),
            Accumulator::F64(l) => l.add(v.as_slice().expect("f64"), start, len),
            Accumulator::I32(l) => l.add(v.as_slice().expect("i32"), start, len),
            Accumulator::I64(l) => l.add(v.as_slice().expect("i64"), start, len),
            Accumulator::U8(l) => l.add(v.as_slice().expect("u8"), start, len),
            Accumulator::ArgF32(a) => a.add(v.as_slice().expect("f32"), start, len),
            Accumulator::ArgF64(a) => a.add(v.as_slice().expect("f64"), start, len),
            Accumulator::ArgI32(a) => a.add(v.as_slice().expect("i32"), start, len),
            Accumulator::ArgI64(a) => a.add(v.as_slice().expect("i64"), start, len),
            Accumulator::ArgU8(a) => a.add(v.as_slice().expect("u8"), start, len),
        }
    }

    fn finish(self) -> Column {
        let s = match self {
            Accumulator::F32(l) => Storage::F32(vec![l.finish()]),
            Accumulator::F64(l) => Storage::F64(vec![l.finish()]),
            Accumulator::I32(l) => Storage::I32(vec![l.finish()]),
            Accumulator::I64(l) => Storage::I64(vec![l.finish()]),
            Accumulator::U8(l) => Storage::U8(vec![l.finish()]),
            Accumulator::ArgF32(a) => Storage::I64(vec![a.index()]),
            Accumulator::ArgF64(a) => Storage::I64(vec![a.index()]),
            Accumulator::ArgI32(a) => Storage::I64(vec![a.index()]),
            Accumulator::ArgI64(a) => Storage::I64(vec![a.index()]),
            Accumulator::ArgU8(a) => Storage::I64(vec![a.index()]),
        };
        column(s)
    }
}
