//! The `fp4forge` binary: argument parsing and wiring, nothing else.
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// `print!` to stdout, returning the write error (e.g. a closed pipe) instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// `println!` to stdout, returning the write error (e.g. a closed pipe) instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

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

/// `fp4forge --version`: the crate's version and the git commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("FP4FORGE_GIT_COMMIT"),
    ")"
);

/// Lean NVFP4 builds of Mixture-of-Experts language models.
#[derive(Parser)]
#[command(name = "fp4forge", version = VERSION, about)]
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
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
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of our output went away (`fp4forge inspect DIR | head`): stop quietly with
        // success, as ripgrep and the Unix tools that die of SIGPIPE do from the shell's view.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", render_error(&e));
            ExitCode::FAILURE
        }
    }
}

/// Whether an error is, or was caused by, a write to a closed pipe.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `Error: MESSAGE` followed by the causes that add something: a cause whose text the message
/// before it already includes (our errors print their source inline) is not repeated.
fn render_error(e: &anyhow::Error) -> String {
    let mut shown: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if shown.last().is_some_and(|prev| prev.contains(&text)) {
            continue;
        }
        shown.push(text);
    }
    let mut out = format!("Error: {}", shown[0]);
    if shown.len() > 1 {
        out.push_str("\n\nCaused by:");
        for (i, cause) in shown[1..].iter().enumerate() {
            if shown.len() > 2 {
                out.push_str(&format!("\n    {i}: {cause}"));
            } else {
                out.push_str(&format!("\n    {cause}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let text = io.to_string();
        let err = anyhow::Error::new(io)
            .context(format!("/x/config.json: {text}"))
            .context("inspecting /x");
        let shown = render_error(&err);
        assert_eq!(shown.matches(&text).count(), 1, "{shown}");
        assert!(shown.starts_with("Error: inspecting /x"), "{shown}");
        assert!(shown.contains("/x/config.json"), "{shown}");
        let pipe = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
            .context("writing to stdout");
        assert!(is_broken_pipe(&pipe));
        assert!(!is_broken_pipe(&err));
    }

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
