//! `fp4forge serve DIR`: the OpenAI-compatible server (continuous batching on the native engine).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use fp4forge_engine::{CpuActivations, CpuIsa, Device};
use fp4forge_engine::{KvDtype, LoadFormat};
use fp4forge_server::{ReasoningFormat, Server, ServerConfig, ToolFormat};

/// Arguments of `fp4forge serve`. Flags with a vLLM counterpart also answer to vLLM's spelling
/// (`--max-num-seqs`, `--max-model-len`, `--max-num-batched-tokens`, `--kv-cache-dtype`;
/// `--host`, `--port`, `--served-model-name`, `--api-key` are spelled alike), so a `vllm serve`
/// recipe ports by changing the binary's name; docs/serving.md says where meanings differ.
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
    /// Most sequences advanced together per engine step. Default: 32 on the CPU; 256 on a GPU,
    /// where the KV memory left decides how many run (docs/serving.md, "KV memory").
    #[arg(long, visible_alias = "max-num-seqs")]
    max_batch: Option<usize>,
    /// Ceiling on a request's max_tokens.
    #[arg(long, default_value_t = fp4forge_server::DEFAULT_MAX_TOKENS_LIMIT)]
    max_tokens_limit: usize,
    /// Longest prompt accepted, tokens (default: the model's context).
    #[arg(long)]
    max_prompt_tokens: Option<usize>,
    /// Caps the model's context, tokens (default: the checkpoint's).
    #[arg(long, visible_alias = "max-model-len")]
    max_context: Option<usize>,
    /// Most requests waiting for a batch slot (more get 429).
    #[arg(long, default_value_t = fp4forge_server::DEFAULT_MAX_QUEUE)]
    max_queue: usize,
    /// Largest request body, bytes (larger get 413).
    #[arg(long, default_value_t = fp4forge_server::DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// Prompt tokens prefilled per engine step over all sequences (vLLM's
    /// --max-num-batched-tokens also counts the decoding sequences' tokens; this does not).
    /// Default: 256 on the CPU, 2048 on a GPU.
    #[arg(long, visible_alias = "max-num-batched-tokens")]
    prefill_budget: Option<usize>,
    /// Where the engine runs: cpu, or cuda[:N] (GPU N, default 0; needs a build with the `cuda`
    /// feature).
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// CPU engine worker threads (0: one per core; ignored with --device cuda).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Instruction set of the CPU kernels: auto (the best this CPU has), avx512, avx2 or
    /// portable (ignored with --device cuda).
    #[arg(long, default_value = "auto")]
    cpu_isa: CpuIsa,
    /// What NVFP4 weights multiply on the CPU (prompts and decode steps): f32 activations, or a
    /// copy rounded to int8 per 16 values (W4A8, fewer instructions; see docs/performance.md and
    /// docs/quality.md for its speed and quality). Ignored with --device cuda.
    #[arg(long, default_value = "f32")]
    cpu_activations: CpuActivations,
    /// KV cache storage: bf16 (vLLM: auto, bfloat16), fp8 (e4m3; vLLM: fp8_e4m3) or f32.
    #[arg(long, visible_alias = "kv-cache-dtype", default_value = "bf16")]
    kv_dtype: KvDtype,
    /// KV storage of finished sequences kept so that requests sharing a prompt prefix skip its
    /// prefill, MiB (0: no prefix caching).
    #[arg(long, default_value_t = fp4forge_server::DEFAULT_PREFIX_CACHE_BYTES >> 20)]
    prefix_cache_mib: usize,
    /// Seconds a shutdown (SIGINT/SIGTERM) waits for requests in flight; then they end with
    /// finish_reason `abort`.
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
    /// Key every /v1 request must carry as `Authorization: Bearer KEY` (default:
    /// $FP4FORGE_API_KEY, else vLLM's $VLLM_API_KEY, else none: the API is open). /health and
    /// /metrics stay open.
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// On a GPU (as vLLM's flag): the fraction of its memory the server uses (default 0.9).
    /// What the weights and an activation reserve leave of it caps the paged KV caches;
    /// requests wait for room and running ones are preempted (recomputed later) when it runs
    /// out. Refused with --device cpu.
    #[arg(long, value_name = "FRACTION", value_parser = parse_fraction)]
    gpu_memory_utilization: Option<f64>,
    /// The KV caches' memory in bytes (as vLLM's flag; suffixes K, M, G, KiB, MiB, GiB), on a
    /// GPU instead of --gpu-memory-utilization's share, on the CPU a cap on host memory. As
    /// there, requests wait for room and running ones are preempted when it runs out.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    kv_cache_memory_bytes: Option<usize>,
    /// How weight files are held: `mmap` (default; a file truncated while serving crashes the
    /// server with SIGBUS) or `copy` (read into memory: the file's size in RAM, immune to
    /// changes of the file).
    #[arg(long, default_value = "mmap", value_parser = parse_load_format)]
    load_format: LoadFormat,
    /// Most connections open at once (more are answered 503 and closed).
    #[arg(long, default_value_t = fp4forge_server::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Seconds a client has to send a request's headers (else the connection is closed).
    #[arg(long, default_value_t = fp4forge_server::DEFAULT_HEADER_READ_TIMEOUT.as_secs_f64())]
    header_read_timeout: f64,
    /// Seconds a client has to send a request's body once its headers are in (else 408).
    #[arg(long, default_value_t = fp4forge_server::DEFAULT_BODY_READ_TIMEOUT.as_secs_f64())]
    body_read_timeout: f64,
    /// Origins allowed to call the API from a browser, a JSON list as vLLM takes it
    /// (`["https://a.example"]`, `["*"]`) or a comma list (default: none, no CORS headers).
    #[arg(long, value_name = "LIST", value_parser = origins)]
    allowed_origins: Option<List>,
    /// Methods allowed cross-origin (JSON or comma list; default `["*"]`).
    #[arg(long, value_name = "LIST", value_parser = methods)]
    allowed_methods: Option<List>,
    /// Request headers allowed cross-origin (JSON or comma list; default `["*"]`).
    #[arg(long, value_name = "LIST", value_parser = headers)]
    allowed_headers: Option<List>,
    /// Cross-origin requests may carry credentials (cookies, Authorization).
    #[arg(long)]
    allow_credentials: bool,
    /// No log line per request on stderr.
    #[arg(long)]
    disable_log_requests: bool,
    /// No periodic engine stats on stderr.
    #[arg(long)]
    disable_log_stats: bool,
}

/// A list flag's values (one flag value holds them all, as vLLM takes them).
#[derive(Debug, Clone)]
struct List(Vec<String>);

/// `--allowed-origins` values.
fn origins(v: &str) -> Result<List, String> {
    fp4forge_server::parse_list("allowed-origins", v).map(List)
}

/// `--allowed-methods` values.
fn methods(v: &str) -> Result<List, String> {
    fp4forge_server::parse_list("allowed-methods", v).map(List)
}

/// `--allowed-headers` values.
fn headers(v: &str) -> Result<List, String> {
    fp4forge_server::parse_list("allowed-headers", v).map(List)
}

/// `--load-format` values.
fn parse_load_format(s: &str) -> Result<LoadFormat, String> {
    match s {
        "mmap" => Ok(LoadFormat::Mmap),
        "copy" => Ok(LoadFormat::Copy),
        other => Err(format!("unknown load format {other:?} (mmap, copy)")),
    }
}

/// `secs` of flag `--NAME` as a duration: positive and finite.
fn seconds(name: &str, secs: f64) -> anyhow::Result<Duration> {
    if !(secs.is_finite() && secs > 0.0) {
        anyhow::bail!("--{name} must be a positive number of seconds, got {secs}");
    }
    Duration::try_from_secs_f64(secs).with_context(|| format!("--{name} {secs}"))
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

/// A `--gpu-memory-utilization` value: a fraction in (0, 1].
fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(format!(
            "{s:?}: a fraction of the GPU's memory in (0, 1], e.g. 0.9"
        )),
    }
}

/// A `--kv-cache-memory-bytes` value: a byte count, with an optional K / M / G (powers of
/// 1000) or KiB / MiB / GiB (powers of 1024) suffix.
fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let scale: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        _ => return Err(format!("{s:?}: bytes, e.g. 8000000000, 8G or 8GiB")),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{s:?}: bytes, e.g. 8000000000, 8G or 8GiB"))
}

/// The API key: the flag's, else `$FP4FORGE_API_KEY`, else `$VLLM_API_KEY` (`env` looks a
/// variable up; a variable set but empty is passed on, and refused as an empty key).
fn api_key(flag: Option<String>, env: impl Fn(&str) -> Option<String>) -> Option<String> {
    flag.or_else(|| env("FP4FORGE_API_KEY"))
        .or_else(|| env("VLLM_API_KEY"))
}

impl ServeArgs {
    /// The server configuration these arguments ask for (`env` looks up environment variables).
    fn config(self, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<ServerConfig> {
        if let (Some(f), Device::Cpu) = (self.gpu_memory_utilization, self.device) {
            anyhow::bail!(
                "--gpu-memory-utilization {f}: applies to --device cuda (the CPU's KV caches are \
                 host memory of each sequence; bound it with --max-num-seqs, --max-model-len and \
                 --prefix-cache-mib)"
            );
        }
        Ok(ServerConfig::new(&self.dir)
            .host(self.host)
            .port(self.port)
            .served_model_name(self.served_model_name)
            .max_batch(self.max_batch.unwrap_or(match self.device {
                Device::Cpu => fp4forge_server::DEFAULT_MAX_BATCH,
                Device::Cuda(_) => fp4forge_server::DEFAULT_MAX_BATCH_GPU,
            }))
            .max_tokens_limit(self.max_tokens_limit)
            .max_prompt_tokens(self.max_prompt_tokens)
            .max_context(self.max_context)
            .max_queue(self.max_queue)
            .max_body_bytes(self.max_body_bytes)
            .prefill_budget(self.prefill_budget.unwrap_or(match self.device {
                Device::Cpu => fp4forge_server::DEFAULT_PREFILL_BUDGET,
                Device::Cuda(_) => fp4forge_server::DEFAULT_PREFILL_BUDGET_GPU,
            }))
            .device(self.device)
            .threads(self.threads)
            .cpu_isa(self.cpu_isa)
            .cpu_activations(self.cpu_activations)
            .kv_dtype(self.kv_dtype)
            .gpu_memory_utilization(self.gpu_memory_utilization)
            .kv_cache_memory(self.kv_cache_memory_bytes)
            .prefix_cache_bytes(self.prefix_cache_mib.saturating_mul(1 << 20))
            .drain_timeout(Duration::from_secs(self.drain_timeout))
            .api_key(api_key(self.api_key, env))
            .chat_template(self.chat_template)
            .enable_auto_tool_choice(self.enable_auto_tool_choice)
            .tool_call_parser(self.tool_call_parser)
            .reasoning_parser(self.reasoning_parser)
            .load_format(self.load_format)
            .max_connections(self.max_connections)
            .header_read_timeout(seconds("header-read-timeout", self.header_read_timeout)?)
            .body_read_timeout(seconds("body-read-timeout", self.body_read_timeout)?)
            .allowed_origins(self.allowed_origins.map(|l| l.0).unwrap_or_default())
            .allowed_methods(
                self.allowed_methods
                    .map_or_else(|| vec!["*".into()], |l| l.0),
            )
            .allowed_headers(
                self.allowed_headers
                    .map_or_else(|| vec!["*".into()], |l| l.0),
            )
            .allow_credentials(self.allow_credentials)
            .log_requests(!self.disable_log_requests)
            .stats_interval(
                (!self.disable_log_stats).then_some(fp4forge_server::DEFAULT_STATS_INTERVAL),
            ))
    }
}

/// Runs the subcommand.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = args.config(|name| std::env::var(name).ok())?;
    let auth = if config.api_key.is_some() {
        "API key required on /v1"
    } else {
        "no API key"
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let server = Server::bind(config).await?;
        let kv = server.kv_capacity_bytes().map_or(String::new(), |b| {
            format!(", KV cache {:.2} GiB", b as f64 / (1u64 << 30) as f64)
        });
        eprintln!(
            "fp4forge serve: model `{}` (context {} tokens, backend {}{kv}) on http://{}/v1 ({auth})",
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use fp4forge_engine::KvLimit;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        args: ServeArgs,
    }

    fn config_of(argv: &[&str], env: &[(&str, &str)]) -> anyhow::Result<ServerConfig> {
        let cmd = Cmd::try_parse_from(std::iter::once("serve").chain(argv.iter().copied()))?;
        cmd.args.config(|name| {
            env.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn vllm_spellings_set_the_same_fields() {
        let ours = config_of(
            &[
                "m",
                "--max-batch",
                "7",
                "--max-context",
                "300",
                "--prefill-budget",
                "64",
            ],
            &[],
        )
        .unwrap();
        let vllms =
            config_of(&["m", "--max-num-seqs", "7", "--max-model-len", "300"], &[]).unwrap();
        let vllms = ServerConfig {
            prefill_budget: 64,
            ..vllms
        };
        assert_eq!(ours, vllms);
        let c = config_of(&["m", "--max-num-batched-tokens", "64"], &[]).unwrap();
        assert_eq!(c.prefill_budget, 64);
        // unset: the device's default
        let budget = |args: &[&str]| config_of(args, &[]).unwrap().prefill_budget;
        assert_eq!(budget(&["m"]), fp4forge_server::DEFAULT_PREFILL_BUDGET);
        assert_eq!(
            budget(&["m", "--device", "cuda:1"]),
            fp4forge_server::DEFAULT_PREFILL_BUDGET_GPU
        );
        assert_eq!(c.max_context, None);
        let c = config_of(
            &[
                "m",
                "--host",
                "0.0.0.0",
                "--port",
                "9",
                "--served-model-name",
                "x",
            ],
            &[],
        )
        .unwrap();
        assert_eq!((c.host.as_str(), c.port), ("0.0.0.0", 9));
        assert_eq!(c.served_model_name.as_deref(), Some("x"));
    }

    #[test]
    fn kv_cache_dtypes_take_vllms_names_and_refuse_the_rest() {
        for (arg, want) in [
            ("bf16", KvDtype::Bf16),
            ("auto", KvDtype::Bf16),
            ("bfloat16", KvDtype::Bf16),
            ("fp8", KvDtype::Fp8E4m3),
            ("fp8_e4m3", KvDtype::Fp8E4m3),
            ("f32", KvDtype::F32),
        ] {
            for flag in ["--kv-dtype", "--kv-cache-dtype"] {
                let c = config_of(&["m", flag, arg], &[]).unwrap();
                assert_eq!(c.kv_dtype, want, "{flag} {arg}");
            }
        }
        assert_eq!(config_of(&["m"], &[]).unwrap().kv_dtype, KvDtype::Bf16);
        let err = config_of(&["m", "--kv-cache-dtype", "fp8_e5m2"], &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unsupported KV cache dtype 'fp8_e5m2'"),
            "{err}"
        );
    }

    #[test]
    fn cors_and_logging_flags_take_vllms_spellings() {
        let c = config_of(
            &[
                "m",
                "--allowed-origins",
                r#"["https://a.example"]"#,
                "--allowed-methods",
                "GET,POST",
                "--allow-credentials",
                "--disable-log-requests",
                "--disable-log-stats",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(c.allowed_origins, ["https://a.example"]);
        assert_eq!(c.allowed_methods, ["GET", "POST"]);
        assert_eq!(c.allowed_headers, ["*"]);
        assert!(c.allow_credentials && !c.log_requests && c.stats_interval.is_none());
        let c = config_of(&["m"], &[]).unwrap();
        assert!(c.allowed_origins.is_empty() && c.log_requests && c.stats_interval.is_some());
    }

    #[test]
    fn gpu_memory_utilization_is_a_fraction_for_a_gpu_and_refused_on_the_cpu() {
        let c = config_of(
            &["m", "--device", "cuda", "--gpu-memory-utilization", "0.5"],
            &[],
        )
        .unwrap();
        assert_eq!(c.gpu_memory_utilization, Some(0.5));
        let c = config_of(&["m", "--device", "cuda"], &[]).unwrap();
        assert_eq!(c.gpu_memory_utilization, None);
        let err = config_of(&["m", "--gpu-memory-utilization", "0.9"], &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--gpu-memory-utilization 0.9: applies to --device cuda"),
            "{err}"
        );
        let c = config_of(&["m", "--kv-cache-memory-bytes", "3GiB"], &[]).unwrap();
        assert_eq!(c.kv_cache_memory, Some(3 << 30));
        assert_eq!(c.kv_limit(), Some(KvLimit::Bytes(3 << 30)));
        let c = config_of(&["m", "--kv-cache-memory-bytes", "1500M"], &[]).unwrap();
        assert_eq!(c.kv_cache_memory, Some(1_500_000_000));
        assert!(config_of(&["m", "--kv-cache-memory-bytes", "lots"], &[]).is_err());
        assert!(config_of(&["m", "--kv-cache-memory-bytes", "0"], &[]).is_err());
        let c = config_of(&["m", "--device", "cuda"], &[]).unwrap();
        assert_eq!(c.kv_limit(), Some(KvLimit::DeviceFraction(0.9)));
        assert_eq!(c.max_batch, fp4forge_server::DEFAULT_MAX_BATCH_GPU);
        assert_eq!(
            config_of(&["m"], &[]).unwrap().max_batch,
            fp4forge_server::DEFAULT_MAX_BATCH
        );
        assert_eq!(config_of(&["m"], &[]).unwrap().kv_limit(), None);
        for bad in ["0", "1.5", "-0.2", "most"] {
            assert!(
                config_of(
                    &["m", "--device", "cuda", "--gpu-memory-utilization", bad],
                    &[]
                )
                .is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_api_key_comes_from_the_flag_then_fp4forge_then_vllm_env() {
        let key = |argv: &[&str], env: &[(&str, &str)]| config_of(argv, env).unwrap().api_key;
        let both = [("FP4FORGE_API_KEY", "ours"), ("VLLM_API_KEY", "vllm")];
        assert_eq!(key(&["m"], &[]), None);
        assert_eq!(
            key(&["m", "--api-key", "flag"], &both).as_deref(),
            Some("flag")
        );
        assert_eq!(key(&["m"], &both).as_deref(), Some("ours"));
        assert_eq!(key(&["m"], &both[1..]).as_deref(), Some("vllm"));
    }
}
