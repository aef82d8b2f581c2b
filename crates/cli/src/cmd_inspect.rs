//! `fp4forge inspect`: bytes per component, per decoded token, KV cache and decode ceilings.

use std::path::PathBuf;

use anyhow::Context;
use fp4forge_builder::inspect::{Comparison, HardwareProfile, Inspector};

/// Arguments of `fp4forge inspect`.
#[derive(clap::Args)]
pub struct InspectArgs {
    /// Checkpoint directory or config.json (a bare config needs no weights).
    path: PathBuf,
    /// A second checkpoint or config.json to compare against (before = PATH, after = this).
    #[arg(long, value_name = "DIR|config.json")]
    against: Option<PathBuf>,
    /// Device to show: a built-in (GB10, RTX-Pro-6000, H200, B200) or NAME=GB/s; repeatable.
    /// Default: all built-ins.
    #[arg(long, value_name = "NAME[=GB/s]")]
    hardware: Vec<String>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs the subcommand.
pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    let mut inspector = Inspector::new();
    if !args.hardware.is_empty() {
        let profiles = args
            .hardware
            .iter()
            .map(|h| HardwareProfile::parse(h))
            .collect::<Result<Vec<_>, _>>()?;
        inspector = inspector.hardware(profiles);
    }
    let inspect = |p: &PathBuf| {
        inspector
            .inspect_path(p)
            .with_context(|| format!("inspecting {}", p.display()))
    };
    let before = inspect(&args.path)?;
    match &args.against {
        None if args.json => outln!("{}", serde_json::to_string_pretty(&before)?)?,
        None => out!("{before}")?,
        Some(other) => {
            let cmp = Comparison::new(before, inspect(other)?);
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&cmp)?)?;
            } else {
                out!("{cmp}")?;
            }
        }
    }
    Ok(())
}
