//! Programs compiled once and run many times: the handle [`Context::compile`] returns.
//!
//! Compiling partitions the graph into fused kernels, lowers them and compiles each with the
//! system C compiler (objects are cached on disk, so a kernel seen before loads without
//! compiling). Where no compiler is found, kernels run on the tile interpreter: results are the
//! same, only slower. [`Compiled::tiers`] says which ran.
//!
//! [`Context::compile`]: crate::Context::compile

use std::collections::HashSet;

use kfuse_fusion::print_partition;
use kfuse_interp::{CustomOps, InterpError};
use kfuse_ir::{Array, Graph, TensorType};
use kfuse_kernel::BufferKind;
use kfuse_runtime::{Executable, Runner, Tier};

use crate::Error;

/// One named input of a run: `("x", array)`, `(String::from("x"), array)`, or a reference to
/// either. Owned pairs move their array into the run; borrowed ones are copied, so passing
/// `[("x", array)]` rather than `&[("x", array)]` saves a copy of every input.
pub trait IntoInput: private::Sealed {
    /// The name and the array.
    fn into_input(self) -> (String, Array);
}

mod private {
    /// Keeps [`IntoInput`](super::IntoInput) implemented only here, so that adding forms later
    /// breaks no one.
    pub trait Sealed {}
}

impl<N: AsRef<str>> private::Sealed for (N, Array) {}
impl<N: AsRef<str>> private::Sealed for &(N, Array) {}

impl<N: AsRef<str>> IntoInput for (N, Array) {
    fn into_input(self) -> (String, Array) {
        (self.0.as_ref().to_string(), self.1)
    }
}

impl<N: AsRef<str>> IntoInput for &(N, Array) {
    fn into_input(self) -> (String, Array) {
        (self.0.as_ref().to_string(), self.1.clone())
    }
}

/// Collects the inputs of a run into the runtime's form.
pub(crate) fn collect_inputs(
    inputs: impl IntoIterator<Item = impl IntoInput>,
) -> Vec<(String, Array)> {
    inputs.into_iter().map(IntoInput::into_input).collect()
}

/// The inputs a program is run with, checked the way the reference interpreter checks them:
/// every name must be an input of the context (inputs the program does not read are accepted
/// and ignored), and every input the program reads must be given with its declared type.
pub(crate) struct InputCheck {
    /// The inputs of the extracted graph: the ones the outputs depend on.
    pub(crate) needed: Vec<(String, TensorType)>,
    /// Every input of the context, with its type, for the "unknown input" message.
    pub(crate) known: Vec<(String, TensorType)>,
}

impl InputCheck {
    /// The inputs the program reads, in the order given; an error for an unknown name, a
    /// missing input or a wrong type.
    pub(crate) fn bind(&self, inputs: Vec<(String, Array)>) -> Result<Vec<(String, Array)>, Error> {
        for (name, _) in &inputs {
            if !self.known.iter().any(|(n, _)| n == name) {
                let known: Vec<String> = self
                    .known
                    .iter()
                    .map(|(n, t)| format!("{n:?}: {t}"))
                    .collect();
                return Err(InterpError::UnknownInput {
                    name: name.clone(),
                    known: known.join(", "),
                }
                .into());
            }
        }
        for (name, ty) in &self.needed {
            match inputs.iter().rev().find(|(n, _)| n == name) {
                None => {
                    return Err(InterpError::MissingInput {
                        name: name.clone(),
                        expected: ty.clone(),
                    }
                    .into())
                }
                Some((_, a)) if a.ty() != *ty => {
                    return Err(InterpError::InputType {
                        name: name.clone(),
                        expected: ty.clone(),
                        found: a.ty(),
                    }
                    .into())
                }
                Some(_) => {}
            }
        }
        Ok(inputs
            .into_iter()
            .filter(|(n, _)| self.needed.iter().any(|(m, _)| m == n))
            .collect())
    }
}

/// A program compiled into kernels, to run as many times as needed with new inputs (what
/// `torch.compile` and `jax.jit` return). It holds no reference to the [`Context`] it came
/// from, and it is `Send` and `Sync`: threads can share one and run it at the same time.
///
/// [`Context`]: crate::Context
///
/// ```
/// use kfuse::{Array, Context, DType};
///
/// let cx = Context::new();
/// let x = cx.input("x", DType::F32, &[4]);
/// let y = (&x * 2.0 + 1.0).relu();
/// let f = cx.compile(&[("y", &y)]).unwrap();
/// assert_eq!(f.kernel_count(), 1);
/// let a = Array::from_vec(vec![4], vec![-1.0f32, 0.0, 1.0, 2.0]).unwrap();
/// assert_eq!(f.run([("x", a)]).unwrap()[0].as_slice::<f32>().unwrap(), &[0.0, 1.0, 3.0, 5.0]);
/// let b = Array::from_vec(vec![4], vec![10.0f32; 4]).unwrap();
/// assert_eq!(f.run([("x", b)]).unwrap()[0].as_slice::<f32>().unwrap(), &[21.0; 4]);
/// ```
pub struct Compiled {
    executable: Executable,
    custom: CustomOps,
    inputs: InputCheck,
    /// The inputs the program still reads after the graph passes (a pass may fold one away).
    program_inputs: HashSet<String>,
}

impl Compiled {
    pub(crate) fn new(executable: Executable, custom: CustomOps, inputs: InputCheck) -> Compiled {
        let program_inputs = executable
            .program
            .buffers
            .iter()
            .filter_map(|b| match &b.kind {
                BufferKind::Input(name) => Some(name.clone()),
                _ => None,
            })
            .collect();
        Compiled {
            executable,
            custom,
            inputs,
            program_inputs,
        }
    }

    /// Runs the program on named inputs and returns the outputs in the order they were given to
    /// [`Context::compile`](crate::Context::compile). Each run allocates its buffers afresh; a
    /// loop that runs the program many times keeps them with [`Compiled::runner`].
    pub fn run(
        &self,
        inputs: impl IntoIterator<Item = impl IntoInput>,
    ) -> Result<Vec<Array>, Error> {
        self.runner().run(inputs)
    }

    /// A runner that keeps the program's buffers allocated between runs.
    ///
    /// ```
    /// use kfuse::{Array, Context, DType};
    ///
    /// let cx = Context::new();
    /// let x = cx.input("x", DType::F64, &[3]);
    /// let f = cx.compile(&[("y", &x.exp())]).unwrap();
    /// let mut runner = f.runner();
    /// for k in 0..3 {
    ///     let out = runner.run([("x", Array::from_vec(vec![3], vec![k as f64; 3]).unwrap())]).unwrap();
    ///     assert!((out[0].as_slice::<f64>().unwrap()[0] - (k as f64).exp()).abs() < 1e-12);
    /// }
    /// ```
    pub fn runner(&self) -> CompiledRunner<'_> {
        CompiledRunner {
            compiled: self,
            runner: self.executable.runner(),
        }
    }

    /// How many kernels the program became: fused kernels plus library and structured steps
    /// (a matmul with its epilogue, a sort), one per launch. `a + b + c` is one kernel.
    pub fn kernel_count(&self) -> usize {
        self.executable.program.steps.len()
    }

    /// The partition as text, as `kfuse explain` prints it: the graph passes that rewrote
    /// something, then one line per kernel with its ops, reads and writes, and the reason each
    /// stored value is stored. Node numbers refer to [`Compiled::graph`].
    pub fn explain(&self) -> String {
        let mut text: String = self
            .executable
            .passes
            .iter()
            .map(|p| format!("pass {p}\n"))
            .collect();
        text += &print_partition(&self.executable.graph, &self.executable.partition);
        text
    }

    /// The graph after the graph passes, the one the kernels compute.
    pub fn graph(&self) -> &Graph {
        &self.executable.graph
    }

    /// How each step runs: compiled C, or the tile interpreter and why; `None` for library
    /// steps.
    pub fn tiers(&self) -> &[Option<Tier>] {
        &self.executable.tiers
    }

    /// The runtime's compiled form, for what this handle does not show (the lowered program,
    /// compile time).
    pub fn executable(&self) -> &Executable {
        &self.executable
    }
}

/// Runs a [`Compiled`] program repeatedly, keeping its buffers allocated between runs.
pub struct CompiledRunner<'a> {
    compiled: &'a Compiled,
    runner: Runner<'a>,
}

impl CompiledRunner<'_> {
    /// As [`Compiled::run`], reusing this runner's buffers.
    pub fn run(
        &mut self,
        inputs: impl IntoIterator<Item = impl IntoInput>,
    ) -> Result<Vec<Array>, Error> {
        let compiled = self.compiled;
        let bound: Vec<(String, Array)> = compiled
            .inputs
            .bind(collect_inputs(inputs))?
            .into_iter()
            .filter(|(name, _)| compiled.program_inputs.contains(name))
            .collect();
        self.runner.run(&bound, &compiled.custom)?;
        // The program's outputs are the graph's, in the order the caller named them.
        Ok(self
            .runner
            .outputs(&bound)
            .into_iter()
            .map(|(_, array)| array)
            .collect())
    }
}
