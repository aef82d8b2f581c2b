//! `fp4forge bench`: decode/prefill speed and a concurrency sweep against any OpenAI-compatible
//! server.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use fp4forge_client::bench::render_svg;
use fp4forge_client::{Bench, BenchConfig, Client, PromptSource};

/// Arguments of `fp4forge bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Server URL (`http://host:8000` or `http://host:8000/v1`).
    url: String,
    /// Model name to put in requests.
    #[arg(long)]
    model: String,
    /// The model's tokenizer.json (or its directory): prompts become exactly N token ids.
    /// Without it, text prompts are sized by calibrating against the server's token counts.
    #[arg(long, value_name = "DIR|tokenizer.json")]
    tokenizer: Option<PathBuf>,
    /// With --tokenizer: prompts of token ids drawn at random from its vocabulary (added tokens
    /// left out), as llama-bench's are, instead of tokenized filler prose. For synthetic
    /// checkpoints, whose stand-in tokenizer maps prose to one unknown id (one id repeated would
    /// send every token of an MoE down the same experts).
    #[arg(long, requires = "tokenizer")]
    random_ids: bool,
    /// Prompt lengths for single-stream runs, comma separated (`k` = ×1024).
    #[arg(long, value_delimiter = ',', value_parser = parse_tokens, default_value = "2k,16k,64k")]
    context: Vec<usize>,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 256)]
    max_tokens: u32,
    /// Concurrency levels of the sweep, comma separated (`0` alone: no sweep).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    concurrency: Vec<usize>,
    /// Prompt length in the sweep (default: the smallest --context).
    #[arg(long, value_parser = parse_tokens)]
    sweep_context: Option<usize>,
    /// Measured requests per prompt length, and per stream at each concurrency level.
    #[arg(long, default_value_t = 3)]
    repetitions: usize,
    /// Unmeasured warm-up requests.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Do not send vLLM's `ignore_eos`/`min_tokens` (for servers that reject them).
    #[arg(long)]
    no_ignore_eos: bool,
    /// Seed of the filler prompts.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Bearer token (default: $OPENAI_API_KEY).
    #[arg(long)]
    api_key: Option<String>,
    /// Per-request timeout (non-streamed) and per-read timeout (streamed), seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write an SVG plot (throughput and latency vs concurrency, decode vs context).
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

/// `2048`, `2k`, `64K` (k = 1024).
pub fn parse_tokens(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (digits, mult) = match t.strip_suffix(['k', 'K']) {
        Some(d) => (d, 1024),
        None => (t, 1),
    };
    digits
        .parse::<usize>()
        .map(|n| n * mult)
        .map_err(|_| format!("`{s}` is not a token count (e.g. 2048 or 2k)"))
}

/// Runs the subcommand.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let client = Client::builder(&args.url)
        .api_key(
            args.api_key
                .clone()
                .or_else(|| std::env::var("OPENAI_API_KEY").ok()),
        )
        .timeout(Duration::from_secs(args.timeout))
        .build()?;
    let mut config = BenchConfig::new(&args.model);
    config.contexts = args.context.clone();
    config.max_tokens = args.max_tokens;
    config.concurrency = args
        .concurrency
        .iter()
        .copied()
        .filter(|&c| c > 0)
        .collect();
    config.sweep_context = args.sweep_context;
    config.repetitions = args.repetitions;
    config.warmup = args.warmup;
    config.ignore_eos = !args.no_ignore_eos;
    config.seed = args.seed;
    let prompts = match (&args.tokenizer, args.random_ids) {
        (Some(path), true) => Some(PromptSource::random_ids(path)?),
        (Some(path), false) => Some(PromptSource::from_tokenizer(path)?),
        (None, _) => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let report = runtime.block_on(async {
        let bench = Bench::new(client, config, prompts).await?;
        bench.run(|line| eprintln!("bench: {line}")).await
    })?;
    out!("{report}")?;
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, render_svg(&report))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{parse_tokens, BenchArgs};
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        args: BenchArgs,
    }

    #[test]
    fn random_ids_need_a_tokenizer() {
        let parse = |argv: &[&str]| {
            Cmd::try_parse_from(["bench", "http://h", "--model", "m"].iter().chain(argv))
                .map(|c| (c.args.random_ids, c.args.tokenizer))
        };
        assert!(parse(&["--random-ids"]).is_err());
        let (random, tok) = parse(&["--tokenizer", "d", "--random-ids"]).unwrap();
        assert!(random && tok.is_some());
        assert!(!parse(&["--tokenizer", "d"]).unwrap().0);
    }

    #[test]
    fn token_counts_accept_k_suffixes() {
        assert_eq!(parse_tokens("2k"), Ok(2048));
        assert_eq!(parse_tokens("64K"), Ok(65536));
        assert_eq!(parse_tokens("1000"), Ok(1000));
        assert!(parse_tokens("lots").is_err());
    }
}
