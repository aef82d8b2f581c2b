//! `fp4forge context DIR --max-context 256k|1m`: switch the YaRN settings and
//! `max_position_embeddings` of a checkpoint's config.json, in place.

use std::path::PathBuf;

use fp4forge_builder::context::{set_max_context, MaxContext};

/// Arguments of `fp4forge context`.
#[derive(clap::Args)]
pub struct ContextArgs {
    /// Checkpoint directory (or its config.json).
    dir: PathBuf,
    /// Maximum context: 256k (YaRN factor 32) or 1m (YaRN factor 128).
    #[arg(long, value_parser = ["256k", "1m"])]
    max_context: String,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs the subcommand.
pub fn run(args: ContextArgs) -> anyhow::Result<()> {
    let max: MaxContext = args.max_context.parse().map_err(anyhow::Error::msg)?;
    let report = set_max_context(&args.dir, max)?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
        return Ok(());
    }
    let settings = format!(
        "max context {max}: factor {}, attention_factor {}, max_position_embeddings {} in {}",
        max.factor(),
        max.attention_factor(),
        max.max_position_embeddings(),
        report.blocks.join(", ")
    );
    if report.changed {
        outln!("{}: set {settings}", report.config.display())?;
    } else {
        outln!("{}: already {settings}", report.config.display())?;
    }
    Ok(())
}
