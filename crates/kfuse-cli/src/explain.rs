//! `kfuse explain`: how a program is cut into kernels, and why.

use std::fmt::Write;
use std::path::Path;

use anyhow::{Context as _, Result};
use kfuse::fusion::{partition, print_partition, KernelKind, Partition};
use kfuse::kernel::{lower, Access, Program, Step};
use kfuse::{FixedCostModel, FusePolicy, Graph};
use serde_json::json;

/// Per pass of a fused kernel over its inner space: whether the generated C runs it as 16-lane
/// vector bodies (and how many blocks of 16 per loop iteration), or why it keeps the scalar
/// loop. Empty for library and structured steps.
fn vector_passes(step: &Step) -> Vec<Result<usize, String>> {
    match step {
        Step::Kernel { kernel, .. } => kfuse::cpu::c::vector_passes(kernel),
        _ => vec![],
    }
}

/// The tile of outer × inner iterations a fused kernel's loops run in, if they run in tiles
/// (where it reads an operand across rows: a transpose).
fn tile_shape(step: &Step) -> Option<[usize; 2]> {
    match step {
        Step::Kernel { kernel, .. } => kfuse::cpu::c::tile_shape(kernel),
        _ => None,
    }
}

/// The routine a convolution step runs on in fast numerics (the default; strict numerics run
/// the reference interpreter), in words: a bare convolution's library step, or a structured
/// convolution with no depthwise half (a separable block has its own kernel).
fn conv_routine(program: &Program, step: &Step) -> Option<String> {
    use kfuse::kernel::{Anchor, StructuredCall};
    let (attrs, x, w, y, pool) = match step {
        Step::Library {
            op: kfuse::Op::Conv2d(attrs),
            inputs,
            outputs,
            ..
        } => (attrs, inputs[0], inputs[1], outputs[0], None),
        Step::Structured {
            call:
                StructuredCall {
                    anchor:
                        Anchor::Conv {
                            depthwise: None,
                            conv,
                        },
                    pool,
                    ..
                },
            inputs,
            outputs,
            ..
        } => (conv, inputs[0], inputs[1], outputs[0], pool.as_ref()),
        _ => return None,
    };
    let ty = |b| &program.buffer(b).ty;
    let (x, w) = (ty(x), ty(w));
    Some(match pool {
        Some(pool) => kfuse::routines::conv::pooled_routine(
            x.shape.dims(),
            w.shape.dims(),
            attrs,
            pool.conv_ty.shape.dims(),
            x.dtype,
            &pool.attrs,
        ),
        None => kfuse::routines::conv::routine(
            x.shape.dims(),
            w.shape.dims(),
            attrs,
            ty(y).shape.dims(),
            x.dtype,
        ),
    })
}

/// The `code:` line of a fused kernel in the text report.
fn code_line(passes: &[Result<usize, String>], tiles: Option<[usize; 2]>) -> Option<String> {
    if passes.is_empty() {
        return None;
    }
    let vector = passes.iter().filter(|p| p.is_ok()).count();
    let mut line = if vector == passes.len() {
        format!("16-lane vector bodies in every pass ({vector})")
    } else {
        format!(
            "16-lane vector bodies in {vector} of {} passes",
            passes.len()
        )
    };
    for (i, p) in passes.iter().enumerate() {
        match p {
            Err(why) => write!(line, "; pass {} scalar: {why}", i + 1).unwrap(),
            // Two is the default; more overlap long transcendental chains (or, for a maximum or
            // minimum, feed four accumulators).
            Ok(blocks) if *blocks != 2 => write!(
                line,
                "; pass {} runs {blocks} blocks of 16 per iteration",
                i + 1
            )
            .unwrap(),
            Ok(_) => {}
        }
    }
    if let Some([o, j]) = tiles {
        write!(
            line,
            "; loops in tiles of {o} rows x {j} columns (an operand is read across rows)"
        )
        .unwrap();
    }
    Some(line)
}

/// Bytes a step reads and writes, each argument counted once (its DRAM traffic if nothing stays
/// in cache between steps).
fn step_bytes(program: &Program, step: &Step) -> (usize, usize) {
    match step {
        Step::Kernel { kernel, .. } => {
            let (mut r, mut w) = (0, 0);
            for a in &kernel.args {
                match a.access {
                    Access::Read => r += a.ty.size_bytes(),
                    Access::Write => w += a.ty.size_bytes(),
                }
            }
            (r, w)
        }
        Step::Library {
            inputs, outputs, ..
        }
        | Step::Structured {
            inputs, outputs, ..
        } => (
            inputs
                .iter()
                .map(|b| program.buffer(*b).ty.size_bytes())
                .sum(),
            outputs
                .iter()
                .map(|b| program.buffer(*b).ty.size_bytes())
                .sum(),
        ),
    }
}

fn total_bytes(program: &Program) -> usize {
    program
        .steps
        .iter()
        .map(|s| step_bytes(program, s))
        .map(|(r, w)| r + w)
        .sum()
}

fn kernel_ops(graph: &Graph, p: &Partition, k: usize) -> Vec<String> {
    p.kernels[k]
        .nodes
        .iter()
        .filter(|n| !matches!(&graph.node(**n).op, kfuse::Op::Constant { .. }))
        .map(|n| format!("{} %{}", graph.node(*n).op.name(), n.0))
        .collect()
}

fn mb(bytes: usize) -> String {
    format!("{:.3} MB", bytes as f64 / 1e6)
}

pub fn explain(
    input: &Graph,
    policy: FusePolicy,
    cost: &FixedCostModel,
    as_json: bool,
    dump: Option<&Path>,
    keep_layouts: bool,
) -> Result<String> {
    let cost = cost.clone();
    // The graph passes of the default (fast) numerics, as `kfuse run` applies them.
    let pipeline = match keep_layouts {
        true => kfuse::opt::Pipeline::fast().without("conv-layout"),
        false => kfuse::opt::Pipeline::fast(),
    };
    let (optimized, trail) = pipeline.run(input)?;
    let graph = &optimized;
    let passes: Vec<(String, Vec<String>)> = trail
        .iter()
        .filter(|(_, _, report)| !report.notes.is_empty())
        .map(|(name, _, report)| (name.to_string(), report.notes.clone()))
        .collect();
    let p = partition(graph, policy, &cost);
    let program = lower(graph, &p)?;
    let unfused = lower(graph, &partition(graph, FusePolicy::None, &cost))?;
    let (fused_bytes, unfused_bytes) = (total_bytes(&program), total_bytes(&unfused));
    if let Some(dir) = dump {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        // Each file is created afresh and exclusively: a file left from an earlier dump is
        // removed first, and a symbolic link planted under its name is removed, not followed.
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            let _ = std::fs::remove_file(&path);
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .and_then(|mut file| std::io::Write::write_all(&mut file, text.as_bytes()))
                .with_context(|| format!("cannot write {}", path.display()))
        };
        write("0-input.kf", &kfuse::print_graph(input))?;
        for (i, (name, changed, _)) in trail.iter().enumerate() {
            if let Some(after) = changed {
                write(
                    &format!("0-pass{}-{name}.kf", i + 1),
                    &kfuse::print_graph(after),
                )?;
            }
        }
        write("1-partition.txt", &print_partition(graph, &p))?;
        // The compiler's vectorization report beside each kernel's C, where the compiler
        // gives one (GCC), in the default fast numerics.
        // The compiler works in the user's private kernel cache, never in a fixed shared path.
        let compiler = kfuse::cpu::Compiler::detect(kfuse::cpu::default_cache_dir()).ok();
        for step in &program.steps {
            if let Step::Kernel { kernel, .. } = step {
                write(
                    &format!("2-{}.kir", kernel.name),
                    &kfuse::kernel::text::print_kernel(kernel),
                )?;
                match kfuse::cpu::c::render(kernel) {
                    Ok(c) => {
                        write(&format!("3-{}.c", kernel.name), &c)?;
                        let report = compiler
                            .as_ref()
                            .map(|cc| cc.vectorization_report(&c, kfuse::Numerics::Fast));
                        if let Some(Ok(Some(report))) = report {
                            let mut text = report.lines.join("\n");
                            text.push('\n');
                            write(&format!("3-{}.vec.txt", kernel.name), &text)?;
                        }
                    }
                    Err(u) => write(
                        &format!("3-{}.c", kernel.name),
                        &format!(
                            "/* not rendered: {} (runs on the tile interpreter) */\n",
                            u.0
                        ),
                    )?,
                }
            }
        }
    }
    let boundaries: Vec<_> = p.stored.iter().map(|(id, why)| json!({"value": format!("%{}", id.0), "op": graph.node(*id).op.name(), "reason": why})).collect();
    if as_json {
        let kernels: Vec<_> = program
            .steps
            .iter()
            .enumerate()
            .map(|(k, step)| {
                let (r, w) = step_bytes(&program, step);
                let (kind, domain, reduce) = match &p.kernels[k].kind {
                    KernelKind::Fused { domain, reduce } => ("fused", domain.dims().to_vec(), reduce.clone()),
                    KernelKind::Library => ("library", vec![], vec![]),
                    KernelKind::Structured(_) => ("structured", vec![], vec![]),
                };
                let vector: Vec<_> = vector_passes(step)
                    .into_iter()
                    .map(|p| match p {
                        Ok(blocks) => json!({"vector": true, "blocks": blocks}),
                        Err(why) => json!({"vector": false, "why": why}),
                    })
                    .collect();
                json!({
                    "name": format!("k{k}"),
                    "kind": kind,
                    "routine": conv_routine(&program, step),
                    "passes": vector,
                    "tiles": tile_shape(step),
                    "domain": domain,
                    "reduce": reduce,
                    "ops": kernel_ops(graph, &p, k),
                    "reads": p.kernels[k].inputs.iter().map(|n| format!("%{}", n.0)).collect::<Vec<_>>(),
                    "writes": p.kernels[k].outputs.iter().map(|n| format!("%{}", n.0)).collect::<Vec<_>>(),
                    "bytes_read": r,
                    "bytes_written": w,
                })
            })
            .collect();
        let doc = json!({
            "policy": policy.name(),
            "cost_model": cost.describe_fixed(),
            "kernels": kernels,
            "unfused_kernels": unfused.steps.len(),
            "bytes_fused": fused_bytes,
            "bytes_unfused": unfused_bytes,
            "boundaries": boundaries,
            "notes": p.notes,
            "passes": passes.iter().map(|(name, notes)| json!({"pass": name, "notes": notes})).collect::<Vec<_>>(),
        });
        return Ok(serde_json::to_string_pretty(&doc)? + "\n");
    }
    let mut s = String::new();
    writeln!(s, "cost model: {}", cost.describe_fixed()).unwrap();
    for (name, notes) in &passes {
        for note in notes {
            writeln!(s, "pass {name}: {note}").unwrap();
        }
    }
    writeln!(
        s,
        "policy {}; {} kernel(s) (unfused: {}); memory traffic {} fused vs {} unfused ({:.1}x less)",
        policy.name(), program.steps.len(), unfused.steps.len(), mb(fused_bytes), mb(unfused_bytes),
        unfused_bytes as f64 / fused_bytes.max(1) as f64).unwrap();
    for (k, step) in program.steps.iter().enumerate() {
        let (r, w) = step_bytes(&program, step);
        let head = match &p.kernels[k].kind {
            KernelKind::Fused { domain, reduce } if reduce.is_empty() => {
                format!("fused kernel over {domain}")
            }
            KernelKind::Fused { domain, reduce } => {
                format!("fused row kernel over {domain}, reducing axes {reduce:?}")
            }
            KernelKind::Library => "library kernel".to_string(),
            KernelKind::Structured(group) => structured_head(graph, group),
        };
        let code = code_line(&vector_passes(step), tile_shape(step))
            .map(|c| format!("\n  code: {c}"))
            .or_else(|| {
                conv_routine(&program, step).map(|r| format!("\n  routine (fast numerics): {r}"))
            })
            .unwrap_or_default();
        writeln!(
            s,
            "\nk{k}: {head}\n  ops: {}\n  reads {} ({}), writes {} ({}){code}",
            kernel_ops(graph, &p, k).join(", "),
            p.kernels[k]
                .inputs
                .iter()
                .map(|n| format!("%{}", n.0))
                .collect::<Vec<_>>()
                .join(", "),
            mb(r),
            p.kernels[k]
                .outputs
                .iter()
                .map(|n| format!("%{}", n.0))
                .collect::<Vec<_>>()
                .join(", "),
            mb(w)
        )
        .unwrap();
    }
    writeln!(s, "\nboundaries (values stored to memory):").unwrap();
    for (id, why) in &p.stored {
        writeln!(s, "  %{} ({}): {why}", id.0, graph.node(*id).op.name()).unwrap();
    }
    for note in &p.notes {
        writeln!(s, "note: {note}").unwrap();
    }
    Ok(s)
}

/// An absorbed activation node as explain names it (a clamp with its bounds).
fn activation_name(graph: &Graph, node: kfuse::NodeId) -> String {
    <kfuse::fusion::Activation as kfuse::fusion::ActivationNode>::of_node(graph, node)
        .map_or_else(|| graph.node(node).op.name().to_string(), |a| a.describe())
}

/// What a structured kernel fused into its convolution or matmul, and how.
fn structured_head(graph: &Graph, group: &kfuse::fusion::StructuredGroup) -> String {
    let mut parts = Vec::new();
    for (side, t) in ["left", "right"].iter().zip(group.transposed) {
        if let Some(t) = t {
            parts.push(format!(
                "transpose %{} read in place through the GEMM's strides as the {side} operand (never materialized)",
                t.0
            ));
        }
    }
    if let Some(d) = group.depthwise {
        // A convolution's own bias and activation, absorbed with it.
        let own = |bias: Option<kfuse::NodeId>, activation: Option<kfuse::NodeId>| {
            let mut own = Vec::new();
            if let Some(a) = bias {
                own.push(format!("per-channel bias add %{}", a.0));
            }
            if let Some(a) = activation {
                own.push(format!("{} %{}", activation_name(graph, a), a.0));
            }
            own.join(" + ")
        };
        if let Some(e) = group.expand {
            let own = own(e.bias.map(|(add, _)| add), e.activation);
            let own = if own.is_empty() {
                String::new()
            } else {
                format!(", its {own}")
            };
            parts.push(format!(
                "expansion conv2d %{} computed band by band into cache for the depthwise one{own} (its output is never stored; the filter's halo rows are recomputed)",
                e.conv.0
            ));
        }
        let own = own(group.depthwise_bias_add, group.depthwise_activation);
        let own = if own.is_empty() {
            String::new()
        } else {
            format!(", its {own} applied to each tile in cache")
        };
        parts.push(format!(
            "depthwise conv2d %{} computed tile by tile into cache{own} and consumed there (its output is never stored)",
            d.0
        ));
    }
    let mut epilogue = Vec::new();
    if let Some(a) = group.bias_add {
        epilogue.push(format!("per-channel bias add %{}", a.0));
    }
    if let Some(m) = group.scale_mul {
        let per_column = group.scale.is_some_and(|s| graph.ty(s).shape.n_elems() > 1);
        let kind = if per_column { "per-column" } else { "scalar" };
        epilogue.push(format!("{kind} scale mul %{}", m.0));
    }
    if let Some(a) = group.residual_add {
        epilogue.push(format!("residual add %{}", a.0));
    }
    if let Some(a) = group.activation {
        epilogue.push(format!("{} %{}", activation_name(graph, a), a.0));
    }
    if !epilogue.is_empty() {
        parts.push(format!(
            "epilogue {} applied to each output tile while hot",
            epilogue.join(" + ")
        ));
    }
    if let Some(p) = group.pool {
        let what = match &graph.node(p).op {
            kfuse::Op::Pool2d(a) => format!(
                "{} pool2d %{} ({}×{} window, stride {}×{})",
                match a.kind {
                    kfuse::PoolKind::Max => "max",
                    kfuse::PoolKind::Avg => "average",
                },
                p.0,
                a.window[0],
                a.window[1],
                a.stride[0],
                a.stride[1]
            ),
            other => format!("{} %{}", other.name(), p.0),
        };
        parts.push(format!(
            "{what} applied to the convolution's rows band by band in cache (the convolution's output is never stored)"
        ));
    }
    format!(
        "structured kernel: {} %{} with {}",
        graph.node(group.anchor).op.name(),
        group.anchor.0,
        parts.join("; ")
    )
}
