//! How the binary ends: quietly with success when its reader goes away (`fp4forge inspect DIR |
//! head`), and with each cause of an error printed once.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../builder/tests/fixtures/tiny-laguna")
        .join(name)
}

fn fp4forge(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fp4forge"));
    cmd.args(args).env_remove("RUST_BACKTRACE");
    cmd
}

/// Runs `args` with stdout a pipe whose read end is already closed: every write fails with
/// EPIPE, deterministically.
fn with_closed_stdout(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    fp4forge(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

fn assert_quiet_success(what: &str, out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "{what}: {:?}\n{stderr}",
        out.status
    );
}

#[test]
fn every_printing_subcommand_exits_quietly_on_a_closed_pipe() {
    let tmp = tempfile::tempdir().unwrap();
    let bf16 = fixture("bf16");
    let (bf16, ref_qkvo) = (bf16.to_str().unwrap(), fixture("ref_qkvo"));
    let ref_qkvo = ref_qkvo.to_str().unwrap();
    let path = |name: &str| tmp.path().join(name).to_str().unwrap().to_owned();
    let (lean, synth) = (path("lean"), path("synth"));
    let cases: Vec<Vec<&str>> = vec![
        vec!["inspect", bf16],
        vec!["inspect", bf16, "--json"],
        vec!["inspect", bf16, "--against", ref_qkvo],
        vec!["verify", bf16, ref_qkvo],
        vec!["quantize", bf16, "unused", "--dry-run"],
        vec!["quantize", bf16, &lean],
        vec!["synth", &synth, "--preset", "tiny"],
        vec!["context", &synth, "--max-context", "1m"],
    ];
    for args in &cases {
        assert_quiet_success(&args.join(" "), &with_closed_stdout(args));
    }
    // The work itself was done; only the printing stopped.
    assert!(Path::new(&lean).join("model.safetensors").is_file());
}

#[test]
fn inspect_into_head_exits_zero() {
    let mut child = fp4forge(&["inspect", fixture("bf16").to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read one byte, then hang up, as `| head -c1` does.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    assert_quiet_success("inspect | head -c1", &out);
}

#[test]
fn a_cause_is_printed_once() {
    let out = fp4forge(&["inspect", "/nonexistent/fp4forge-dir"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("No such file or directory").count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("/nonexistent/fp4forge-dir"), "{stderr}");
}

#[test]
fn eval_names_an_unknown_task() {
    let out = fp4forge(&[
        "eval",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--task",
        "foo",
        "--data",
        "/nonexistent/olmo-eval",
    ])
    .output()
    .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown task `foo`"), "{stderr}");
    assert!(!stderr.contains("not found"), "{stderr}");
}
