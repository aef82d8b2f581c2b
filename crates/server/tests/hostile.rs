//! Hostile clients at the HTTP level, over raw TCP: requests hyper cannot parse get OpenAI's
//! error JSON (not an empty 400/431), a half-sent head is cut off by the header read timeout, a
//! half-sent body gets a 408, connections beyond `max_connections` get a 503, and a fuzzer of
//! mutated request heads (proptest) never gets an empty error, a 5xx or a dead server.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::TestServer;
use proptest::prelude::*;
use serde_json::Value;

/// The address of `s` (`127.0.0.1:PORT`).
fn addr(s: &TestServer) -> String {
    s.base.trim_start_matches("http://").to_string()
}

fn connect(addr: &str) -> TcpStream {
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    tcp
}

/// Sends `bytes` and reads until the server closes the connection (or 20 s pass): the status
/// code and the body, `None` when it closed without a response.
fn exchange(addr: &str, bytes: &[u8]) -> Option<(u16, String)> {
    let mut tcp = connect(addr);
    // The server may answer and close before all of a huge request is sent.
    let _ = tcp.write_all(bytes);
    read_response(&mut tcp)
}

/// Reads one response to the end of the connection.
fn read_response(tcp: &mut TcpStream) -> Option<(u16, String)> {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match tcp.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && !out.is_empty() => break,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
            Err(e) => panic!("reading the response: {e}"),
        }
    }
    if out.is_empty() {
        return None;
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    // The first response only (a pipelined rest of the request may get a second one).
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let length = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(rest.len());
    let body = rest.get(..length).unwrap_or(rest).to_string();
    Some((status, body))
}

/// Asserts `body` is OpenAI's error JSON and returns its message.
fn error_message(status: u16, body: &str) -> String {
    let v: Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("{status}: body {body:?} is not JSON: {e}"));
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty(), "{status}: {v}");
    assert!(v["error"]["type"].is_string(), "{status}: {v}");
    message.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_hyper_cannot_parse_get_openai_errors() {
    let s = TestServer::start(|c| c).await;
    let a = addr(&s);
    let many_headers: String = (0..500).map(|i| format!("X-H{i}: v\r\n")).collect();
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "garbage request line",
            b"GARBAGE\x01\x02 NONSENSE\r\n\r\n".to_vec(),
            400,
            "not valid HTTP/1.1",
        ),
        (
            "Content-Length: abc",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n".to_vec(),
            400,
            "not valid HTTP/1.1",
        ),
        (
            "500 headers",
            format!("GET /health HTTP/1.1\r\nHost: x\r\n{many_headers}\r\n").into_bytes(),
            431,
            "at most 100 headers",
        ),
        (
            "a 1 MB header",
            format!(
                "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
                "a".repeat(1 << 20)
            )
            .into_bytes(),
            431,
            "too large",
        ),
        (
            "a space in the URI",
            b"GET /he alth HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            400,
            "not valid HTTP/1.1",
        ),
    ];
    for (what, bytes, status, says) in cases {
        let a = a.clone();
        let got = tokio::task::spawn_blocking(move || exchange(&a, &bytes))
            .await
            .unwrap();
        let (code, body) = got.unwrap_or_else(|| panic!("{what}: no response"));
        assert_eq!(code, status, "{what}: {body}");
        let message = error_message(code, &body);
        assert!(message.contains(says), "{what}: {message}");
        let (ok, _) = s.get_text("/health").await;
        assert_eq!(ok, 200, "after {what}");
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_heads_are_cut_off_and_half_sent_bodies_get_408() {
    let s = TestServer::start(|c| {
        c.header_read_timeout(Duration::from_millis(300))
            .body_read_timeout(Duration::from_millis(300))
    })
    .await;
    let a = addr(&s);
    let head = tokio::task::spawn_blocking({
        let a = a.clone();
        move || {
            let mut tcp = connect(&a);
            tcp.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
                .unwrap();
            let start = Instant::now();
            (read_response(&mut tcp), start.elapsed())
        }
    });
    let body = tokio::task::spawn_blocking(move || {
        let mut tcp = connect(&a);
        tcp.write_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro",
        )
        .unwrap();
        read_response(&mut tcp)
    });
    // Closed by the server (without waiting for the test's own 20 s read timeout).
    let (response, waited) = head.await.unwrap();
    assert!(waited < Duration::from_secs(15), "{waited:?} {response:?}");
    if let Some((code, body)) = response {
        assert_eq!(code, 408, "{body}");
        error_message(code, &body);
    }
    let (code, body) = body.await.unwrap().expect("a 408");
    assert_eq!(code, 408, "{body}");
    assert!(error_message(code, &body).contains("--body-read-timeout"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limit_get_503() {
    let s = TestServer::start(|c| c.max_connections(2)).await;
    let a = addr(&s);
    let held: Vec<TcpStream> = (0..2).map(|_| connect(&a)).collect();
    // The two are accepted first (the kernel queues connections in order).
    let third = {
        let a = a.clone();
        tokio::task::spawn_blocking(move || {
            let mut tcp = connect(&a);
            read_response(&mut tcp)
        })
    };
    let (code, body) = third.await.unwrap().expect("a 503");
    assert_eq!(code, 503, "{body}");
    assert!(error_message(code, &body).contains("--max-connections"));
    drop(held);
    // Their slots come back once they are closed.
    let start = Instant::now();
    loop {
        let a = a.clone();
        let got = tokio::task::spawn_blocking(move || {
            exchange(
                &a,
                b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            )
        })
        .await
        .unwrap();
        if matches!(got, Some((200, _))) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{got:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.stop().await;
}

/// A valid request head, and mutations of it: bytes replaced, inserted or cut, headers
/// duplicated or given hostile values.
fn mutated_head() -> impl Strategy<Value = Vec<u8>> {
    let base = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                Content-Length: 2\r\n\r\n{}"
        .as_bytes()
        .to_vec();
    let edit = prop_oneof![
        (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(i, b)| (0u8, i, vec![b])),
        (
            any::<prop::sample::Index>(),
            prop::collection::vec(any::<u8>(), 1..40)
        )
            .prop_map(|(i, bs)| (1u8, i, bs)),
        any::<prop::sample::Index>().prop_map(|i| (2u8, i, Vec::new())),
        (
            prop::sample::select(vec![
                "Content-Length: -1",
                "Content-Length: 99999999999999999999999",
                "Content-Length: 1, 2",
                "Transfer-Encoding: chunked",
                "Transfer-Encoding: gzip, chunked",
                "Expect: 100-continue",
                "Connection: upgrade",
                "Upgrade: h2c",
                "Host:",
                ": empty-name",
                "X\u{0}Nul: v",
                "X-Long: ",
            ]),
            0usize..3000,
            any::<prop::sample::Index>()
        )
            .prop_map(|(h, pad, i)| {
                let mut v = h.as_bytes().to_vec();
                if h.ends_with(' ') {
                    v.extend(std::iter::repeat_n(b'a', pad));
                }
                (3u8, i, v)
            }),
    ];
    prop::collection::vec(edit, 1..4).prop_map(move |edits| {
        let mut head = base.clone();
        for (kind, at, bytes) in edits {
            let i = at.index(head.len().max(1));
            match kind {
                0 => head[i] = bytes[0],
                1 => {
                    head.splice(i..i, bytes);
                }
                2 => head.truncate(i.max(1)),
                _ => {
                    let line_end = head
                        .windows(2)
                        .position(|w| w == b"\r\n")
                        .map_or(0, |p| p + 2);
                    let mut line = bytes;
                    line.extend_from_slice(b"\r\n");
                    head.splice(line_end..line_end, line);
                }
            }
        }
        head
    })
}

#[test]
fn header_fuzzer_gets_openai_errors_and_a_live_server() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let s = runtime.block_on(TestServer::start(|c| {
        c.header_read_timeout(Duration::from_millis(500))
            .body_read_timeout(Duration::from_millis(500))
    }));
    let a = addr(&s);
    let config = ProptestConfig {
        cases: 96,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(head in mutated_head())| {
        let mut tcp = connect(&a);
        let _ = tcp.write_all(&head);
        // Half-close: a head cut short is complete as far as it goes.
        let _ = tcp.shutdown(std::net::Shutdown::Write);
        if let Some((code, body)) = read_response(&mut tcp) {
            prop_assert!(code < 500, "{code} for {:?}: {body}", String::from_utf8_lossy(&head));
            if code >= 400 {
                let v: Value = serde_json::from_str(&body).map_err(|e| {
                    TestCaseError::fail(format!(
                        "{code} for {:?}: body {body:?} is not JSON: {e}",
                        String::from_utf8_lossy(&head)
                    ))
                })?;
                prop_assert!(v["error"]["message"].is_string(), "{code}: {v}");
            }
        }
        let alive = exchange(&a, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        prop_assert!(matches!(alive, Some((200, _))), "{alive:?}");
    });
    runtime.block_on(s.stop());
}

/// `--load-format copy`: the weights are read into memory, so truncating the checkpoint's files
/// while serving (which SIGBUSes a memory-mapped server) changes nothing.
#[tokio::test]
async fn a_copied_model_survives_its_files_being_truncated() {
    let s = TestServer::start(|c| c.load_format(fp4forge_engine::LoadFormat::Copy)).await;
    let body = serde_json::json!({"prompt": "The quick brown", "max_tokens": 4, "temperature": 0});
    let (status, before) = s.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{before}");
    let mut truncated = 0;
    for entry in std::fs::read_dir(&s.dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(0)
                .unwrap();
            truncated += 1;
        }
    }
    assert!(truncated > 0);
    let (status, after) = s.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{after}");
    assert_eq!(after["choices"][0]["text"], before["choices"][0]["text"]);
    s.stop().await;
}
