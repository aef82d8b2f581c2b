//! `fp4forge serve DIR`: the OpenAI-compatible server (continuous batching on the native engine).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use fp4forge_engine::Device;
use fp4forge_engine::KvDtype;
use fp4forge_server::{ReasoningFormat, Server, ServerConfig, ToolFormat};

/// Arguments of `fp4forge serve`.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Checkpoint directory with tokenizer.json (bf16, or NVFP4: weights stay packed).
    dir: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port (0: any free one).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Model name clients put in requests (default: the directory's name).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Most sequences advanced together per engine step.
    #[arg(long, default_value_t = fp4forge_server::DEFAULT_MAX_BATCH)]
    max_batch: usize,
    /// Ceiling on a request's max_tokens.
    #[arg(long, default_value_t = fp4forge_server::DEFAULT_MAX_TOKENS_LIMIT)]
    max_tokens_limit: usize,
    /// Longest prompt accepted, tokens (default: the model's context).
    #[arg(long)]
    max_prompt_tokens: Option<usize>,
    /// Caps the model's context, tokens (default: the checkpoint's).
    #[arg(long)]
    max_context: Option<usize>,
    /// Most requests waiting for a batch slot (more get 429).
    #[arg(long, default_value_t = fp4forge_server::DEFAULT_MAX_QUEUE)]
    max_queue: usize,
    /// Largest request body, bytes (larger get 413).
    #[arg(long, default_value_t = fp4forge_server::DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// Prompt tokens prefilled per engine step over all sequences.
    #[arg(long, default_value_t = fp4forge_server::DEFAULT_PREFILL_BUDGET)]
    prefill_budget: usize,
    /// Where the engine runs: cpu, or cuda[:N] (GPU N, default 0; needs a build with the `cuda`
    /// feature).
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// CPU engine worker threads (0: one per core; ignored with --device cuda).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// KV cache storage.
    #[arg(long, default_value = "bf16", value_parser = ["bf16", "fp8", "f32"])]
    kv_dtype: String,
    /// KV storage of finished sequences kept so that requests sharing a prompt prefix skip its
    /// prefill, MiB (0: no prefix caching).
    #[arg(long, default_value_t = fp4forge_server::DEFAULT_PREFIX_CACHE_BYTES >> 20)]
    prefix_cache_mib: usize,
    /// Seconds a shutdown (SIGINT/SIGTERM) waits for requests in flight.
    #[arg(long, default_value_t = 60)]
    drain_timeout: u64,
    /// A chat template file (Jinja) used instead of the checkpoint's.
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    /// Parse the tool calls of requests with `tools` (tool_choice "auto").
    #[arg(long)]
    enable_auto_tool_choice: bool,
    /// Tool-call format: poolside_v1, hermes, qwen3_coder, llama3_json (default: detected from
    /// the chat template; needs --enable-auto-tool-choice).
    #[arg(long, value_name = "NAME", value_parser = parse_tool_format)]
    tool_call_parser: Option<ToolFormat>,
    /// Split reasoning (`<think>…</think>`) into `reasoning_content`: poolside_v1, deepseek_r1,
    /// qwen3.
    #[arg(long, value_name = "NAME", value_parser = parse_reasoning_format)]
    reasoning_parser: Option<ReasoningFormat>,
}

/// `--tool-call-parser` values.
fn parse_tool_format(name: &str) -> Result<ToolFormat, String> {
    ToolFormat::from_name(name).ok_or_else(|| {
        format!(
            "unknown tool-call parser {name:?} (known: {})",
            ToolFormat::ALL.map(|(n, _)| n).join(", ")
        )
    })
}

/// `--reasoning-parser` values.
fn parse_reasoning_format(name: &str) -> Result<ReasoningFormat, String> {
    ReasoningFormat::from_name(name).ok_or_else(|| {
        format!(
            "unknown reasoning parser {name:?} (known: {})",
            ReasoningFormat::ALL.map(|(n, _)| n).join(", ")
        )
    })
}

/// Runs the subcommand.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let kv = match args.kv_dtype.as_str() {
        "fp8" => KvDtype::Fp8E4m3,
        "f32" => KvDtype::F32,
        _ => KvDtype::Bf16,
    };
    let config = ServerConfig::new(&args.dir)
        .host(args.host)
        .port(args.port)
        .served_model_name(args.served_model_name)
        .max_batch(args.max_batch)
        .max_tokens_limit(args.max_tokens_limit)
        .max_prompt_tokens(args.max_prompt_tokens)
        .max_context(args.max_context)
        .max_queue(args.max_queue)
        .max_body_bytes(args.max_body_bytes)
        .prefill_budget(args.prefill_budget)
        .device(args.device)
        .threads(args.threads)
        .kv_dtype(kv)
        .prefix_cache_bytes(args.prefix_cache_mib.saturating_mul(1 << 20))
        .drain_timeout(Duration::from_secs(args.drain_timeout))
        .chat_template(args.chat_template)
        .enable_auto_tool_choice(args.enable_auto_tool_choice)
        .tool_call_parser(args.tool_call_parser)
        .reasoning_parser(args.reasoning_parser);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let server = Server::bind(config).await?;
        eprintln!(
            "fp4forge serve: model `{}` (context {} tokens, backend {}) on http://{}/v1",
            server.model_name(),
            server.max_context(),
            server.backend(),
            server.local_addr()
        );
        server.run(fp4forge_server::shutdown_signal()).await?;
        eprintln!("fp4forge serve: stopped");
        anyhow::Ok(())
    })
}
