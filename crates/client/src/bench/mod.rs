//! `bench`: decode and prefill speed at exact prompt lengths, and a concurrency sweep, against any
//! OpenAI-compatible `/v1/completions` endpoint.
//!
//! Every request is streamed with `stream_options.include_usage`, so token counts come from the
//! server's final usage chunk and timings from chunk arrivals:
//!
//! * TTFT: request sent → first chunk carrying text; prefill tok/s = prompt tokens ÷ TTFT.
//! * TPOT: (last chunk − first chunk) ÷ (completion tokens − 1); decode tok/s = 1 ÷ TPOT.
//! * ITL: the gaps between successive text chunks (one token per chunk on vLLM and ours).
//!
//! With `ignore_eos` (vLLM's extension, also sending `min_tokens = max_tokens`) every request
//! generates exactly `max_tokens`.

mod prompts;
mod report;
mod svg;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub use prompts::{
    calibrate, filler_text, load_tokenizer, tokenizer_file, PromptSource, CALIBRATION_WORDS,
};
pub use report::{BenchReport, ContextResult, SweepPoint};
pub use svg::render_svg;

use crate::api::{CompletionRequest, Prompt};
use crate::client::{Client, StreamedCompletion};
use crate::error::{ClientError, Result};
use crate::stats::{median, Percentiles};

/// What to measure. Build with [`BenchConfig::new`] and adjust the public fields.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchConfig {
    /// The model name to send.
    pub model: String,
    /// Prompt lengths for the single-stream measurements, in tokens.
    pub contexts: Vec<usize>,
    /// Tokens to generate per request.
    pub max_tokens: u32,
    /// Concurrency levels of the sweep (empty: no sweep).
    pub concurrency: Vec<usize>,
    /// Prompt length in the sweep (default: the smallest of `contexts`, or 512).
    pub sweep_context: Option<usize>,
    /// Measured requests per prompt length, and per stream at each concurrency level.
    pub repetitions: usize,
    /// Unmeasured requests before measuring.
    pub warmup: usize,
    /// Send `ignore_eos: true` and `min_tokens` (vLLM extensions) so lengths are exact.
    pub ignore_eos: bool,
    /// Seed of the filler prompts.
    pub seed: u64,
}

impl BenchConfig {
    /// Defaults: contexts 2048/16384/65536, 256 tokens, concurrency 1/2/4/8/16, 3 repetitions,
    /// 1 warm-up, `ignore_eos`.
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            model: model.into(),
            contexts: vec![2048, 16384, 65536],
            max_tokens: 256,
            concurrency: vec![1, 2, 4, 8, 16],
            sweep_context: None,
            repetitions: 3,
            warmup: 1,
            ignore_eos: true,
            seed: 0,
        }
    }

    fn sweep_context(&self) -> usize {
        self.sweep_context
            .or_else(|| self.contexts.iter().copied().min())
            .unwrap_or(512)
    }

    fn request(&self, prompt: Prompt) -> CompletionRequest {
        let mut r = CompletionRequest::new(self.model.clone(), prompt, self.max_tokens);
        if self.ignore_eos {
            r.ignore_eos = Some(true);
            r.min_tokens = Some(self.max_tokens.into());
        }
        r
    }
}

/// The timings of one streamed request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestTiming {
    /// Prompt tokens (the server's count, else the expected count).
    pub prompt_tokens: u64,
    /// Generated tokens (the server's count, else the number of text chunks).
    pub completion_tokens: u64,
    /// Time to first token, s.
    pub ttft: f64,
    /// Time to the last text chunk, s.
    pub last: f64,
    /// Gaps between successive text chunks, s.
    pub itl: Vec<f64>,
}

impl RequestTiming {
    /// Timings of a streamed completion; `expected_prompt` fills in a missing usage count.
    pub fn from_stream(s: &StreamedCompletion, expected_prompt: u64) -> Self {
        let text: Vec<f64> = s
            .chunks
            .iter()
            .filter(|c| !c.text.is_empty())
            .map(|c| c.at.as_secs_f64())
            .collect();
        let ttft = text
            .first()
            .copied()
            .or_else(|| s.chunks.first().map(|c| c.at.as_secs_f64()))
            .unwrap_or(s.total.as_secs_f64());
        let last = text.last().copied().unwrap_or(ttft);
        let itl = text.windows(2).map(|w| w[1] - w[0]).collect();
        let usage = s.usage.unwrap_or_default();
        Self {
            prompt_tokens: s.usage.map_or(expected_prompt, |u| u.prompt_tokens),
            completion_tokens: if s.usage.is_some() {
                usage.completion_tokens
            } else {
                text.len() as u64
            },
            ttft,
            last,
            itl,
        }
    }

    /// Time per output token after the first, s (NaN with fewer than two tokens).
    pub fn tpot(&self) -> f64 {
        if self.completion_tokens < 2 {
            return f64::NAN;
        }
        (self.last - self.ttft) / (self.completion_tokens - 1) as f64
    }

    /// Decode speed, tokens/s.
    pub fn decode_tok_s(&self) -> f64 {
        1.0 / self.tpot()
    }

    /// Prefill speed: prompt tokens ÷ TTFT, tokens/s.
    pub fn prefill_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.ttft
    }
}

fn median_u64(v: impl Iterator<Item = u64>) -> u64 {
    let mut v: Vec<u64> = v.collect();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// Runs benchmarks against one endpoint.
pub struct Bench {
    client: Client,
    config: BenchConfig,
    prompts: PromptSource,
    next_seed: AtomicUsize,
}

impl std::fmt::Debug for Bench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bench")
            .field("url", &self.client.base_url())
            .field("config", &self.config)
            .field("prompts", &self.prompts)
            .finish()
    }
}

impl Bench {
    /// A benchmark of `client` with token-exact prompts when `prompts` is a tokenizer source;
    /// pass `None` to size text prompts by calibrating against the server (two short requests).
    pub async fn new(
        client: Client,
        config: BenchConfig,
        prompts: Option<PromptSource>,
    ) -> Result<Self> {
        if config.repetitions == 0 {
            return Err(ClientError::config("--repetitions", "must be at least 1"));
        }
        if config.max_tokens == 0 {
            return Err(ClientError::config("--max-tokens", "must be at least 1"));
        }
        if let Some(0) = config.concurrency.iter().copied().min() {
            return Err(ClientError::config(
                "--concurrency",
                "levels must be at least 1",
            ));
        }
        if let Some(0) = config.contexts.iter().copied().min() {
            return Err(ClientError::config(
                "--context",
                "lengths must be at least 1",
            ));
        }
        let prompts = match prompts {
            Some(p) => p,
            None => {
                let mut points = [(0usize, 0u64); 2];
                for (i, words) in CALIBRATION_WORDS.into_iter().enumerate() {
                    let text = filler_text(words, config.seed ^ 0xCA11_B8A7 ^ i as u64);
                    let req = CompletionRequest::new(config.model.clone(), Prompt::Text(text), 1);
                    let resp = client.completion(&req).await?;
                    let usage = resp.usage.ok_or_else(|| {
                        ClientError::response(
                            client.base_url(),
                            "usage",
                            "missing; cannot size text prompts (pass --tokenizer)",
                        )
                    })?;
                    points[i] = (words, usage.prompt_tokens);
                }
                calibrate(points)?
            }
        };
        Ok(Self {
            client,
            config,
            prompts,
            next_seed: AtomicUsize::new(1),
        })
    }

    fn prompt(&self, tokens: usize) -> Result<Prompt> {
        let n = self.next_seed.fetch_add(1, Ordering::Relaxed) as u64;
        self.prompts
            .prompt(tokens, self.config.seed.wrapping_mul(0x1000_0000_01B3) ^ n)
    }

    async fn one(&self, prompt: Prompt, expected: usize) -> Result<RequestTiming> {
        let s = self
            .client
            .completion_stream(&self.config.request(prompt))
            .await?;
        Ok(RequestTiming::from_stream(&s, expected as u64))
    }

    /// Sends the warm-up requests (prompt length of the sweep), results discarded.
    pub async fn warm_up(&self) -> Result<()> {
        let n = self.config.sweep_context();
        for _ in 0..self.config.warmup {
            let p = self.prompt(n)?;
            self.one(p, n).await?;
        }
        Ok(())
    }

    /// Single-stream measurements at prompt length `context`; a server error becomes the
    /// result's `error` rather than failing the run.
    pub async fn single_stream(&self, context: usize) -> ContextResult {
        let mut runs = Vec::new();
        let mut error = None;
        for _ in 0..self.config.repetitions {
            let timing = match self.prompt(context) {
                Ok(p) => self.one(p, context).await,
                Err(e) => Err(e),
            };
            match timing {
                Ok(t) => runs.push(t),
                Err(e) => {
                    error = Some(e.to_string());
                    break;
                }
            }
        }
        let decode: Vec<f64> = runs.iter().map(RequestTiming::decode_tok_s).collect();
        let finite: Vec<f64> = decode.iter().copied().filter(|x| x.is_finite()).collect();
        let itl: Vec<f64> = runs.iter().flat_map(|r| r.itl.iter().copied()).collect();
        ContextResult {
            context,
            prompt_tokens: median_u64(runs.iter().map(|r| r.prompt_tokens)),
            completion_tokens: median_u64(runs.iter().map(|r| r.completion_tokens)),
            repetitions: runs.len(),
            ttft_ms: Percentiles::of(&runs.iter().map(|r| r.ttft).collect::<Vec<_>>()).scaled(1e3),
            prefill_tok_s: median(
                &runs
                    .iter()
                    .map(RequestTiming::prefill_tok_s)
                    .collect::<Vec<_>>(),
            ),
            decode_tok_s: median(&finite),
            decode_tok_s_min: finite.iter().copied().fold(f64::NAN, f64::min),
            decode_tok_s_max: finite.iter().copied().fold(f64::NAN, f64::max),
            tpot_ms: Percentiles::of(&runs.iter().map(RequestTiming::tpot).collect::<Vec<_>>())
                .scaled(1e3),
            itl_ms: Percentiles::of(&itl).scaled(1e3),
            error,
        }
    }

    /// `concurrency` streams, each sending `repetitions` requests back to back, prompts of the
    /// sweep length (all generated before the clock starts).
    pub async fn sweep_point(&self, concurrency: usize) -> SweepPoint {
        let context = self.config.sweep_context();
        let total = concurrency * self.config.repetitions;
        let mut prompts = Vec::with_capacity(total);
        for _ in 0..total {
            match self.prompt(context) {
                Ok(p) => prompts.push(p),
                Err(e) => return failed_point(concurrency, e.to_string()),
            }
        }
        let prompts = Arc::new(std::sync::Mutex::new(prompts));
        let start = std::time::Instant::now();
        let workers = (0..concurrency).map(|_| {
            let prompts = Arc::clone(&prompts);
            async move {
                let mut out = Vec::new();
                loop {
                    let next = prompts.lock().ok().and_then(|mut p| p.pop());
                    let Some(prompt) = next else { break };
                    out.push(self.one(prompt, context).await);
                }
                out
            }
        });
        let results: Vec<Result<RequestTiming>> = futures_util::future::join_all(workers)
            .await
            .into_iter()
            .flatten()
            .collect();
        let wall = start.elapsed().as_secs_f64();
        let mut ok = Vec::new();
        let mut failed = 0;
        let mut error = None;
        for r in results {
            match r {
                Ok(t) => ok.push(t),
                Err(e) => {
                    failed += 1;
                    error.get_or_insert_with(|| e.to_string());
                }
            }
        }
        // no completed request: no throughput figure rather than a misleading zero
        if ok.is_empty() {
            let mut p = failed_point(concurrency, error.unwrap_or_default());
            p.failed = failed;
            p.wall_s = wall;
            return p;
        }
        let out_tokens: u64 = ok.iter().map(|t| t.completion_tokens).sum();
        let in_tokens: u64 = ok.iter().map(|t| t.prompt_tokens).sum();
        let tpot: Vec<f64> = ok.iter().map(RequestTiming::tpot).collect();
        let itl: Vec<f64> = ok.iter().flat_map(|r| r.itl.iter().copied()).collect();
        let stream: Vec<f64> = ok
            .iter()
            .map(RequestTiming::decode_tok_s)
            .filter(|x| x.is_finite())
            .collect();
        SweepPoint {
            concurrency,
            requests: ok.len(),
            failed,
            prompt_tokens: median_u64(ok.iter().map(|t| t.prompt_tokens)),
            wall_s: wall,
            output_tok_s: out_tokens as f64 / wall,
            total_tok_s: (out_tokens + in_tokens) as f64 / wall,
            requests_per_s: ok.len() as f64 / wall,
            stream_decode_tok_s: median(&stream),
            ttft_ms: Percentiles::of(&ok.iter().map(|t| t.ttft).collect::<Vec<_>>()).scaled(1e3),
            tpot_ms: Percentiles::of(&tpot).scaled(1e3),
            itl_ms: Percentiles::of(&itl).scaled(1e3),
            error,
        }
    }

    /// Warm-up, then every prompt length, then every concurrency level; `log` hears progress.
    pub async fn run(&self, mut log: impl FnMut(String)) -> Result<BenchReport> {
        if self.config.warmup > 0 {
            log(format!("warm-up: {} request(s)", self.config.warmup));
            self.warm_up().await?;
        }
        let mut contexts = Vec::new();
        for &c in &self.config.contexts {
            log(format!(
                "single stream: prompt {c} tokens × {}",
                self.config.repetitions
            ));
            let r = self.single_stream(c).await;
            if let Some(e) = &r.error {
                log(format!("  context {c}: {e}"));
            }
            contexts.push(r);
        }
        let mut sweep = Vec::new();
        for &c in &self.config.concurrency {
            log(format!(
                "sweep: {c} stream(s) × {} request(s), prompt {} tokens",
                self.config.repetitions,
                self.config.sweep_context()
            ));
            sweep.push(self.sweep_point(c).await);
        }
        Ok(BenchReport {
            url: self.client.base_url().to_string(),
            model: self.config.model.clone(),
            prompts: self.prompts.describe(),
            max_tokens: self.config.max_tokens,
            ignore_eos: self.config.ignore_eos,
            repetitions: self.config.repetitions,
            warmup: self.config.warmup,
            sweep_context: self.config.sweep_context(),
            contexts,
            sweep,
        })
    }
}

fn failed_point(concurrency: usize, error: String) -> SweepPoint {
    SweepPoint {
        concurrency,
        requests: 0,
        failed: 0,
        prompt_tokens: 0,
        wall_s: 0.0,
        output_tok_s: f64::NAN,
        total_tok_s: f64::NAN,
        requests_per_s: f64::NAN,
        stream_decode_tok_s: f64::NAN,
        ttft_ms: Percentiles::default(),
        tpot_ms: Percentiles::default(),
        itl_ms: Percentiles::default(),
        error: Some(error),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::api::Usage;
    use crate::client::StreamChunk;

    fn chunk(ms: u64, text: &str) -> StreamChunk {
        StreamChunk {
            at: Duration::from_millis(ms),
            text: text.into(),
        }
    }

    #[test]
    fn timings_from_a_stream() {
        let s = StreamedCompletion {
            chunks: vec![
                chunk(100, "a"),
                chunk(110, "b"),
                chunk(115, ""),
                chunk(130, "c"),
                chunk(140, "d"),
            ],
            usage: Some(Usage::new(1000, 4)),
            finish_reason: Some("length".into()),
            total: Duration::from_millis(150),
        };
        let t = RequestTiming::from_stream(&s, 7);
        assert_eq!(t.prompt_tokens, 1000);
        assert_eq!(t.completion_tokens, 4);
        assert!((t.ttft - 0.1).abs() < 1e-9);
        assert!((t.tpot() - 0.04 / 3.0).abs() < 1e-9);
        assert!((t.decode_tok_s() - 75.0).abs() < 1e-6);
        assert!((t.prefill_tok_s() - 10_000.0).abs() < 1e-6);
        let itl: Vec<f64> = t.itl.iter().map(|x| (x * 1e3).round()).collect();
        assert_eq!(itl, [10.0, 20.0, 10.0]);
        // no usage chunk: counts fall back to the expected prompt and the text chunks
        let s2 = StreamedCompletion { usage: None, ..s };
        let t2 = RequestTiming::from_stream(&s2, 7);
        assert_eq!((t2.prompt_tokens, t2.completion_tokens), (7, 4));
    }

    #[test]
    fn request_carries_the_vllm_length_extensions() {
        let mut c = BenchConfig::new("m");
        c.max_tokens = 64;
        let r = c.request(Prompt::Tokens(vec![1, 2]));
        assert_eq!(
            (r.ignore_eos, r.min_tokens, r.max_tokens),
            (Some(true), Some(64u32.into()), Some(64u32.into()))
        );
        c.ignore_eos = false;
        let r = c.request(Prompt::Tokens(vec![1, 2]));
        let json = serde_json::to_string(&r).unwrap();
        assert!(
            !json.contains("ignore_eos") && !json.contains("min_tokens"),
            "{json}"
        );
        assert_eq!(c.sweep_context(), 2048);
    }
}
