//! The `kfuse` command-line tool.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context as _, Result};
use clap::{Parser, Subcommand};
use kfuse::{Array, CustomOps, Graph};

mod demo;

#[derive(Parser)]
#[command(
    name = "kfuse",
    version,
    about = "kfuse: a tensor compiler and runtime"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a .kf program on .npy/.npz inputs and write one NAME.npy per output.
    Run {
        /// The program, in the .kf text form.
        program: PathBuf,
        /// An input binding NAME=FILE.npy (repeatable).
        #[arg(long = "input", value_name = "NAME=FILE.npy")]
        inputs: Vec<String>,
        /// An .npz archive whose arrays bind inputs by name (repeatable).
        #[arg(long = "inputs-npz", value_name = "FILE.npz")]
        npz: Vec<PathBuf>,
        /// Where to write the outputs (created if missing).
        #[arg(long, value_name = "DIR")]
        output_dir: PathBuf,
    },
    /// Verify a .kf program and print it with inferred types.
    Check {
        /// The program, in the .kf text form.
        program: PathBuf,
    },
    /// Run a built-in program on built-in data and show what happened.
    Demo {
        /// Also write the demo's program and outputs into this directory.
        #[arg(long, value_name = "DIR")]
        output_dir: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run {
            program,
            inputs,
            npz,
            output_dir,
        } => run(&program, &inputs, &npz, &output_dir),
        Command::Check { program } => check(&program),
        Command::Demo { output_dir } => demo::demo(output_dir.as_deref()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Reads and parses a program; parse errors carry `file:line:col`.
fn load_program(path: &Path) -> Result<Graph> {
    let text = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let text = String::from_utf8(text).map_err(|e| {
        anyhow::anyhow!(
            "{}: not UTF-8 text (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })?;
    kfuse::parse_graph(&text).map_err(|e| anyhow::anyhow!(e.in_file(&path.display().to_string())))
}

fn check(path: &Path) -> Result<()> {
    let graph = load_program(path)?;
    graph.verify()?;
    print!("{}", kfuse::print_graph(&graph));
    let inputs: Vec<String> = graph
        .inputs()
        .map(|(_, n, t)| format!("{n}: {t}"))
        .collect();
    let outputs: Vec<String> = graph
        .outputs()
        .iter()
        .map(|o| format!("{}: {}", o.name, graph.ty(o.value)))
        .collect();
    eprintln!(
        "ok: {} nodes; inputs [{}]; outputs [{}]",
        graph.nodes().len(),
        inputs.join(", "),
        outputs.join(", ")
    );
    Ok(())
}

/// Output names become file names; refuse any that could escape the directory.
fn output_file(dir: &Path, name: &str) -> Result<PathBuf> {
    let bad = name.is_empty()
        || name == "."
        || name == ".."
        || name
            .chars()
            .any(|c| matches!(c, '/' | '\\' | '\0') || c.is_control());
    if bad {
        bail!(
            "output name {name:?} cannot be used as a file name; rename the output in the program"
        );
    }
    Ok(dir.join(format!("{name}.npy")))
}

fn run(program: &Path, bindings: &[String], npz: &[PathBuf], output_dir: &Path) -> Result<()> {
    let graph = load_program(program)?;
    let mut inputs: Vec<(String, Array)> = Vec::new();
    for path in npz {
        let arrays = kfuse::npy::load_npz(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        inputs.extend(arrays);
    }
    for binding in bindings {
        let (name, file) = binding
            .split_once('=')
            .with_context(|| format!("--input {binding:?}: expected NAME=FILE.npy"))?;
        let array = kfuse::npy::load_npy(Path::new(file))
            .with_context(|| format!("cannot read {file} (input {name:?})"))?;
        inputs.retain(|(n, _)| n != name);
        inputs.push((name.to_string(), array));
    }
    // Validate every output name before computing anything.
    let files: Vec<PathBuf> = graph
        .outputs()
        .iter()
        .map(|o| output_file(output_dir, &o.name))
        .collect::<Result<_>>()?;
    let outputs = kfuse::run_graph(&graph, &inputs, &CustomOps::new())?;
    std::fs::create_dir_all(output_dir)
        .with_context(|| format!("cannot create {}", output_dir.display()))?;
    for ((name, array), file) in outputs.iter().zip(&files) {
        kfuse::npy::save_npy(file, array)
            .with_context(|| format!("cannot write {}", file.display()))?;
        println!("{name}: {} -> {}", array.ty(), file.display());
    }
    Ok(())
}
