//! `fp4forge synth DST`: write a synthetic Laguna checkpoint (seeded random weights).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use fp4forge_builder::synth::{Preset, SynthBuilder, DEFAULT_SEED};
use serde_json::{Map, Value};

use crate::progress::Bar;

/// Arguments of `fp4forge synth`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("model").required(true).args(["preset", "config"])))]
pub struct SynthArgs {
    /// Output directory (created atomically).
    dst: PathBuf,
    /// A built-in geometry: tiny (tests, < 1 MB), xs (Laguna-XS-2.1, 33 B params), s
    /// (Laguna-S-2.1, 118 B params).
    #[arg(long, value_parser = ["tiny", "xs", "s"])]
    preset: Option<String>,
    /// A Laguna config.json to take the geometry from (written to DST as given).
    #[arg(long, value_name = "CONFIG_JSON")]
    config: Option<PathBuf>,
    /// Seed of every value: same seed, same bytes.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    seed: u64,
    /// Write the vendor stock NVFP4 layout: routed experts NVFP4 W4A4, the rest bf16.
    #[arg(long)]
    stock_nvfp4: bool,
    /// Replace an existing DST.
    #[arg(long)]
    force: bool,
    /// Worker threads (default: all cores; the output does not depend on it).
    #[arg(long)]
    threads: Option<usize>,
    /// Largest output shard in bytes (default 5 GB).
    #[arg(long, value_name = "BYTES")]
    max_shard_size: Option<u64>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs the subcommand.
pub fn run(args: SynthArgs) -> anyhow::Result<()> {
    crate::progress::set_threads(args.threads)?;
    let mut builder = SynthBuilder::new()
        .seed(args.seed)
        .stock_nvfp4(args.stock_nvfp4)
        .force(args.force);
    if let Some(bytes) = args.max_shard_size {
        builder = builder.max_shard_bytes(bytes);
    }
    let plan = match (&args.preset, &args.config) {
        (Some(name), _) => {
            builder.plan_preset(name.parse::<Preset>().map_err(anyhow::Error::msg)?)?
        }
        (None, Some(path)) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let config: Map<String, Value> = serde_json::from_slice(&bytes)
                .with_context(|| format!("{}: not a JSON object", path.display()))?;
            builder.plan(&config, &path.display().to_string())?
        }
        (None, None) => anyhow::bail!("give --preset or --config"),
    };
    crate::progress::install_interrupt_handler();
    let bar = Bar::new("synth");
    let started = Instant::now();
    let report = builder.write(&plan, &args.dst, &bar);
    bar.finish();
    let report = report?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        outln!(
            "wrote {} in {:.2} s: {} tensors, {} parameters, {:.3} GB of tensor data in {} shard(s) \
             ({}, seed {})",
            report.dir.display(),
            started.elapsed().as_secs_f64(),
            report.tensors,
            plan.parameter_count(),
            report.total_bytes as f64 / 1e9,
            report.shards.len(),
            if report.stock_nvfp4 {
                "stock NVFP4: routed experts W4A4, rest bf16"
            } else {
                "bf16"
            },
            report.seed
        )?;
    }
    Ok(())
}
