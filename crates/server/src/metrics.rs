//! Counters, gauges and histograms, rendered as Prometheus text (`GET /metrics`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds (seconds) of the latency histograms' buckets.
const LATENCY_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Upper bounds (seconds) of the engine-step histograms' buckets: finer than the latencies',
/// a batched decode step takes a few milliseconds.
const STEP_BUCKETS: [f64; 18] = [
    0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.025, 0.03,
    0.05, 0.1, 0.25, 1.0, 5.0,
];

/// The finish reasons of `fp4forge_request_success_total`, as vLLM names them.
pub(crate) const FINISH_REASONS: [&str; 3] = ["stop", "length", "abort"];

/// A cumulative histogram with fixed buckets.
pub(crate) struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    count: AtomicU64,
    /// Sum in microseconds.
    sum_us: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
        }
    }

    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|&b| s <= b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(
            d.as_micros().min(u128::from(u64::MAX)) as u64,
            Ordering::Relaxed,
        );
    }

    fn render(&self, out: &mut String, model: &str, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut acc = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            acc += c.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{model_name=\"{model}\",le=\"{b}\"}} {acc}"
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "{name}_bucket{{model_name=\"{model}\",le=\"+Inf\"}} {count}"
        );
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum{{model_name=\"{model}\"}} {sum}");
        let _ = writeln!(out, "{name}_count{{model_name=\"{model}\"}} {count}");
    }
}

/// Everything `/metrics` reports. Shared by the HTTP handlers and the engine thread.
pub(crate) struct Metrics {
    model: String,
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    /// Prompt tokens prefilled.
    pub prompt_tokens: AtomicU64,
    /// Tokens generated.
    pub generation_tokens: AtomicU64,
    /// Requests waiting for a batch slot.
    pub waiting: AtomicUsize,
    /// Sequences in the running batch.
    pub running: AtomicUsize,
    /// Engine steps (batched forward passes).
    pub steps: AtomicU64,
    /// Rows over all engine steps (tokens processed).
    pub step_rows: AtomicU64,
    /// Requests that started from a cached prefix.
    pub prefix_hits: AtomicU64,
    /// Prompt tokens taken from the prefix cache instead of prefilled.
    pub prefix_reused_tokens: AtomicU64,
    /// Bytes of KV storage the prefix cache holds.
    pub prefix_cache_bytes: AtomicUsize,
    /// Finished sequences the prefix cache holds.
    pub prefix_cache_entries: AtomicUsize,
    /// Sequences cancelled because their client went away.
    pub cancelled: AtomicU64,
    /// Sequences that ended normally, by finish reason (see [`FINISH_REASONS`]).
    success: [AtomicU64; FINISH_REASONS.len()],
    /// Requests looked up in the prefix cache.
    pub prefix_queries: AtomicU64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queried_tokens: AtomicU64,
    /// Tokens held in the KV caches of the running sequences.
    pub kv_tokens: AtomicUsize,
    /// Tokens the running batch can hold at most (most sequences × the context).
    pub kv_capacity: AtomicUsize,
    /// Bytes the KV caches hold (running sequences and prefix-cache entries), where the
    /// backend pools them (a GPU).
    pub kv_used_bytes: AtomicUsize,
    /// Bytes the KV caches may hold in all (0: no cap).
    pub kv_capacity_bytes: AtomicUsize,
    /// Running sequences preempted (their KV cache given back, recomputed later).
    pub preemptions: AtomicU64,
    /// Time from a request's arrival to its first generated token.
    pub ttft: Histogram,
    /// Time between consecutive generated tokens of a sequence.
    pub itl: Histogram,
    /// Time from arrival to the last token.
    pub e2e: Histogram,
    /// One engine step: admission, the forward pass, the new tokens delivered.
    pub engine_step: Histogram,
    /// The forward pass of one engine step (the model's call, the device's work included).
    pub forward: Histogram,
}

impl Metrics {
    /// Empty metrics for the served model `model`.
    pub fn new(model: &str) -> Self {
        Self {
            model: model.replace(['\\', '"', '\n'], "_"),
            requests: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            steps: AtomicU64::new(0),
            step_rows: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            success: Default::default(),
            prefix_queries: AtomicU64::new(0),
            prefix_queried_tokens: AtomicU64::new(0),
            kv_tokens: AtomicUsize::new(0),
            kv_capacity: AtomicUsize::new(0),
            kv_used_bytes: AtomicUsize::new(0),
            kv_capacity_bytes: AtomicUsize::new(0),
            preemptions: AtomicU64::new(0),
            prefix_hits: AtomicU64::new(0),
            prefix_reused_tokens: AtomicU64::new(0),
            prefix_cache_bytes: AtomicUsize::new(0),
            prefix_cache_entries: AtomicUsize::new(0),
            ttft: Histogram::new(&LATENCY_BUCKETS),
            itl: Histogram::new(&LATENCY_BUCKETS),
            e2e: Histogram::new(&LATENCY_BUCKETS),
            engine_step: Histogram::new(&STEP_BUCKETS),
            forward: Histogram::new(&STEP_BUCKETS),
        }
    }

    /// Counts one finished HTTP request.
    pub fn request(&self, endpoint: &str, status: u16) {
        let mut map = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        *map.entry((endpoint.to_string(), status)).or_insert(0) += 1;
    }

    /// Counts one sequence that ended normally with `reason` (one of [`FINISH_REASONS`]).
    pub fn success(&self, reason: &str) {
        if let Some(i) = FINISH_REASONS.iter().position(|r| *r == reason) {
            self.success[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The fraction (0 to 1) of the KV capacity in use: bytes of the capped KV memory where
    /// there is one (a GPU), else tokens of the running batch over its most.
    pub fn kv_usage(&self) -> f64 {
        let cap = self.kv_capacity_bytes.load(Ordering::Relaxed);
        if cap > 0 {
            return self.kv_used_bytes.load(Ordering::Relaxed) as f64 / cap as f64;
        }
        let cap = self.kv_capacity.load(Ordering::Relaxed);
        if cap == 0 {
            return 0.0;
        }
        self.kv_tokens.load(Ordering::Relaxed) as f64 / cap as f64
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let model = &self.model;
        let _ = writeln!(
            out,
            "# HELP fp4forge_requests_total HTTP requests by endpoint and status."
        );
        let _ = writeln!(out, "# TYPE fp4forge_requests_total counter");
        {
            let map = self.requests.lock().unwrap_or_else(|p| p.into_inner());
            for ((endpoint, status), n) in map.iter() {
                let _ = writeln!(
                    out,
                    "fp4forge_requests_total{{model_name=\"{model}\",endpoint=\"{endpoint}\",\
                     status=\"{status}\"}} {n}"
                );
            }
        }
        let counters = [
            (
                "fp4forge_prompt_tokens_total",
                "Prompt tokens of the requests served (those taken from the prefix cache included).",
                self.prompt_tokens.load(Ordering::Relaxed),
            ),
            (
                "fp4forge_generation_tokens_total",
                "Tokens generated.",
                self.generation_tokens.load(Ordering::Relaxed),
            ),
            (
                "fp4forge_engine_steps_total",
                "Batched forward passes run.",
                self.steps.load(Ordering::Relaxed),
            ),
            (
                "fp4forge_engine_step_tokens_total",
                "Tokens processed by all forward passes (prompt and decode rows).",
                self.step_rows.load(Ordering::Relaxed),
            ),
            (
                "fp4forge_cancelled_sequences_total",
                "Sequences stopped because their client disconnected.",
                self.cancelled.load(Ordering::Relaxed),
            ),
            (
                "fp4forge_prefix_cache_hits_total",
                "Requests that started from a cached prefix of an earlier sequence.",
                self.prefix_hits.load(Ordering::Relaxed),
            ),
            (
                "fp4forge_prefix_cache_reused_tokens_total",
                "Prompt tokens taken from the prefix cache instead of being prefilled.",
                self.prefix_reused_tokens.load(Ordering::Relaxed),
            ),
            (
                "fp4forge_prefix_cache_queries_total",
                "Requests looked up in the prefix cache (hits included).",
                self.prefix_queries.load(Ordering::Relaxed),
            ),
            (
                "fp4forge_prefix_cache_queried_tokens_total",
                "Prompt tokens looked up in the prefix cache.",
                self.prefix_queried_tokens.load(Ordering::Relaxed),
            ),
            (
                "fp4forge_num_preemptions_total",
                "Running sequences preempted: their KV cache given back when a step needed more \
                 KV memory than was left (a GPU's capped KV memory), recomputed once resumed.",
                self.preemptions.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name}{{model_name=\"{model}\"}} {v}");
        }
        let name = "fp4forge_request_success_total";
        let _ = writeln!(
            out,
            "# HELP {name} Sequences that ended normally, by finish reason (stop: a stop \
             token or string; length: max_tokens or the context; abort: ended by a shutdown)."
        );
        let _ = writeln!(out, "# TYPE {name} counter");
        for (reason, n) in FINISH_REASONS.iter().zip(&self.success) {
            let n = n.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}{{model_name=\"{model}\",finished_reason=\"{reason}\"}} {n}"
            );
        }
        let name = "fp4forge_kv_cache_usage_perc";
        let _ = writeln!(
            out,
            "# HELP {name} Fraction (0 to 1) of the KV capacity in use: on a GPU bytes of its \
             paged KV memory (running sequences and prefix-cache entries) over the cap; on the \
             CPU tokens in the running sequences' caches over the most sequences times the \
             context."
        );
        let _ = writeln!(out, "# TYPE {name} gauge");
        let _ = writeln!(out, "{name}{{model_name=\"{model}\"}} {}", self.kv_usage());
        let gauges = [
            (
                "fp4forge_requests_waiting",
                "Sequences waiting for a batch slot (queue depth).",
                self.waiting.load(Ordering::Relaxed),
            ),
            (
                "fp4forge_requests_running",
                "Sequences in the running batch.",
                self.running.load(Ordering::Relaxed),
            ),
            (
                "fp4forge_prefix_cache_bytes",
                "KV storage held by the prefix cache, bytes.",
                self.prefix_cache_bytes.load(Ordering::Relaxed),
            ),
            (
                "fp4forge_prefix_cache_entries",
                "Finished sequences held by the prefix cache.",
                self.prefix_cache_entries.load(Ordering::Relaxed),
            ),
            (
                "fp4forge_kv_cache_used_bytes",
                "Device memory held by the paged KV caches (running sequences and prefix-cache \
                 entries; blocks shared by forks once), bytes (0 on the CPU).",
                self.kv_used_bytes.load(Ordering::Relaxed),
            ),
            (
                "fp4forge_kv_cache_capacity_bytes",
                "The KV caches' memory cap (what --gpu-memory-utilization leaves after the \
                 weights), bytes (0: no cap).",
                self.kv_capacity_bytes.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            let _ = writeln!(out, "{name}{{model_name=\"{model}\"}} {v}");
        }
        self.ttft.render(
            &mut out,
            model,
            "fp4forge_time_to_first_token_seconds",
            "Time from a request's arrival to its first generated token.",
        );
        self.itl.render(
            &mut out,
            model,
            "fp4forge_inter_token_latency_seconds",
            "Time between consecutive generated tokens of a sequence.",
        );
        self.e2e.render(
            &mut out,
            model,
            "fp4forge_request_latency_seconds",
            "Time from a sequence's arrival to its end.",
        );
        self.engine_step.render(
            &mut out,
            model,
            "fp4forge_engine_step_seconds",
            "One engine step: admission, the forward pass of the running batch and the new \
             tokens delivered.",
        );
        self.forward.render(
            &mut out,
            model,
            "fp4forge_forward_seconds",
            "The forward pass of one engine step (its device work included); the rest of \
             fp4forge_engine_step_seconds is the host's scheduling.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_cumulative_buckets() {
        let m = Metrics::new("m");
        m.request("/v1/completions", 200);
        m.request("/v1/completions", 200);
        m.request("/v1/completions", 400);
        m.ttft.observe(Duration::from_millis(3));
        m.ttft.observe(Duration::from_millis(300));
        let text = m.render();
        assert!(
            text.contains(
                "fp4forge_requests_total{model_name=\"m\",endpoint=\"/v1/completions\",\
                 status=\"200\"} 2"
            ),
            "{text}"
        );
        let ttft = "fp4forge_time_to_first_token_seconds";
        assert!(text.contains(&format!("{ttft}_bucket{{model_name=\"m\",le=\"0.005\"}} 1")));
        assert!(text.contains(&format!("{ttft}_bucket{{model_name=\"m\",le=\"0.5\"}} 2")));
        assert!(text.contains(&format!("{ttft}_count{{model_name=\"m\"}} 2")));
    }

    #[test]
    fn every_series_names_the_model() {
        let m = Metrics::new("m");
        m.request("/health", 200);
        m.success("length");
        for line in m.render().lines().filter(|l| !l.starts_with('#')) {
            assert!(line.contains("{model_name=\"m\""), "{line}");
        }
        assert!(m.render().contains(
            "fp4forge_request_success_total{model_name=\"m\",finished_reason=\"length\"} 1"
        ));
    }
}
