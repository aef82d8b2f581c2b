//! The `fp4forge` binary: argument parsing and wiring, nothing else.
use clap::{Parser, Subcommand};

mod cmd_context;
mod cmd_inspect;
mod cmd_quantize;
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
    /// Parameters and bytes per component, bytes per decoded token, KV cache, decode ceilings.
    Inspect(cmd_inspect::InspectArgs),
    /// Write a synthetic Laguna checkpoint (seeded random weights), bf16 or stock NVFP4.
    Synth(cmd_synth::SynthArgs),
    /// Switch a checkpoint's maximum context (full-attention YaRN, max_position_embeddings).
    Context(cmd_context::ContextArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Quantize(args) => cmd_quantize::run(args),
        Command::Verify(args) => cmd_verify::run(args),
        Command::Inspect(args) => cmd_inspect::run(args),
        Command::Synth(args) => cmd_synth::run(args),
        Command::Context(args) => cmd_context::run(args),
    }
}
