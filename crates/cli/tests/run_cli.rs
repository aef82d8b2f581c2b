//! `fp4forge run` through the binary on the tiny Laguna fixture: `--json` gives one object with
//! the speeds the CPU benchmark reads, `--ignore-eos` generates exactly `--max-tokens`, and
//! `--cpu-isa` selects the kernels (or is refused by name), `--cpu-activations int8` the W4A8
//! decode (named in the backend).

use std::path::PathBuf;
use std::process::{Command, Output};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/tiny-laguna-lean")
}

fn run(extra: &[&str]) -> Output {
    let dir = fixture();
    let mut args = vec![
        "run",
        dir.to_str().expect("fixture path is UTF-8"),
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "6",
        "--ignore-eos",
        "--json",
        "--threads",
        "2",
    ];
    args.extend_from_slice(extra);
    Command::new(env!("CARGO_BIN_EXE_fp4forge"))
        .args(&args)
        .output()
        .expect("runs fp4forge")
}

fn report(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().next().expect("one line on stdout");
    serde_json::from_str(line).expect("stdout is one JSON object")
}

#[test]
fn json_report_and_ignore_eos() {
    let r = report(&run(&["--cpu-isa", "portable"]));
    assert_eq!(r["backend"], "cpu");
    assert_eq!(r["tokens"].as_array().map(Vec::len), Some(6));
    assert_eq!(r["decode_steps"], 5);
    assert_eq!(r["prompt_tokens"], 3);
    assert_eq!(r["stop"], "max tokens");
    for key in [
        "prefill_tokens_per_second",
        "decode_tokens_per_second",
        "load_seconds",
    ] {
        assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key}: {r}");
    }
}

#[test]
fn cpu_isa_selects_the_kernels_or_is_refused() {
    let auto = report(&run(&[]));
    let backend = auto["backend"].as_str().unwrap_or_default().to_string();
    assert!(backend.starts_with("cpu"), "{backend}");
    if backend == "cpu-avx512" || backend == "cpu-avx2" {
        assert_eq!(report(&run(&["--cpu-isa", "avx2"]))["backend"], "cpu-avx2");
    }
    if backend != "cpu-avx512" {
        let out = run(&["--cpu-isa", "avx512"]);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("--cpu-isa avx512"));
    }
    let out = run(&["--cpu-isa", "sse9"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sse9") && err.contains("avx2"), "{err}");
}

/// `--cpu-activations int8` runs (the backend says so) on every kernel set, and the same prompt
/// gives the same tokens with the portable and the SIMD kernels' int8 path on this tiny model;
/// an unknown type is refused by name.
#[test]
fn cpu_activations_int8_runs_and_is_named() {
    let int8 = report(&run(&["--cpu-activations", "int8"]));
    let backend = int8["backend"].as_str().unwrap_or_default();
    assert!(
        backend.starts_with("cpu") && backend.ends_with("-int8"),
        "{backend}"
    );
    assert_eq!(int8["tokens"].as_array().map(Vec::len), Some(6));
    let portable = report(&run(&[
        "--cpu-activations",
        "int8",
        "--cpu-isa",
        "portable",
    ]));
    assert_eq!(portable["backend"], "cpu-int8");
    assert_eq!(portable["tokens"], int8["tokens"]);
    let f32 = report(&run(&[]));
    assert!(!f32["backend"]
        .as_str()
        .unwrap_or("-int8")
        .ends_with("-int8"));
    let out = run(&["--cpu-activations", "fp4"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("fp4") && err.contains("int8"), "{err}");
}
