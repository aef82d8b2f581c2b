//! The `fp4forge` binary: argument parsing and wiring, nothing else.
use clap::{Parser, Subcommand};

mod cmd_bench;
mod cmd_context;
mod cmd_eval;
mod cmd_import_gguf;
mod cmd_inspect;
mod cmd_quantize;
mod cmd_run;
mod cmd_serve;
mod cmd_synth;
mod cmd_verify;
mod progress;

/// Lean NVFP4 builds of Mixture-of-Experts language models.
#[derive(Parser)]
#[command(name = "fp4forge", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Quantize modules of a checkpoint to NVFP4 (weight-only), streaming, bit-exact with
    /// compressed-tensors.
    Quantize(cmd_quantize::QuantizeArgs),
    /// Prove that DST was built from SRC: re-derive every quantized tensor bit for bit, compare
    /// every other tensor byte for byte, check the config.
    Verify(cmd_verify::VerifyArgs),
    /// Generate text with the native engine (CPU or CUDA), streamed to the terminal.
    Run(cmd_run::RunArgs),
    /// Parameters and bytes per component, bytes per decoded token, KV cache, decode ceilings.
    Inspect(cmd_inspect::InspectArgs),
    /// Write a synthetic Laguna checkpoint (seeded random weights), bf16 or stock NVFP4.
    Synth(cmd_synth::SynthArgs),
    /// Switch a checkpoint's maximum context (full-attention YaRN, max_position_embeddings).
    Context(cmd_context::ContextArgs),
    /// Convert a llama.cpp GGUF (llama, qwen2) to an HF checkpoint: dequantized bf16 weights,
    /// config.json, tokenizer.json and chat template.
    ImportGguf(cmd_import_gguf::ImportGgufArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (continuous batching).
    Serve(cmd_serve::ServeArgs),
    /// Decode/prefill speed at exact prompt lengths and a concurrency sweep, against any
    /// OpenAI-compatible server (ours or vLLM's).
    Bench(cmd_bench::BenchArgs),
    /// Task scores with standard errors (log-likelihood multiple choice, GSM8K, WikiText
    /// perplexity), optionally paired against a second endpoint (deltas, KL).
    Eval(cmd_eval::EvalArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Quantize(args) => cmd_quantize::run(args),
        Command::Verify(args) => cmd_verify::run(args),
        Command::Inspect(args) => cmd_inspect::run(args),
        Command::Run(args) => cmd_run::run(args),
        Command::Synth(args) => cmd_synth::run(args),
        Command::Context(args) => cmd_context::run(args),
        Command::ImportGguf(args) => cmd_import_gguf::run(args),
        Command::Serve(args) => cmd_serve::run(args),
        Command::Bench(args) => cmd_bench::run(args),
        Command::Eval(args) => cmd_eval::run(args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_is_parsed_for_run_and_serve() {
        for sub in ["run", "serve"] {
            for arg in ["cpu", "cuda", "cuda:1"] {
                let cli = Cli::try_parse_from(["fp4forge", sub, "dir", "--device", arg]);
                assert!(cli.is_ok(), "{sub} --device {arg}");
            }
            let err = Cli::try_parse_from(["fp4forge", sub, "dir", "--device", "tpu"])
                .err()
                .unwrap()
                .to_string();
            assert!(
                err.contains("unknown device 'tpu': expected cpu or cuda[:N]"),
                "{err}"
            );
        }
    }
}
