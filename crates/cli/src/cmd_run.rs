//! `fp4forge run DIR --prompt TEXT`: generate with the native engine, streamed to the terminal.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use fp4forge_engine::{
    Backend, ChatMessage, CpuActivations, CpuIsa, Device, GenerateOptions, KvDtype, Model,
    ModelOptions, SamplingParams, StopReason, TextCodec, WithModel,
};

/// Arguments of `fp4forge run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// Checkpoint directory (bf16, or compressed-tensors NVFP4: weights stay packed).
    dir: PathBuf,
    /// Prompt text (tokenized with the checkpoint's tokenizer.json).
    #[arg(long, conflicts_with = "prompt_ids")]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids (for checkpoints without a tokenizer).
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Wrap the prompt as a user message in the checkpoint's chat template.
    #[arg(long)]
    chat: bool,
    /// System message (with --chat).
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Keep generating past the end-of-sequence tokens (exactly --max-tokens are generated
    /// unless the context fills): what speed measurements want.
    #[arg(long)]
    ignore_eos: bool,
    /// Print one JSON object on stdout (text, token ids, why it stopped, speeds) instead of
    /// streaming the text.
    #[arg(long)]
    json: bool,
    /// Sampling temperature; 0 is greedy. Default: generation_config.json (greedy without it).
    #[arg(long)]
    temperature: Option<f32>,
    /// Nucleus sampling mass. Default: generation_config.json, else 1.
    #[arg(long)]
    top_p: Option<f32>,
    /// Keep the k most likely tokens (0: all). Default: generation_config.json, else 0.
    #[arg(long)]
    top_k: Option<usize>,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// KV cache storage: bf16, fp8 (e4m3) or f32 (vLLM's spellings `auto`, `bfloat16`,
    /// `fp8_e4m3`, `float32` too).
    #[arg(long, default_value = "bf16")]
    kv_dtype: KvDtype,
    /// Quantize activations of W4A4 modules to NVFP4 as Blackwell does (default: weight-only).
    #[arg(long)]
    emulate_w4a4: bool,
    /// Where the engine runs: cpu, or cuda[:N] (GPU N, default 0; needs a build with the `cuda`
    /// feature).
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// CPU worker threads (default: all cores; ignored with --device cuda).
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
}

/// Runs the subcommand.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let options = ModelOptions::new()
        .kv_dtype(args.kv_dtype)
        .emulate_w4a4(args.emulate_w4a4)
        .threads(args.threads)
        .cpu_isa(args.cpu_isa)
        .cpu_activations(args.cpu_activations)
        .prefill_chunk(args.device.default_prefill_chunk());
    let started = Instant::now();
    fp4forge_engine::open(args.device, &args.dir, options, Generate(&args, started))?
}

/// [`generate`] on whichever backend the device gives (the load started at the instant).
struct Generate<'a>(&'a RunArgs, Instant);

impl WithModel for Generate<'_> {
    type Output = anyhow::Result<()>;

    fn with<B: Backend>(self, model: Model<B>) -> anyhow::Result<()> {
        generate(&model, self.0, self.1.elapsed().as_secs_f64())
    }
}

/// Generates from the prompt of `args` with `model` (on any backend), streamed to stdout.
fn generate<B: Backend>(model: &Model<B>, args: &RunArgs, load_seconds: f64) -> anyhow::Result<()> {
    let info = model.info().clone();
    let codec = if args.dir.join("tokenizer.json").exists() {
        Some(TextCodec::load(&args.dir)?)
    } else {
        None
    };
    let prompt: Vec<u32> = match (&args.prompt, &args.prompt_ids, &codec) {
        (_, Some(ids), _) => ids.clone(),
        (Some(text), None, Some(codec)) => {
            let text = if args.chat {
                let mut messages = Vec::new();
                if let Some(system) = &args.system {
                    messages.push(ChatMessage {
                        role: "system".into(),
                        content: system.clone(),
                    });
                }
                messages.push(ChatMessage {
                    role: "user".into(),
                    content: text.clone(),
                });
                codec.render_chat(&messages, true)?
            } else {
                text.clone()
            };
            codec.encode(&text, true)?
        }
        (Some(_), None, None) => bail!(
            "{} has no tokenizer.json: pass the prompt as --prompt-ids",
            args.dir.display()
        ),
        (None, None, _) => bail!("give --prompt TEXT or --prompt-ids IDS"),
    };
    if prompt.len() >= info.max_context {
        bail!(
            "the prompt has {} tokens; the context of {} is {} tokens",
            prompt.len(),
            args.dir.display(),
            info.max_context
        );
    }

    let defaults = &info.generation_defaults;
    let sampled_by_default = defaults.do_sample.unwrap_or(false);
    let temperature = args.temperature.unwrap_or(if sampled_by_default {
        defaults.temperature.unwrap_or(1.0)
    } else {
        0.0
    });
    let sampling = SamplingParams {
        temperature,
        top_k: args.top_k.unwrap_or(defaults.top_k.unwrap_or(0)),
        top_p: args.top_p.unwrap_or(defaults.top_p.unwrap_or(1.0)),
        seed: args.seed,
    };
    let mut stop_tokens = if args.ignore_eos {
        Vec::new()
    } else {
        info.eos_token_ids.clone()
    };
    if let (Some(codec), false) = (&codec, args.ignore_eos) {
        stop_tokens.extend(
            codec
                .stop_ids()
                .iter()
                .filter(|id| !stop_tokens.contains(id))
                .copied()
                .collect::<Vec<_>>(),
        );
    }
    let generate = GenerateOptions {
        max_tokens: args.max_tokens,
        sampling,
        stop_tokens,
    };

    let mut session = model.new_session()?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut stream = codec.as_ref().map(|c| c.stream());
    let mut write_error = None;
    let generation = session
        .generate(&prompt, &generate, |token| {
            let piece = match stream.as_mut() {
                Some(s) => s.push(token).unwrap_or_default(),
                None => format!("{token} "),
            };
            if args.json {
                return true;
            }
            if let Err(e) = out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
                write_error = Some(e);
                return false;
            }
            true
        })
        .context("generating")?;
    if let Some(e) = write_error {
        return Err(e).context("writing to stdout");
    }
    let s = &generation.stats;
    let why = match generation.stop {
        StopReason::MaxTokens => "max tokens".to_string(),
        StopReason::StopToken(id) => format!("stop token {id}"),
        StopReason::Callback => "stopped".to_string(),
        StopReason::ContextFull => "context full".to_string(),
    };
    if args.json {
        let text = match &codec {
            Some(c) => Some(c.decode(&generation.tokens, false)?),
            None => None,
        };
        let report = serde_json::json!({
            "model": args.dir.display().to_string(),
            "architecture": info.architecture,
            "backend": info.backend,
            "text": text,
            "tokens": generation.tokens,
            "stop": why,
            "prompt_tokens": s.prompt_tokens,
            "prefill_seconds": s.prefill_time.as_secs_f64(),
            "prefill_tokens_per_second": s.prefill_tokens_per_second(),
            "decode_steps": s.decode_steps,
            "decode_seconds": s.decode_time.as_secs_f64(),
            "decode_tokens_per_second": s.decode_tokens_per_second(),
            "load_seconds": load_seconds,
        });
        writeln!(out, "{report}")?;
        return Ok(());
    }
    writeln!(out)?;
    eprintln!(
        "[{} | {} | loaded in {load_seconds:.2} s | {} prompt tokens: prefill {:.1} tok/s | {} generated ({why}): decode {:.1} tok/s | {}]",
        info.architecture,
        info.backend,
        s.prompt_tokens,
        s.prefill_tokens_per_second(),
        generation.tokens.len(),
        s.decode_tokens_per_second(),
        if sampling.is_greedy() {
            "greedy".to_string()
        } else {
            format!(
                "temperature {} top-k {} top-p {} seed {}",
                sampling.temperature, sampling.top_k, sampling.top_p, sampling.seed
            )
        }
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_is_a_clear_error() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            run: super::RunArgs,
        }
        let cli =
            Cli::try_parse_from(["run", "no-such-dir", "--prompt", "hi", "--device", "cuda:2"])
                .unwrap();
        let message = format!("{:#}", super::run(cli.run).unwrap_err());
        assert!(message.contains("device cuda:2"), "{message}");
        assert!(message.contains("`cuda` feature"), "{message}");
    }
}
