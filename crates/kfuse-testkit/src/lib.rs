//! Test support: a seeded generator, random well-typed graphs over the whole op set, random
//! arrays rich in edge values, and mutations of program text. Failing cases print their seed, so
//! every failure replays. Tests that need something of the machine skip through
//! [`prerequisites::skip`], which shows in `cargo test`'s output and fails in CI.

pub mod numerics;
pub mod prerequisites;

pub use numerics::{narrowing_values, strict_difference, Difference};
pub use prerequisites::{has_avx512, skip, Prerequisite};

use kfuse_ir::{
    Array, BinaryOp, CompareOp, Conv2dAttrs, DType, Graph, Layout, Op, PadMode, Pool2dAttrs,
    PoolKind, ReduceOp, RngDist, Shape, Storage, TensorType, UnaryOp, Value,
};

/// SplitMix64: small, fast, and good enough to drive test generation.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    pub fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }

    /// A float drawn mostly from ordinary values, often from the edge cases: NaN, +-inf, +-0,
    /// subnormals, the largest and smallest normals, and values near 1.
    pub fn float(&mut self) -> f64 {
        match self.below(16) {
            0 => f64::NAN,
            1 => f64::INFINITY,
            2 => f64::NEG_INFINITY,
            3 => 0.0,
            4 => -0.0,
            5 => {
                f32::from_bits(1 + self.below(0x7f_ffff) as u32) as f64
                    * if self.chance(0.5) { 1.0 } else { -1.0 }
            }
            6 => f32::MAX as f64 * if self.chance(0.5) { 1.0 } else { -1.0 },
            7 => 1.0 + (self.below(1000) as f64 - 500.0) * 1e-7,
            _ => (self.below(20_001) as f64 - 10_000.0) / 1000.0,
        }
    }
}

/// A random array of `ty`.
pub fn random_array(rng: &mut Rng, ty: &TensorType) -> Array {
    let n = ty.shape.n_elems();
    let storage = match ty.dtype {
        DType::F32 => Storage::F32((0..n).map(|_| rng.float() as f32).collect()),
        DType::F64 => Storage::F64((0..n).map(|_| rng.float()).collect()),
        DType::F16 => Storage::F16(
            (0..n)
                .map(|_| kfuse_ir::f16::from_f64(rng.float()))
                .collect(),
        ),
        DType::BF16 => Storage::BF16(
            (0..n)
                .map(|_| kfuse_ir::bf16::from_f64(rng.float()))
                .collect(),
        ),
        DType::I32 => Storage::I32((0..n).map(|_| int_value(rng) as i32).collect()),
        DType::I64 => Storage::I64((0..n).map(|_| int_value(rng)).collect()),
        DType::U8 => Storage::U8((0..n).map(|_| int_value(rng) as u8).collect()),
        DType::Bool => Storage::Bool((0..n).map(|_| rng.chance(0.5)).collect()),
    };
    Array::new(ty.shape.clone(), storage).expect("random array fills its shape")
}

/// Arrays for every input of `graph`, drawn from the grid `{k / steps : |k| <= limit * steps}`:
/// finite, no edge values. For tests that compare sums taken in different orders, where the
/// magnitudes must stay tame.
pub fn grid_inputs(graph: &Graph, seed: u64, limit: f64, steps: u32) -> Vec<(String, Array)> {
    let mut rng = Rng::new(seed);
    let span = (limit * steps as f64) as usize;
    graph
        .inputs()
        .map(|(_, name, ty)| {
            let n = ty.shape.n_elems();
            let values: Vec<f64> = (0..n)
                .map(|_| (rng.below(2 * span + 1) as f64 - span as f64) / steps as f64)
                .collect();
            let storage = match ty.dtype {
                DType::F32 => Storage::F32(values.iter().map(|&v| v as f32).collect()),
                DType::F64 => Storage::F64(values),
                DType::F16 => {
                    Storage::F16(values.iter().map(|&v| kfuse_ir::f16::from_f64(v)).collect())
                }
                DType::BF16 => Storage::BF16(
                    values
                        .iter()
                        .map(|&v| kfuse_ir::bf16::from_f64(v))
                        .collect(),
                ),
                DType::I32 => Storage::I32(values.iter().map(|&v| v.round() as i32).collect()),
                DType::I64 => Storage::I64(values.iter().map(|&v| v.round() as i64).collect()),
                DType::U8 => Storage::U8(values.iter().map(|&v| v.abs().round() as u8).collect()),
                DType::Bool => Storage::Bool(values.iter().map(|&v| v > 0.0).collect()),
            };
            let array = Array::new(ty.shape.clone(), storage).expect("grid array fills its shape");
            (name.to_string(), array)
        })
        .collect()
}

fn int_value(rng: &mut Rng) -> i64 {
    match rng.below(8) {
        0 => i64::MIN,
        1 => i64::MAX,
        2 => 0,
        3 => -1,
        _ => rng.below(41) as i64 - 20,
    }
}

/// A random shape of rank 0 to `max_rank` with dims 0 to 4 (zero-size dims are rare).
pub fn random_shape(rng: &mut Rng, max_rank: usize) -> Shape {
    let rank = rng.below(max_rank + 1);
    Shape::new(
        (0..rank)
            .map(|_| {
                if rng.chance(0.05) {
                    0
                } else {
                    1 + rng.below(4)
                }
            })
            .collect::<Vec<_>>(),
    )
}

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// Generates random graphs. Ops are proposed with random operands and attributes and kept when
/// the graph accepts them, so both acceptance and rejection paths are exercised.
pub struct GraphGen<'a> {
    pub rng: &'a mut Rng,
    pub graph: Graph,
    values: Vec<Value>,
    /// Whether to propose ops that only make sense for text round trips (custom ops).
    pub allow_custom: bool,
    /// Whether to use 16-bit float and integer dtypes, not only f32 and f64.
    pub all_dtypes: bool,
    /// Graphs for checking fast numerics against strict ones by a tolerance: f32 only, finite
    /// constants in [-2, 2], and only ops whose result moves little when an operand moves a
    /// little (arithmetic without division, tanh, sigmoid, max and min, sums and extremes,
    /// movement, matmul). Comparisons, casts, rounding and poles would turn a last-bit
    /// difference into an arbitrary one.
    pub fast_safe: bool,
}

const SAFE_UNARY: &[UnaryOp] = &[
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Relu,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
];
const SAFE_BINARY: &[BinaryOp] = &[
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Max,
    BinaryOp::Min,
];
const SAFE_REDUCE: &[ReduceOp] = &[ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min];
/// The `propose` choices of fast-safe graphs: unary, binary, reductions, movement, matmul.
const SAFE_CHOICES: &[usize] = &[0, 1, 2, 3, 4, 5, 6, 7, 11, 12, 13, 14, 15, 16, 17, 18, 19];

/// A float in [-2, 2] on a grid of 1/1000.
fn bounded_float(rng: &mut Rng) -> f64 {
    (rng.below(4001) as f64 - 2000.0) / 1000.0
}

/// A random f32 array of `shape` with values in [-2, 2].
pub fn bounded_array(rng: &mut Rng, shape: &Shape) -> Array {
    let v: Vec<f32> = (0..shape.n_elems())
        .map(|_| bounded_float(rng) as f32)
        .collect();
    Array::new(shape.clone(), Storage::F32(v)).expect("sized")
}

impl<'a> GraphGen<'a> {
    pub fn new(rng: &'a mut Rng) -> Self {
        GraphGen {
            rng,
            graph: Graph::new(),
            values: Vec::new(),
            allow_custom: true,
            all_dtypes: true,
            fast_safe: false,
        }
    }

    fn dtype(&mut self) -> DType {
        if self.fast_safe {
            DType::F32
        } else if self.all_dtypes {
            self.rng.pick(&DType::ALL)
        } else {
            self.rng.pick(&[DType::F32, DType::F64])
        }
    }

    fn add(&mut self, op: Op, operands: Vec<Value>) {
        if let Ok(id) = self.graph.add_node(op, operands) {
            for r in 0..self.graph.node(id).types.len() as u32 {
                self.values.push(Value {
                    node: id,
                    result: r,
                });
            }
        }
    }

    fn any_value(&mut self) -> Value {
        self.values[self.rng.below(self.values.len())]
    }

    fn ty(&self, v: Value) -> TensorType {
        self.graph.ty(v).clone()
    }

    fn constant(&mut self, ty: TensorType) -> Option<Value> {
        let value = if self.fast_safe {
            bounded_array(self.rng, &ty.shape)
        } else {
            random_array(self.rng, &ty)
        };
        let id = self.graph.add_node(Op::Constant { value }, vec![]).ok()?;
        self.values.push(Value::of(id));
        Some(Value::of(id))
    }

    /// Adds `n_inputs` inputs and up to `n_ops` further nodes, then 1 to 3 outputs.
    pub fn generate(mut self, n_inputs: usize, n_ops: usize) -> Graph {
        for i in 0..n_inputs.max(1) {
            let ty = TensorType {
                dtype: self.dtype(),
                shape: random_shape(self.rng, 3),
            };
            self.add(
                Op::Input {
                    name: format!("in{i}"),
                    ty,
                },
                vec![],
            );
        }
        for _ in 0..n_ops {
            self.propose();
        }
        let n_out = 1 + self.rng.below(3);
        for k in 0..n_out {
            let v = self.any_value();
            let _ = self.graph.add_output(format!("out{k}"), v);
        }
        self.graph
    }

    fn propose(&mut self) {
        let x = self.any_value();
        let tx = self.ty(x);
        let rank = tx.shape.rank();
        let choice = if self.fast_safe {
            self.rng.pick(SAFE_CHOICES)
        } else {
            self.rng.below(26)
        };
        match choice {
            0..=4 => {
                let u = self.rng.pick(if self.fast_safe {
                    SAFE_UNARY
                } else {
                    UnaryOp::ALL
                });
                self.add(Op::Unary(u), vec![x]);
            }
            5..=7 => {
                let b = self.rng.pick(if self.fast_safe {
                    SAFE_BINARY
                } else {
                    BinaryOp::ALL
                });
                let y = self.partner(&tx);
                self.add(Op::Binary(b), vec![x, y]);
            }
            8 => {
                let c = self.rng.pick(CompareOp::ALL);
                let y = self.partner(&tx);
                self.add(Op::Compare(c), vec![x, y]);
            }
            9 => {
                let y = self.partner(&tx);
                let cond_ty = TensorType {
                    dtype: DType::Bool,
                    shape: tx.shape.clone(),
                };
                if let Some(c) = self.constant(cond_ty) {
                    let op = if self.rng.chance(0.5) {
                        Op::Select
                    } else {
                        Op::Clamp
                    };
                    let operands = if op == Op::Select {
                        vec![c, x, y]
                    } else {
                        vec![x, y, y]
                    };
                    self.add(op, operands);
                }
            }
            10 => {
                let to = self.dtype();
                self.add(Op::Cast { to }, vec![x]);
            }
            11 | 12 => {
                let op = self.rng.pick(if self.fast_safe {
                    SAFE_REDUCE
                } else {
                    ReduceOp::ALL
                });
                let axes: Vec<usize> = (0..rank).filter(|_| self.rng.chance(0.5)).collect();
                let keepdims = self.rng.chance(0.5);
                let axes = if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) {
                    axes.into_iter().take(1).collect()
                } else {
                    axes
                };
                self.add(Op::Reduce { op, axes, keepdims }, vec![x]);
            }
            13 => {
                let n = tx.shape.n_elems();
                let shape = match self.rng.below(3) {
                    0 => Shape::new(vec![n]),
                    1 => Shape::new(vec![1, n]),
                    _ => Shape::new(tx.shape.dims().iter().rev().copied().collect::<Vec<_>>()),
                };
                self.add(Op::Reshape { shape }, vec![x]);
            }
            14 => {
                let mut perm: Vec<usize> = (0..rank).collect();
                for i in (1..rank).rev() {
                    let j = self.rng.below(i + 1);
                    perm.swap(i, j);
                }
                self.add(Op::Permute { perm }, vec![x]);
            }
            15 => {
                let mut dims = vec![1 + self.rng.below(3)];
                dims.extend(tx.shape.dims().iter().map(|&d| {
                    if d == 1 {
                        1 + self.rng.below(3)
                    } else {
                        d
                    }
                }));
                self.add(
                    Op::Broadcast {
                        shape: Shape::new(dims),
                    },
                    vec![x],
                );
            }
            16 => {
                let (mut start, mut stop, mut step) = (vec![], vec![], vec![]);
                for &d in tx.shape.dims() {
                    let a = self.rng.below(d + 1);
                    let b = a + self.rng.below(d - a + 1);
                    start.push(a);
                    stop.push(b);
                    step.push(1 + self.rng.below(3));
                }
                self.add(Op::Slice { start, stop, step }, vec![x]);
            }
            17 => {
                let low = (0..rank).map(|_| self.rng.below(3)).collect();
                let high = (0..rank).map(|_| self.rng.below(3)).collect();
                let mode = self.rng.pick(PadMode::ALL);
                let value = kfuse_ir::Ieee64::new(if self.fast_safe {
                    bounded_float(self.rng)
                } else {
                    self.rng.float()
                });
                self.add(
                    Op::Pad {
                        low,
                        high,
                        mode,
                        value,
                    },
                    vec![x],
                );
            }
            18 => {
                if rank > 0 {
                    let axis = self.rng.below(rank);
                    let y = if self.rng.chance(0.5) {
                        x
                    } else {
                        self.partner(&tx)
                    };
                    self.add(Op::Concat { axis }, vec![x, y, x]);
                }
                let axes: Vec<usize> = (0..rank).filter(|_| self.rng.chance(0.5)).collect();
                self.add(Op::Flip { axes }, vec![x]);
            }
            19 => {
                // x @ x^T over the last two axes.
                if rank >= 2 {
                    let mut perm: Vec<usize> = (0..rank).collect();
                    perm.swap(rank - 1, rank - 2);
                    if let Ok(id) = self.graph.add_node(Op::Permute { perm }, vec![x]) {
                        self.add(Op::MatMul, vec![x, Value::of(id)]);
                    }
                }
            }
            20 => self.propose_window_op(),
            24 | 25 => self.propose_normalization(x, &tx),
            21 => {
                if rank > 0 {
                    let axis = self.rng.below(rank);
                    let mut idims = tx.shape.dims().to_vec();
                    idims[axis] = 1 + self.rng.below(3);
                    let ishape = Shape::new(idims);
                    let n = tx.shape.dims()[axis].max(1) as i64;
                    let values: Vec<i64> = (0..ishape.n_elems())
                        .map(|_| self.rng.below(2 * n as usize) as i64 - n)
                        .collect();
                    let index = Array::new(ishape.clone(), Storage::I64(values)).expect("sized");
                    if let Ok(iid) = self.graph.add_node(Op::Constant { value: index }, vec![]) {
                        if self.rng.chance(0.5) {
                            self.add(Op::Gather { axis }, vec![x, Value::of(iid)]);
                        } else if let Some(src) = self.constant(TensorType {
                            dtype: tx.dtype,
                            shape: ishape,
                        }) {
                            self.add(Op::ScatterAdd { axis }, vec![x, Value::of(iid), src]);
                        }
                    }
                }
            }
            22 => {
                if rank > 0 {
                    let axis = self.rng.below(rank);
                    if self.rng.chance(0.5) {
                        let descending = self.rng.chance(0.5);
                        self.add(Op::Sort { axis, descending }, vec![x]);
                    } else {
                        let k = self.rng.below(tx.shape.dims()[axis] + 1);
                        let largest = self.rng.chance(0.5);
                        self.add(Op::TopK { axis, k, largest }, vec![x]);
                    }
                }
            }
            _ => {
                let shape = random_shape(self.rng, 3);
                match self.rng.below(4) {
                    0 => {
                        let dtype = self.dtype();
                        let _ = self.constant(TensorType { dtype, shape });
                    }
                    1 if shape.rank() > 0 => {
                        let axis = self.rng.below(shape.rank());
                        let dtype = self.dtype();
                        self.add(
                            Op::Iota {
                                ty: TensorType { dtype, shape },
                                axis,
                            },
                            vec![],
                        );
                    }
                    2 => {
                        let dtype = self.rng.pick(&FLOATS);
                        let dist = self.rng.pick(RngDist::ALL);
                        let seed = self.rng.next_u64();
                        self.add(
                            Op::Rng {
                                ty: TensorType { dtype, shape },
                                dist,
                                seed,
                            },
                            vec![],
                        );
                    }
                    _ if self.allow_custom => {
                        let outputs = vec![
                            tx.clone(),
                            TensorType {
                                dtype: DType::I64,
                                shape,
                            },
                        ];
                        self.add(
                            Op::Custom {
                                name: "user.fn\"x\"".into(),
                                outputs,
                            },
                            vec![x],
                        );
                    }
                    _ => {}
                }
            }
        }
    }

    /// Reduce-then-broadcast patterns (softmax, centring, scaling by a norm) over random axes,
    /// the shapes row-persistent kernels must get right.
    fn propose_normalization(&mut self, x: Value, tx: &TensorType) {
        if !tx.dtype.is_float() || tx.shape.rank() == 0 {
            return;
        }
        let rank = tx.shape.rank();
        let mut axes: Vec<usize> = (0..rank).filter(|_| self.rng.chance(0.4)).collect();
        if axes.is_empty() {
            axes.push(rank - 1);
        }
        let keepdims = self.rng.chance(0.8);
        let first = self
            .rng
            .pick(&[ReduceOp::Max, ReduceOp::Mean, ReduceOp::Sum]);
        let Ok(m) = self.graph.add_node(
            Op::Reduce {
                op: first,
                axes: axes.clone(),
                keepdims,
            },
            vec![x],
        ) else {
            return;
        };
        let Ok(d) = self
            .graph
            .add_node(Op::Binary(BinaryOp::Sub), vec![x, Value::of(m)])
        else {
            return;
        };
        let unary = self.rng.pick(&[UnaryOp::Exp, UnaryOp::Tanh, UnaryOp::Neg]);
        let Ok(e) = self.graph.add_node(Op::Unary(unary), vec![Value::of(d)]) else {
            return;
        };
        let Ok(s) = self.graph.add_node(
            Op::Reduce {
                op: ReduceOp::Sum,
                axes,
                keepdims,
            },
            vec![Value::of(e)],
        ) else {
            return;
        };
        let combine = self
            .rng
            .pick(&[BinaryOp::Div, BinaryOp::Mul, BinaryOp::Sub]);
        if let Ok(y) = self
            .graph
            .add_node(Op::Binary(combine), vec![Value::of(e), Value::of(s)])
        {
            self.values
                .extend([Value::of(m), Value::of(s), Value::of(y)]);
        }
    }

    /// A value to pair with one of type `tx`: often a broadcast-compatible constant of its dtype.
    fn partner(&mut self, tx: &TensorType) -> Value {
        if self.rng.chance(0.3) {
            return self.any_value();
        }
        let dims: Vec<usize> = tx
            .shape
            .dims()
            .iter()
            .map(|&d| if self.rng.chance(0.3) { 1 } else { d })
            .collect();
        let skip = if dims.is_empty() {
            0
        } else {
            self.rng.below(dims.len() + 1)
        };
        let ty = TensorType {
            dtype: tx.dtype,
            shape: Shape::new(dims[skip..].to_vec()),
        };
        self.constant(ty).unwrap_or_else(|| self.any_value())
    }

    fn propose_window_op(&mut self) {
        let dtype = self.rng.pick(&[DType::F32, DType::F64]);
        let layout = self.rng.pick(Layout::ALL);
        let (n, c, h, w) = (
            1 + self.rng.below(2),
            1 + self.rng.below(4),
            1 + self.rng.below(6),
            1 + self.rng.below(6),
        );
        let dims = match layout {
            Layout::Nchw => vec![n, c, h, w],
            Layout::Nhwc => vec![n, h, w, c],
        };
        let Some(x) = self.constant(TensorType::new(dtype, dims)) else {
            return;
        };
        let stride = [1 + self.rng.below(2), 1 + self.rng.below(2)];
        let dilation = [1 + self.rng.below(2), 1 + self.rng.below(2)];
        if self.rng.chance(0.6) {
            let groups = if c % 2 == 0 && self.rng.chance(0.5) {
                2
            } else {
                1
            };
            let c_out = groups * (1 + self.rng.below(3));
            let (kh, kw) = (1 + self.rng.below(3), 1 + self.rng.below(3));
            let padding = [
                self.rng.below(2),
                self.rng.below(2),
                self.rng.below(2),
                self.rng.below(2),
            ];
            if let Some(wt) = self.constant(TensorType::new(dtype, vec![c_out, c / groups, kh, kw]))
            {
                self.add(
                    Op::Conv2d(Conv2dAttrs {
                        layout,
                        stride,
                        padding,
                        dilation,
                        groups,
                    }),
                    vec![x, wt],
                );
            }
        } else {
            let window = [1 + self.rng.below(3), 1 + self.rng.below(3)];
            let padding = [
                self.rng.below(window[0] / 2 + 1),
                self.rng.below(window[0] / 2 + 1),
                self.rng.below(window[1] / 2 + 1),
                self.rng.below(window[1] / 2 + 1),
            ];
            let attrs = Pool2dAttrs {
                kind: self.rng.pick(PoolKind::ALL),
                layout,
                window,
                stride,
                padding,
                dilation,
                count_include_pad: self.rng.chance(0.5),
            };
            self.add(Op::Pool2d(attrs), vec![x]);
        }
    }
}

/// A random f32 NHWC program, as `.kf` text: convolutions (plain, strided, dilated, padded,
/// depthwise, their weights inputs), poolings, elementwise ops with operands of every
/// broadcast rank (constants and inputs), residual adds, and outputs read through reductions
/// and permutes; images up to `side` pixels wide and high, up to `channels` channels. For
/// tests of layout assignment.
pub fn random_nhwc_program(rng: &mut Rng, side: usize, channels: usize) -> String {
    let mut text = String::new();
    let mut inputs = 0;
    let mut input = |text: &mut String, dims: &[usize]| {
        inputs += 1;
        text.push_str(&format!(
            "%i{inputs} = input() name=\"i{inputs}\" : f32{dims:?}\n"
        ));
        format!("%i{inputs}")
    };
    let (n, mut h, mut w, mut c) = (
        1 + rng.below(2),
        1 + rng.below(side),
        1 + rng.below(side),
        1 + rng.below(channels),
    );
    let mut cur = if rng.chance(0.5) {
        input(&mut text, &[n, h, w, c])
    } else {
        // An NCHW input the program permutes itself.
        let x = input(&mut text, &[n, c, h, w]);
        text.push_str(&format!("%t = permute({x}) perm=[0, 2, 3, 1]\n"));
        "%t".to_string()
    };
    let mut values: Vec<(String, [usize; 4])> = vec![(cur.clone(), [n, h, w, c])];
    let mut outputs = Vec::new();
    for step in 0..3 + rng.below(6) {
        let v = format!("%v{step}");
        match rng.below(6) {
            0 | 1 => {
                let k = rng.pick(&[1, 2, 3]);
                let stride = [1 + rng.below(2), 1 + rng.below(2)];
                let dilation = [1 + rng.below(2), 1 + rng.below(2)];
                let pad: Vec<usize> = (0..4).map(|_| rng.below(k)).collect();
                let span = |d: usize| dilation[d] * (k - 1) + 1;
                if h + pad[0] + pad[1] < span(0) || w + pad[2] + pad[3] < span(1) {
                    continue;
                }
                let depthwise = c > 1 && rng.chance(0.3);
                let (groups, c_out) = if depthwise {
                    (c, c)
                } else {
                    (1, 1 + rng.below(channels))
                };
                let wt = input(&mut text, &[c_out, c / groups, k, k]);
                text.push_str(&format!(
                    "{v} = conv2d({cur}, {wt}) layout=nhwc stride={stride:?} padding={pad:?} dilation={dilation:?} groups={groups}\n"
                ));
                h = (h + pad[0] + pad[1] - span(0)) / stride[0] + 1;
                w = (w + pad[2] + pad[3] - span(1)) / stride[1] + 1;
                c = c_out;
            }
            2 => {
                let k = 1 + rng.below(2);
                let stride = 1 + rng.below(2);
                let pad = rng.below(k);
                if h + 2 * pad < k || w + 2 * pad < k {
                    continue;
                }
                let kind = rng.pick(&["max", "avg"]);
                text.push_str(&format!(
                    "{v} = pool2d({cur}) kind={kind} layout=nhwc window=[{k}, {k}] stride=[{stride}, {stride}] padding=[{pad}, {pad}, {pad}, {pad}] dilation=[1, 1] count_include_pad={}\n",
                    rng.chance(0.5)
                ));
                h = (h + 2 * pad - k) / stride + 1;
                w = (w + 2 * pad - k) / stride + 1;
            }
            3 => {
                let op = rng.pick(&["relu", "neg", "tanh", "abs"]);
                text.push_str(&format!("{v} = {op}({cur})\n"));
            }
            4 => {
                // A broadcast operand, constant or not.
                let dims: Vec<usize> = rng.pick(&[
                    vec![],
                    vec![c],
                    vec![w, c],
                    vec![1, 1, 1, c],
                    vec![n, 1, 1, c],
                    vec![h, w, 1],
                    vec![n, h, w, c],
                ]);
                let side = if rng.chance(0.5) {
                    input(&mut text, &dims)
                } else {
                    let count: usize = dims.iter().product();
                    let values: Vec<String> = (0..count)
                        .map(|i| format!("{:?}", (i % 7) as f64 * 0.25 - 0.75))
                        .collect();
                    text.push_str(&format!(
                        "%k{step} = constant() value=[{}] : f32{dims:?}\n",
                        values.join(", ")
                    ));
                    format!("%k{step}")
                };
                let op = rng.pick(&["add", "mul", "sub", "max"]);
                let (a, b) = if rng.chance(0.5) {
                    (&cur, &side)
                } else {
                    (&side, &cur)
                };
                text.push_str(&format!("{v} = {op}({a}, {b})\n"));
            }
            _ => {
                // A residual: an earlier value of the same shape, else the value itself.
                let same = values
                    .iter()
                    .filter(|(_, d)| *d == [n, h, w, c])
                    .map(|(name, _)| name.clone())
                    .collect::<Vec<_>>();
                let other = if same.is_empty() {
                    cur.clone()
                } else {
                    rng.pick(&same)
                };
                text.push_str(&format!("{v} = add({cur}, {other})\n"));
            }
        }
        cur = v;
        values.push((cur.clone(), [n, h, w, c]));
        if rng.chance(0.3) {
            outputs.push(cur.clone());
        }
    }
    let (last, _) = values.last().expect("the input at least").clone();
    // Readers outside the region: a reduction, a permute, the value itself.
    let axes: Vec<usize> = (0..4).filter(|_| rng.chance(0.5)).collect();
    let axes = if axes.is_empty() { vec![1, 2] } else { axes };
    let op = rng.pick(&["reduce_sum", "reduce_max", "reduce_mean", "argmax"]);
    text.push_str(&format!(
        "%r = {op}({last}) axes={axes:?} keepdims={}\n",
        rng.chance(0.5)
    ));
    let perm = rng.pick(&[vec![0, 3, 1, 2], vec![3, 2, 1, 0], vec![0, 1, 2, 3]]);
    text.push_str(&format!("%p = permute({last}) perm={perm:?}\n"));
    text.push_str("output \"r\" = %r\noutput \"p\" = %p\n");
    outputs.push(last);
    for (i, o) in outputs.iter().enumerate() {
        text.push_str(&format!("output \"o{i}\" = {o}\n"));
    }
    text
}

/// A random graph from `seed` (convenience for tests).
pub fn random_graph(seed: u64, n_ops: usize) -> Graph {
    let mut rng = Rng::new(seed);
    let n_inputs = 1 + rng.below(3);
    GraphGen::new(&mut rng).generate(n_inputs, n_ops)
}

/// Mutates program text: deletes, duplicates, swaps or inserts characters and tokens, so parsers
/// and tools meet every kind of malformed input.
pub fn mutate_text(rng: &mut Rng, text: &str) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    let edits = 1 + rng.below(4);
    const NOISE: &[&str] = &[
        "%",
        "#",
        "\"",
        "[",
        "]",
        "(",
        ")",
        ",",
        "=",
        ":",
        "-",
        "1e999",
        "nan",
        "f32[",
        "\u{0}",
        "é",
        "99999999999999999999",
        "%0#7",
        "output",
        "\n",
    ];
    for _ in 0..edits {
        if chars.is_empty() {
            chars.push('%');
        }
        let at = rng.below(chars.len());
        match rng.below(5) {
            0 => {
                let len = 1 + rng.below(8).min(chars.len() - at - 1);
                chars.drain(at..at + len.min(chars.len() - at));
            }
            1 => {
                let noise = rng.pick(NOISE);
                for (k, c) in noise.chars().enumerate() {
                    chars.insert(at + k, c);
                }
            }
            2 => {
                let other = rng.below(chars.len());
                chars.swap(at, other);
            }
            3 => {
                let end = (at + 1 + rng.below(12)).min(chars.len());
                let piece: Vec<char> = chars[at..end].to_vec();
                let to = rng.below(chars.len());
                for (k, c) in piece.into_iter().enumerate() {
                    chars.insert(to + k, c);
                }
            }
            _ => {
                if chars[at].is_ascii_digit() {
                    chars[at] = char::from(b'0' + rng.below(10) as u8);
                } else {
                    chars[at] = rng.pick(&['a', '9', ' ', '.', '_', '%']);
                }
            }
        }
    }
    chars.into_iter().collect()
}

/// The line that separates a file test's input from its expected output.
pub const EXPECTED_MARKER: &str = "# ==== expected\n";

/// Whether a `KFUSE_BLESS` value asks for expected outputs to be rewritten: `1` or `true` do;
/// unset, empty, `0` and `false` do not; anything else is an error, so that a value meant to
/// turn blessing off never turns it on.
pub fn bless_requested(value: Option<&str>) -> Result<bool, String> {
    match value.map(str::trim) {
        None | Some("" | "0" | "false") => Ok(false),
        Some("1" | "true") => Ok(true),
        Some(other) => Err(format!(
            "KFUSE_BLESS={other:?}: set it to 1 or true to rewrite expected outputs, or 0, false \
             or nothing to compare them"
        )),
    }
}

/// Runs every file test in `dir`: each file holds an input whose first line is a header, then
/// [`EXPECTED_MARKER`], then the expected output of `check(header, input)`. With `KFUSE_BLESS`
/// set to `1` or `true`, expected parts are rewritten instead of compared. Panics listing every
/// failure; returns the number of files checked.
pub fn run_filetests(
    dir: &std::path::Path,
    check: impl Fn(&str, &str) -> Result<String, String>,
) -> usize {
    let value = std::env::var("KFUSE_BLESS").ok();
    let bless = bless_requested(value.as_deref()).unwrap_or_else(|e| panic!("{e}"));
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    paths.sort();
    let mut failures = Vec::new();
    for path in &paths {
        let content = std::fs::read_to_string(path).expect("test file is text");
        let Some((input, expected)) = content.split_once(EXPECTED_MARKER) else {
            failures.push(format!(
                "{}: missing the `# ==== expected` line",
                path.display()
            ));
            continue;
        };
        let header = input.lines().next().unwrap_or("").trim();
        match check(header, input) {
            Ok(actual) if actual == expected => {}
            Ok(actual) if bless => {
                std::fs::write(path, format!("{input}{EXPECTED_MARKER}{actual}"))
                    .expect("bless writes")
            }
            Ok(actual) => failures.push(format!(
                "{}:\nexpected:\n{expected}\nactual:\n{actual}",
                path.display()
            )),
            Err(e) => failures.push(format!("{}: {e}", path.display())),
        }
    }
    assert!(
        failures.is_empty(),
        "{} file test(s) failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    paths.len()
}
