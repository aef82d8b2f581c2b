//! `fp4forge serve DIR`: the OpenAI-compatible server (continuous batching on the native engine).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use fp4forge_engine::Device;
use fp4forge_engine::KvDtype;
use fp4forge_server::{Server, ServerConfig};

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
    /// Seconds a shutdown (SIGINT/SIGTERM) waits for requests in flight; then they end with
    /// finish_reason `abort`.
    #[arg(long, default_value_t = 60)]
    drain_timeout: u64,
    /// Most connections open at once (more are answered 503 and closed).
    #[arg(long, default_value_t = fp4forge_server::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Seconds a client has to send a request's headers (else the connection is closed).
    #[arg(long, default_value_t = fp4forge_server::DEFAULT_HEADER_READ_TIMEOUT.as_secs_f64())]
    header_read_timeout: f64,
    /// Seconds a client has to send a request's body once its headers are in (else 408).
    #[arg(long, default_value_t = fp4forge_server::DEFAULT_BODY_READ_TIMEOUT.as_secs_f64())]
    body_read_timeout: f64,
}

/// `secs` of flag `--NAME` as a duration: positive and finite.
fn seconds(name: &str, secs: f64) -> anyhow::Result<Duration> {
    if !(secs.is_finite() && secs > 0.0) {
        anyhow::bail!("--{name} must be a positive number of seconds, got {secs}");
    }
    Duration::try_from_secs_f64(secs).with_context(|| format!("--{name} {secs}"))
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
        .max_connections(args.max_connections)
        .header_read_timeout(seconds("header-read-timeout", args.header_read_timeout)?)
        .body_read_timeout(seconds("body-read-timeout", args.body_read_timeout)?);
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
