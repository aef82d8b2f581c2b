//! The `fp4forge` binary: argument parsing and wiring, nothing else.
use clap::{Parser, Subcommand};

/// Lean NVFP4 builds of Mixture-of-Experts language models.
#[derive(Parser)]
#[command(name = "fp4forge", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {}
}
