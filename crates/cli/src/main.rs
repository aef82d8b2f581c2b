//! The `fp4forge` binary: argument parsing and wiring, nothing else.
use clap::{Parser, Subcommand};

mod cmd_inspect;

/// Lean NVFP4 builds of Mixture-of-Experts language models.
#[derive(Parser)]
#[command(name = "fp4forge", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Parameters and bytes per component, bytes per decoded token, KV cache, decode ceilings.
    Inspect(cmd_inspect::InspectArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Inspect(args) => cmd_inspect::run(args),
    }
}
