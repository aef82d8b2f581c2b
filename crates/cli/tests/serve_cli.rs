//! `fp4forge serve` end to end: the binary serves a tiny model on a free loopback port, answers
//! over plain HTTP, and exits 0 after SIGTERM; a directory without a model fails with a message;
//! a `vllm serve` command line (vLLM's flag spellings, `$VLLM_API_KEY`) works as it is.

#[path = "../../server/tests/common/tiny_model.rs"]
mod tiny_model;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

/// One HTTP/1.1 request; returns the status line and the body.
fn http(addr: &str, method: &str, path: &str, body: &str) -> (String, String) {
    http_with(addr, method, path, "", body)
}

/// One HTTP/1.1 request with extra header lines (each ending in CRLF).
fn http_with(addr: &str, method: &str, path: &str, headers: &str, body: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         {headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.lines().next().unwrap_or_default().to_string();
    let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    (status, body)
}

#[test]
fn serves_and_stops_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny");
    tiny_model::write_tiny_model(&dir, 7).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fp4forge"))
        .args([
            "serve",
            dir.to_str().unwrap(),
            "--port",
            "0",
            "--threads",
            "1",
        ])
        .args(["--served-model-name", "tiny-cli", "--max-batch", "4"])
        .args(["--max-tokens-limit", "64", "--kv-dtype", "fp8"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    assert!(line.contains("model `tiny-cli`"), "{line}");
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();

    let (status, body) = http(&addr, "GET", "/health", "");
    assert!(status.contains("200"), "{status} {body}");
    let (status, body) = http(
        &addr,
        "POST",
        "/v1/completions",
        r#"{"model": "tiny-cli", "prompt": "Hello", "max_tokens": 5, "ignore_eos": true}"#,
    );
    assert!(status.contains("200"), "{status} {body}");
    assert!(body.contains("\"completion_tokens\":5"), "{body}");
    let (status, body) = http(
        &addr,
        "POST",
        "/v1/completions",
        r#"{"prompt": "Hello", "max_tokens": 65}"#,
    );
    assert!(status.contains("400"), "{status} {body}");
    assert!(body.contains("max_tokens"), "{body}");

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    assert!(status.success(), "exit {status}: {rest}");
    assert!(rest.contains("stopped"), "{rest}");
}

/// Starts `fp4forge serve` on the tiny model in `dir` with `extra` flags; returns the child, its
/// stderr and the address it listens on.
fn spawn_serve(
    dir: &std::path::Path,
    extra: &[&str],
) -> (
    std::process::Child,
    BufReader<std::process::ChildStderr>,
    String,
) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fp4forge"))
        .args([
            "serve",
            dir.to_str().unwrap(),
            "--port",
            "0",
            "--threads",
            "1",
        ])
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    (child, stderr, addr)
}

fn signal(child: &std::process::Child, name: &str) {
    let sent = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

#[test]
fn a_second_signal_exits_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny");
    tiny_model::write_tiny_model(&dir, 7).unwrap();
    let (mut child, mut stderr, addr) = spawn_serve(&dir, &["--drain-timeout", "600"]);
    // A long streamed request, in flight once its first bytes arrived.
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = r#"{"prompt": "Hello", "max_tokens": 4000, "ignore_eos": true, "stream": true}"#;
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 256];
    let n = s.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).contains("200"));
    signal(&child, "TERM");
    // The request's log line may come first.
    let mut line = String::new();
    while !line.contains("SIGTERM") {
        line.clear();
        if stderr.read_line(&mut line).unwrap() == 0 {
            break;
        }
    }
    assert!(
        line.contains("SIGTERM") && line.contains("draining"),
        "{line}"
    );
    signal(&child, "TERM");
    let status = child.wait().unwrap();
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    // 128 + SIGTERM: it did not drain the 4000 tokens and exit 0.
    assert_eq!(status.code(), Some(143), "{rest}");
    assert!(rest.contains("exiting now"), "{rest}");
}

#[test]
fn a_directory_without_a_model_fails_with_a_message() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_fp4forge"))
        .args(["serve", tmp.path().to_str().unwrap(), "--port", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tokenizer.json"), "{err}");
}

#[test]
fn a_vllm_command_line_ports_by_renaming_the_binary() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny");
    tiny_model::write_tiny_model(&dir, 7).unwrap();
    let refused = Command::new(env!("CARGO_BIN_EXE_fp4forge"))
        .args([
            "serve",
            dir.to_str().unwrap(),
            "--gpu-memory-utilization",
            "0.9",
        ])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    // (a GPU's flag: on the CPU, the default device, it is refused by name)
    assert!(
        err.contains("--gpu-memory-utilization 0.9: applies to --device cuda"),
        "{err}"
    );

    let mut child = Command::new(env!("CARGO_BIN_EXE_fp4forge"))
        .args([
            "serve",
            dir.to_str().unwrap(),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
        ])
        .args(["--served-model-name", "lean", "--max-model-len", "256"])
        .args(["--max-num-seqs", "4", "--max-num-batched-tokens", "64"])
        .args(["--kv-cache-dtype", "fp8_e4m3", "--threads", "1"])
        .env_remove("FP4FORGE_API_KEY")
        .env("VLLM_API_KEY", "sk-from-env")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    assert!(line.contains("model `lean` (context 256 tokens"), "{line}");
    assert!(line.contains("API key required"), "{line}");
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();

    let (status, body) = http(&addr, "GET", "/health", "");
    assert!(status.contains("200"), "{status} {body}");
    let (status, body) = http(&addr, "GET", "/v1/models", "");
    assert!(status.contains("401"), "{status} {body}");
    assert!(body.contains("invalid_request_error"), "{body}");
    let auth = "Authorization: Bearer sk-from-env\r\n";
    let (status, body) = http_with(&addr, "GET", "/v1/models", auth, "");
    assert!(status.contains("200"), "{status} {body}");
    assert!(body.contains("\"max_model_len\":256"), "{body}");

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    assert!(status.success(), "exit {status}");
}
