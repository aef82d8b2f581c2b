//! `fp4forge synth` and `fp4forge context` end to end.

use std::path::Path;
use std::process::{Command, Output};

fn fp4forge(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fp4forge"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[test]
fn synth_tiny_then_switch_its_context() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("tiny");
    let d = dst.to_str().unwrap();
    let text = ok(&fp4forge(&["synth", d, "--preset", "tiny", "--seed", "3"]));
    assert!(text.contains("wrote"), "{text}");
    assert!(dst.join("model.safetensors").is_file());

    // An existing destination needs --force.
    let again = fp4forge(&["synth", d, "--preset", "tiny"]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));
    let json = ok(&fp4forge(&[
        "synth",
        d,
        "--preset",
        "tiny",
        "--stock-nvfp4",
        "--force",
        "--json",
        "--threads",
        "2",
    ]));
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(report["stock_nvfp4"], true);

    // --preset and --config exclude each other; one is required.
    assert!(!fp4forge(&["synth", d]).status.success());
    let cfg = dst.join("config.json");
    let both = fp4forge(&[
        "synth",
        d,
        "--preset",
        "tiny",
        "--config",
        cfg.to_str().unwrap(),
    ]);
    assert!(!both.status.success());

    // A config file as the geometry.
    let from_cfg = tmp.path().join("from-config");
    ok(&fp4forge(&[
        "synth",
        from_cfg.to_str().unwrap(),
        "--config",
        cfg.to_str().unwrap(),
    ]));
    assert!(from_cfg.join("model.safetensors").is_file());

    let text = ok(&fp4forge(&["context", d, "--max-context", "1m"]));
    assert!(text.contains(": set max context 1m"), "{text}");
    let text = ok(&fp4forge(&["context", d, "--max-context", "1m"]));
    assert!(text.contains("already"), "{text}");
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(Path::new(d).join("config.json")).unwrap()).unwrap();
    assert_eq!(v["max_position_embeddings"], 1_048_576);
    assert!(!fp4forge(&["context", d, "--max-context", "2m"])
        .status
        .success());
}
