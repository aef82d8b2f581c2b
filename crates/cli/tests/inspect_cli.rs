//! `fp4forge inspect` end to end on the Laguna-S-2.1 config fixtures.

use std::path::PathBuf;
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../builder/tests/fixtures")
        .join(name)
        .join("config.json")
}

fn inspect(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fp4forge"))
        .arg("inspect")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn stock_against_lean_as_text_and_json() {
    let (stock, lean) = (fixture("laguna-s-2.1"), fixture("laguna-s-2.1-lean"));
    let (stock, lean) = (stock.to_str().unwrap(), lean.to_str().unwrap());
    let out = inspect(&[
        stock,
        "--against",
        lean,
        "--hardware",
        "gb10",
        "--hardware",
        "X=1000",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("9.906 GB -> 5.890 GB"), "{text}");
    assert!(
        text.contains("GB10") && text.contains("X ") && !text.contains("H200"),
        "{text}"
    );

    let out = inspect(&[stock, "--json"]);
    assert!(out.status.success());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["totals"]["params"], 117_561_977_600u64);
    assert_eq!(json["roofline"].as_array().unwrap().len(), 4);
}

#[test]
fn bad_input_fails_with_a_message() {
    let stock = fixture("laguna-s-2.1");
    let out = inspect(&[stock.to_str().unwrap(), "--hardware", "nonesuch"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nonesuch"));
    let out = inspect(&["/nonexistent/dir"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/dir"));
}
