//! [`ServerConfig`]: what to serve, where, and the limits every request is held to.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fp4forge_engine::{CpuActivations, CpuIsa, Device, KvDtype, KvLimit, LoadFormat};

use crate::parsers::{ReasoningFormat, ToolFormat};

/// Default most sequences advanced together per engine step.
pub const DEFAULT_MAX_BATCH: usize = 32;
/// [`DEFAULT_MAX_BATCH`] on a GPU (vLLM's default `--max-num-seqs`): there the paged KV
/// memory admits sequences, the count only bounds a step.
pub const DEFAULT_MAX_BATCH_GPU: usize = 256;
/// Default ceiling on `max_tokens`.
pub const DEFAULT_MAX_TOKENS_LIMIT: usize = 8192;
/// Default most requests waiting for a batch slot.
pub const DEFAULT_MAX_QUEUE: usize = 1024;
/// Default largest request body, bytes.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 << 20;
/// Default prompt tokens prefilled per engine step (over all sequences) on the CPU.
pub const DEFAULT_PREFILL_BUDGET: usize = 256;
/// Default prompt tokens prefilled per engine step on a GPU: tensor-core GEMMs want thousands
/// of rows per weight read (vLLM's default `max_num_batched_tokens` for online serving, 2048).
pub const DEFAULT_PREFILL_BUDGET_GPU: usize = 2048;
/// Default most top alternatives per token (`logprobs`, `top_logprobs`).
pub const DEFAULT_MAX_LOGPROBS: usize = 20;
/// Default most sequences one request may ask for (prompts × `n`).
pub const DEFAULT_MAX_CHOICES: usize = 64;
/// Default most connections open at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// Default time a client has to send a request's headers.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time a client has to send a request's body once its headers are in.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Default time between two engine stats lines (vLLM's 10 s).
pub const DEFAULT_STATS_INTERVAL: Duration = Duration::from_secs(10);
/// Default budget of the prefix cache: KV storage of finished sequences kept for reuse, bytes.
pub const DEFAULT_PREFIX_CACHE_BYTES: usize = 1 << 30;
/// The fraction of a GPU's memory a server on it uses, weights and KV caches together, when
/// none is given (vLLM's default).
pub const DEFAULT_GPU_MEMORY_UTILIZATION: f64 = 0.9;

/// How the server runs: plain data (every field public) with builder-style setters of the same
/// names, e.g. `ServerConfig::new("model").port(0).max_batch(8)`.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// The checkpoint directory (with `tokenizer.json`).
    pub model_dir: PathBuf,
    /// Address to listen on (default `127.0.0.1`).
    pub host: String,
    /// Port (default 8000; 0 picks a free one).
    pub port: u16,
    /// The model name clients put in requests (default: the directory's name).
    pub served_model_name: Option<String>,
    /// Most sequences advanced together per engine step.
    pub max_batch: usize,
    /// Ceiling on a request's `max_tokens`.
    pub max_tokens_limit: usize,
    /// Longest prompt, tokens (default: the model's context).
    pub max_prompt_tokens: Option<usize>,
    /// Most requests waiting for a batch slot; more are refused with 429.
    pub max_queue: usize,
    /// Largest request body, bytes; larger ones are refused with 413.
    pub max_body_bytes: usize,
    /// Prompt tokens prefilled per engine step, over all sequences (bounds how long one step
    /// makes the running sequences wait).
    pub prefill_budget: usize,
    /// Most top alternatives per token a request may ask for.
    pub max_logprobs: usize,
    /// Most sequences (prompts × `n`) one request may ask for.
    pub max_choices: usize,
    /// Where the engine runs (default: the CPU).
    pub device: Device,
    /// CPU threads of the engine (0: one per core; ignored on CUDA).
    pub threads: usize,
    /// The CPU kernels' instruction set (default: the best the CPU has; ignored on CUDA).
    pub cpu_isa: CpuIsa,
    /// What the CPU's decode steps multiply NVFP4 weights with (default f32; ignored on CUDA).
    pub cpu_activations: CpuActivations,
    /// KV cache storage.
    pub kv_dtype: KvDtype,
    /// On a GPU: the fraction of its memory the server uses; what the weights leave of it
    /// caps the paged KV caches, and sequences are admitted (and preempted) by the room left.
    /// `None`: [`DEFAULT_GPU_MEMORY_UTILIZATION`] on a GPU. Must be `None` on the CPU.
    pub gpu_memory_utilization: Option<f64>,
    /// The KV caches' memory cap in bytes (GPU or CPU), instead of the GPU fraction.
    pub kv_cache_memory: Option<usize>,
    /// Caps the model's context (default: the checkpoint's).
    pub max_context: Option<usize>,
    /// KV storage of finished sequences kept so that later requests sharing a prompt prefix
    /// skip its prefill, bytes (0 disables prefix caching).
    pub prefix_cache_bytes: usize,
    /// How long a shutdown waits for requests in flight before giving up on them.
    pub drain_timeout: Duration,
    /// A chat template file used instead of the checkpoint's (`--chat-template`).
    pub chat_template: Option<PathBuf>,
    /// Whether requests with `tools` (and `tool_choice: auto`) get their tool calls parsed
    /// (`--enable-auto-tool-choice`).
    pub enable_auto_tool_choice: bool,
    /// The tool-call format (`--tool-call-parser`; default: detected from the chat template
    /// when auto tool choice is on).
    pub tool_call_parser: Option<ToolFormat>,
    /// The reasoning format (`--reasoning-parser`; default: none, reasoning stays in the content).
    pub reasoning_parser: Option<ReasoningFormat>,
    /// The key every `/v1` request must carry as `Authorization: Bearer KEY` (default: none,
    /// the API is open); `/health` and `/metrics` stay open either way.
    pub api_key: Option<String>,
    /// How the weight files are held (`--load-format`): memory-mapped (default) or copied into
    /// memory, which a file truncated while serving cannot crash.
    pub load_format: LoadFormat,
    /// Most connections open at once; one more is answered 503 and closed.
    pub max_connections: usize,
    /// Time a client has to send a request's headers (else the connection is closed).
    pub header_read_timeout: Duration,
    /// Time a client has to send a request's body once its headers are in (else 408).
    pub body_read_timeout: Duration,
    /// Origins allowed to call the API from a browser (`--allowed-origins`; `*`: any). Empty
    /// (the default): no CORS headers at all.
    pub allowed_origins: Vec<String>,
    /// Methods allowed cross-origin (`--allowed-methods`; default `*`).
    pub allowed_methods: Vec<String>,
    /// Request headers allowed cross-origin (`--allowed-headers`; default `*`).
    pub allowed_headers: Vec<String>,
    /// Whether cross-origin requests may carry credentials (`--allow-credentials`).
    pub allow_credentials: bool,
    /// Whether each request is logged on stderr (off: `--disable-log-requests`).
    pub log_requests: bool,
    /// How often engine stats are logged on stderr while busy (`None`: `--disable-log-stats`).
    pub stats_interval: Option<Duration>,
}

impl ServerConfig {
    /// The defaults for serving `model_dir`.
    pub fn new(model_dir: impl AsRef<Path>) -> Self {
        Self {
            model_dir: model_dir.as_ref().to_path_buf(),
            host: "127.0.0.1".into(),
            port: 8000,
            served_model_name: None,
            max_batch: DEFAULT_MAX_BATCH,
            max_tokens_limit: DEFAULT_MAX_TOKENS_LIMIT,
            max_prompt_tokens: None,
            max_queue: DEFAULT_MAX_QUEUE,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            prefill_budget: DEFAULT_PREFILL_BUDGET,
            max_logprobs: DEFAULT_MAX_LOGPROBS,
            max_choices: DEFAULT_MAX_CHOICES,
            device: Device::Cpu,
            threads: 0,
            cpu_isa: CpuIsa::Auto,
            cpu_activations: CpuActivations::F32,
            kv_dtype: KvDtype::Bf16,
            gpu_memory_utilization: None,
            kv_cache_memory: None,
            max_context: None,
            prefix_cache_bytes: DEFAULT_PREFIX_CACHE_BYTES,
            drain_timeout: Duration::from_secs(60),
            chat_template: None,
            enable_auto_tool_choice: false,
            tool_call_parser: None,
            reasoning_parser: None,
            api_key: None,
            load_format: LoadFormat::Mmap,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            allowed_origins: Vec::new(),
            allowed_methods: vec!["*".into()],
            allowed_headers: vec!["*".into()],
            allow_credentials: false,
            log_requests: true,
            stats_interval: Some(DEFAULT_STATS_INTERVAL),
        }
    }

    /// Sets [`ServerConfig::allowed_origins`].
    pub fn allowed_origins(mut self, origins: Vec<String>) -> Self {
        self.allowed_origins = origins;
        self
    }

    /// Sets [`ServerConfig::allowed_methods`].
    pub fn allowed_methods(mut self, methods: Vec<String>) -> Self {
        self.allowed_methods = methods;
        self
    }

    /// Sets [`ServerConfig::allowed_headers`].
    pub fn allowed_headers(mut self, headers: Vec<String>) -> Self {
        self.allowed_headers = headers;
        self
    }

    /// Sets [`ServerConfig::allow_credentials`].
    pub fn allow_credentials(mut self, on: bool) -> Self {
        self.allow_credentials = on;
        self
    }

    /// Sets [`ServerConfig::log_requests`].
    pub fn log_requests(mut self, on: bool) -> Self {
        self.log_requests = on;
        self
    }

    /// Sets [`ServerConfig::stats_interval`].
    pub fn stats_interval(mut self, every: Option<Duration>) -> Self {
        self.stats_interval = every;
        self
    }

    /// Sets [`ServerConfig::chat_template`].
    pub fn chat_template(mut self, file: Option<PathBuf>) -> Self {
        self.chat_template = file;
        self
    }

    /// Sets [`ServerConfig::enable_auto_tool_choice`].
    pub fn enable_auto_tool_choice(mut self, on: bool) -> Self {
        self.enable_auto_tool_choice = on;
        self
    }

    /// Sets [`ServerConfig::tool_call_parser`].
    pub fn tool_call_parser(mut self, format: Option<ToolFormat>) -> Self {
        self.tool_call_parser = format;
        self
    }

    /// Sets [`ServerConfig::reasoning_parser`].
    pub fn reasoning_parser(mut self, format: Option<ReasoningFormat>) -> Self {
        self.reasoning_parser = format;
        self
    }

    /// Sets [`ServerConfig::host`].
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.host = host.into();
        self
    }

    /// Sets [`ServerConfig::port`].
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Sets [`ServerConfig::served_model_name`].
    pub fn served_model_name(mut self, name: Option<String>) -> Self {
        self.served_model_name = name;
        self
    }

    /// Sets [`ServerConfig::max_batch`].
    pub fn max_batch(mut self, n: usize) -> Self {
        self.max_batch = n;
        self
    }

    /// Sets [`ServerConfig::max_tokens_limit`].
    pub fn max_tokens_limit(mut self, n: usize) -> Self {
        self.max_tokens_limit = n;
        self
    }

    /// Sets [`ServerConfig::max_prompt_tokens`].
    pub fn max_prompt_tokens(mut self, n: Option<usize>) -> Self {
        self.max_prompt_tokens = n;
        self
    }

    /// Sets [`ServerConfig::max_queue`].
    pub fn max_queue(mut self, n: usize) -> Self {
        self.max_queue = n;
        self
    }

    /// Sets [`ServerConfig::max_body_bytes`].
    pub fn max_body_bytes(mut self, n: usize) -> Self {
        self.max_body_bytes = n;
        self
    }

    /// Sets [`ServerConfig::prefill_budget`].
    pub fn prefill_budget(mut self, n: usize) -> Self {
        self.prefill_budget = n;
        self
    }

    /// Sets [`ServerConfig::device`].
    pub fn device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// Sets [`ServerConfig::threads`].
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = n;
        self
    }

    /// Sets [`ServerConfig::cpu_isa`].
    pub fn cpu_isa(mut self, isa: CpuIsa) -> Self {
        self.cpu_isa = isa;
        self
    }

    /// Sets [`ServerConfig::cpu_activations`].
    pub fn cpu_activations(mut self, act: CpuActivations) -> Self {
        self.cpu_activations = act;
        self
    }

    /// Sets [`ServerConfig::kv_dtype`].
    pub fn kv_dtype(mut self, dtype: KvDtype) -> Self {
        self.kv_dtype = dtype;
        self
    }

    /// Sets [`ServerConfig::gpu_memory_utilization`].
    pub fn gpu_memory_utilization(mut self, fraction: Option<f64>) -> Self {
        self.gpu_memory_utilization = fraction;
        self
    }

    /// Sets [`ServerConfig::kv_cache_memory`].
    pub fn kv_cache_memory(mut self, bytes: Option<usize>) -> Self {
        self.kv_cache_memory = bytes;
        self
    }

    /// The cap on the KV caches these settings ask for: the bytes given, else on a GPU the
    /// fraction given or [`DEFAULT_GPU_MEMORY_UTILIZATION`]; on the CPU without bytes none (a
    /// fraction there is passed on, and refused by the engine by name).
    pub fn kv_limit(&self) -> Option<KvLimit> {
        if let Some(b) = self.kv_cache_memory {
            return Some(KvLimit::Bytes(b));
        }
        match self.device {
            Device::Cpu => self.gpu_memory_utilization.map(KvLimit::DeviceFraction),
            _ => Some(KvLimit::DeviceFraction(
                self.gpu_memory_utilization
                    .unwrap_or(DEFAULT_GPU_MEMORY_UTILIZATION),
            )),
        }
    }

    /// Sets [`ServerConfig::max_context`].
    pub fn max_context(mut self, n: Option<usize>) -> Self {
        self.max_context = n;
        self
    }

    /// Sets [`ServerConfig::prefix_cache_bytes`].
    pub fn prefix_cache_bytes(mut self, n: usize) -> Self {
        self.prefix_cache_bytes = n;
        self
    }

    /// Sets [`ServerConfig::drain_timeout`].
    pub fn drain_timeout(mut self, t: Duration) -> Self {
        self.drain_timeout = t;
        self
    }

    /// Sets [`ServerConfig::api_key`].
    pub fn api_key(mut self, key: Option<String>) -> Self {
        self.api_key = key;
        self
    }

    /// Sets [`ServerConfig::load_format`].
    pub fn load_format(mut self, format: LoadFormat) -> Self {
        self.load_format = format;
        self
    }

    /// Sets [`ServerConfig::max_connections`].
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n;
        self
    }

    /// Sets [`ServerConfig::header_read_timeout`].
    pub fn header_read_timeout(mut self, t: Duration) -> Self {
        self.header_read_timeout = t;
        self
    }

    /// Sets [`ServerConfig::body_read_timeout`].
    pub fn body_read_timeout(mut self, t: Duration) -> Self {
        self.body_read_timeout = t;
        self
    }

    /// The served model name: the configured one, else the directory's last component.
    pub fn model_name(&self) -> String {
        if let Some(n) = &self.served_model_name {
            return n.clone();
        }
        let canonical = self.model_dir.canonicalize().ok();
        canonical
            .as_deref()
            .unwrap_or(&self.model_dir)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    }

    /// Checks the limits are usable.
    pub(crate) fn validate(&self) -> Result<(), crate::ServerError> {
        let bad = |m: &str| Err(crate::ServerError::Config(m.to_string()));
        if self.max_batch == 0 {
            return bad("max_batch must be at least 1");
        }
        if self.max_queue == 0 {
            return bad("max_queue must be at least 1");
        }
        if self.prefill_budget == 0 {
            return bad("prefill_budget must be at least 1");
        }
        if self.max_choices == 0 {
            return bad("max_choices must be at least 1");
        }
        if self.max_connections == 0 {
            return bad("max_connections must be at least 1");
        }
        if self.header_read_timeout.is_zero() || self.body_read_timeout.is_zero() {
            return bad("the header and body read timeouts must be more than 0 seconds");
        }
        if self.served_model_name.as_deref() == Some("") {
            return bad("the served model name is empty");
        }
        if let Some(key) = &self.api_key {
            if key.is_empty() {
                return bad("the API key is empty");
            }
            if key.bytes().any(|b| !(0x21..=0x7e).contains(&b)) {
                return bad(
                    "the API key must be printable ASCII without spaces (it travels in an \
                     HTTP header)",
                );
            }
        }
        if self.stats_interval.is_some_and(|t| t.is_zero()) {
            return bad("the stats interval must be more than 0 seconds");
        }
        crate::cors::layer(self)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_on_the_cpu_by_default() {
        assert_eq!(ServerConfig::new("m").device, Device::Cpu);
    }

    #[test]
    fn api_keys_must_be_usable_in_a_header() {
        let with = |k: &str| ServerConfig::new("m").api_key(Some(k.into())).validate();
        assert!(with("sk-local-123").is_ok());
        for bad in ["", "two words", "tab\there", "caf\u{e9}"] {
            let err = with(bad).unwrap_err().to_string();
            assert!(err.contains("API key"), "{bad:?}: {err}");
        }
        assert!(ServerConfig::new("m").validate().is_ok());
    }
}
