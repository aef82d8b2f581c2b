//! What the server logs on stderr, as vLLM does: one line per request (method, path, status,
//! prompt and generated tokens where the response knows them, latency;
//! `--disable-log-requests` turns it off) and the engine's stats every few seconds while it is
//! busy (`--disable-log-stats`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use crate::generation::Usage;
use crate::metrics::Metrics;
use crate::state::AppState;

/// Logs each request once its response head is ready (a stream's tokens are not known then:
/// its line has none).
pub(crate) async fn log_requests(
    State(state): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    if !state.config.log_requests {
        return next.run(req).await;
    }
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let started = Instant::now();
    let response = next.run(req).await;
    let line = request_line(
        method.as_str(),
        &path,
        response.status().as_u16(),
        response.extensions().get::<Usage>(),
        started.elapsed(),
    );
    eprintln!("fp4forge serve: {line}");
    response
}

/// One request's log line.
fn request_line(
    method: &str,
    path: &str,
    status: u16,
    usage: Option<&Usage>,
    took: Duration,
) -> String {
    let tokens = usage
        .map(|u| {
            format!(
                " prompt_tokens={} generated_tokens={}",
                u.prompt_tokens, u.completion_tokens
            )
        })
        .unwrap_or_default();
    format!(
        "{method} {path} {status}{tokens} {:.1} ms",
        took.as_secs_f64() * 1e3
    )
}

/// The counters one stats line is the difference of.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    prompt: u64,
    generated: u64,
    queried: u64,
    reused: u64,
}

impl Totals {
    fn read(m: &Metrics) -> Self {
        Self {
            prompt: m.prompt_tokens.load(Ordering::Relaxed),
            generated: m.generation_tokens.load(Ordering::Relaxed),
            queried: m.prefix_queried_tokens.load(Ordering::Relaxed),
            reused: m.prefix_reused_tokens.load(Ordering::Relaxed),
        }
    }
}

/// Logs the engine's stats every `every` while sequences run or wait or tokens were made
/// since the last line (an idle server stays quiet), until the task is dropped.
pub(crate) async fn log_stats(metrics: Arc<Metrics>, every: Duration) {
    let mut last = Totals::read(&metrics);
    let mut at = Instant::now();
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let now = Totals::read(&metrics);
        let secs = at.elapsed().as_secs_f64().max(1e-9);
        let running = metrics.running.load(Ordering::Relaxed);
        let waiting = metrics.waiting.load(Ordering::Relaxed);
        let (prompt, generated) = (now.prompt - last.prompt, now.generated - last.generated);
        if running > 0 || waiting > 0 || prompt > 0 || generated > 0 {
            eprintln!("fp4forge serve: {}", stats_line(&metrics, last, now, secs));
        }
        last = now;
        at = Instant::now();
    }
}

/// vLLM's stats line over the `secs` between `last` and `now`.
fn stats_line(m: &Metrics, last: Totals, now: Totals, secs: f64) -> String {
    let queried = now.queried - last.queried;
    let hit_rate = if queried == 0 {
        0.0
    } else {
        (now.reused - last.reused) as f64 / queried as f64 * 100.0
    };
    format!(
        "Avg prompt throughput: {:.1} tokens/s, Avg generation throughput: {:.1} tokens/s, \
         Running: {} reqs, Waiting: {} reqs, KV cache usage: {:.1}%, Prefix cache hit rate: \
         {hit_rate:.1}%",
        (now.prompt - last.prompt) as f64 / secs,
        (now.generated - last.generated) as f64 / secs,
        m.running.load(Ordering::Relaxed),
        m.waiting.load(Ordering::Relaxed),
        m.kv_usage() * 100.0,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_line_has_method_path_status_tokens_and_latency() {
        let usage = Usage {
            prompt_tokens: 5,
            completion_tokens: 16,
            cached_tokens: None,
        };
        let took = Duration::from_micros(412_340);
        assert_eq!(
            request_line("POST", "/v1/completions", 200, Some(&usage), took),
            "POST /v1/completions 200 prompt_tokens=5 generated_tokens=16 412.3 ms"
        );
        assert_eq!(
            request_line("GET", "/health", 200, None, took),
            "GET /health 200 412.3 ms"
        );
    }

    #[test]
    fn the_stats_line_reports_rates_over_the_interval() {
        let m = Metrics::new("m");
        m.running.store(2, Ordering::Relaxed);
        let last = Totals::default();
        let now = Totals {
            prompt: 100,
            generated: 20,
            queried: 100,
            reused: 25,
        };
        let line = stats_line(&m, last, now, 2.0);
        assert!(
            line.contains("Avg prompt throughput: 50.0 tokens/s"),
            "{line}"
        );
        assert!(
            line.contains("Avg generation throughput: 10.0 tokens/s"),
            "{line}"
        );
        assert!(line.contains("Running: 2 reqs, Waiting: 0 reqs"), "{line}");
        assert!(line.contains("Prefix cache hit rate: 25.0%"), "{line}");
    }
}
