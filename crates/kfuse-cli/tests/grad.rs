//! `kfuse grad`: the joint program on standard output, clear errors for bad names.

use std::path::PathBuf;
use std::process::{Command, Output};

fn kfuse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kfuse"))
        .args(args)
        .output()
        .expect("kfuse runs")
}

fn mlp() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/programs/mlp/program.kf");
    path.display().to_string()
}

/// The fixture MLP reduced to a scalar loss, written next to the test binary.
fn program_with_loss() -> String {
    let text = std::fs::read_to_string(mlp()).unwrap();
    let text = format!(
        "{text}%total = reduce_sum(%y) axes=[0, 1]\n%loss = mul(%total, %total)\noutput \"loss\" = %loss\n"
    );
    let dir = std::env::temp_dir().join(format!("kfuse-grad-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("program.kf");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn grad_prints_the_joint_program() {
    let program = program_with_loss();
    let out = kfuse(&["grad", &program, "--of", "loss", "--wrt", "w,b"]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let graph = kfuse::parse_graph(&stdout).unwrap();
    let names: Vec<&str> = graph.outputs().iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["y", "g", "loss", "grad_w", "grad_b"]);
    let grad_w = graph
        .outputs()
        .iter()
        .find(|o| o.name == "grad_w")
        .unwrap()
        .value;
    assert_eq!(graph.ty(grad_w).to_string(), "f32[8, 5]");
}

#[test]
fn grad_names_a_bad_loss_or_input() {
    let program = program_with_loss();
    for (args, needle) in [
        (
            vec!["--of", "nope", "--wrt", "w"],
            "no output called \"nope\"",
        ),
        (
            vec!["--of", "loss", "--wrt", "w,zz"],
            "no input called \"zz\"",
        ),
        (vec!["--of", "y", "--wrt", "w"], "must be a scalar float"),
    ] {
        let mut all = vec!["grad", program.as_str()];
        all.extend(args);
        let out = kfuse(&all);
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{stderr}");
    }
}
