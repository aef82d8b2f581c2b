//! `fp4forge quantize SRC DST`: build an NVFP4 checkpoint by streaming.

use std::path::PathBuf;

use fp4forge_builder::build::QuantizeBuilder;
use fp4forge_builder::plan::PlanSummary;

use crate::progress::Bar;

/// Arguments of `fp4forge quantize`.
#[derive(clap::Args)]
pub struct QuantizeArgs {
    /// Source checkpoint directory (never written).
    src: PathBuf,
    /// Output directory (created atomically).
    dst: PathBuf,
    /// Modules to quantize: `re:REGEX` (matched at the start), an exact module name, or
    /// `Linear` (every linear layer). Repeatable. Default: attention q/k/v/o.
    #[arg(long, value_name = "PAT")]
    targets: Vec<String>,
    /// Modules to leave alone (same syntax; wins over --targets). Repeatable.
    #[arg(long, value_name = "PAT")]
    ignore: Vec<String>,
    /// Quantization scheme (only NVFP4 weight-only is supported).
    #[arg(long, default_value = "nvfp4a16", value_parser = ["nvfp4a16"])]
    scheme: String,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Accept targets that select nothing to quantize (DST is then a copy of SRC); without it,
    /// a pattern that matches no linear module, or an empty selection, is an error.
    #[arg(long)]
    allow_empty: bool,
    /// Tied models only: write the embedding's values as a new NVFP4 `lm_head` (its own global
    /// scale; the embedding stays as it is) and set `tie_word_embeddings: false`.
    #[arg(long)]
    untie_lm_head: bool,
    /// Replace an existing DST.
    #[arg(long)]
    force: bool,
    /// Print the plan (modules, groups, bytes before/after) and write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Largest output shard in bytes (default 5 GB).
    #[arg(long, value_name = "BYTES")]
    max_shard_size: Option<u64>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

fn print_summary(s: &PlanSummary) -> std::io::Result<()> {
    let gb = |b: u64| b as f64 / 1e9;
    outln!(
        "new group         {} targets {:?}",
        s.new_group,
        s.new_group_targets
    )?;
    outln!(
        "modules quantized {} in {} global-scale groups ({} fused)",
        s.modules_quantized,
        s.scale_groups,
        s.fused_groups
    )?;
    for (leaf, n) in &s.by_leaf {
        outln!("  {leaf:<24} {n}")?;
    }
    outln!(
        "already NVFP4     {} modules (kept byte for byte)",
        s.modules_already_quantized
    )?;
    outln!(
        "left unquantized  {} linear modules (listed in ignore)",
        s.modules_unquantized
    )?;
    if let Some(u) = &s.untied_lm_head {
        outln!(
            "untied lm_head    {} [{}, {}] {} from {}: {:.3} GB -> {:.3} GB NVFP4 per token (+{:.3} GB on disk)",
            u.module,
            u.shape[0],
            u.shape[1],
            u.source_dtype,
            u.source,
            gb(u.bytes_before),
            gb(u.bytes_after),
            gb(u.bytes_after)
        )?;
    }
    outln!("tensors copied    {}", s.tensors_copied)?;
    outln!(
        "bytes             {:.3} GB -> {:.3} GB (x{:.3}, -{:.3} GB)",
        gb(s.bytes_before),
        gb(s.bytes_after),
        s.bytes_after as f64 / s.bytes_before.max(1) as f64,
        gb(s.bytes_before.saturating_sub(s.bytes_after))
    )
}

/// Runs the subcommand.
pub fn run(args: QuantizeArgs) -> anyhow::Result<()> {
    crate::progress::set_threads(args.threads)?;
    let builder = QuantizeBuilder::new(&args.src, &args.dst)
        .targets(args.targets)
        .ignore(args.ignore)
        .allow_empty(args.allow_empty)
        .untie_lm_head(args.untie_lm_head)
        .force(args.force)
        .max_shard_bytes(args.max_shard_size);
    if args.dry_run {
        let (_, plan) = builder.plan()?;
        if args.json {
            outln!("{}", serde_json::to_string_pretty(&plan.summary)?)?;
        } else {
            outln!(
                "dry run: {} -> {} (nothing written)",
                args.src.display(),
                args.dst.display()
            )?;
            print_summary(&plan.summary)?;
        }
        return Ok(());
    }
    crate::progress::install_interrupt_handler();
    let bar = Bar::new("quantize");
    let report = builder.run(&bar);
    bar.finish();
    let report = report?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        outln!(
            "wrote {} in {:.2} s",
            report.output.display(),
            report.seconds
        )?;
        print_summary(&report.summary)?;
        outln!("shards            {}", report.shards.join(", "))?;
        if !report.copied_files.is_empty() {
            outln!("copied            {}", report.copied_files.join(", "))?;
        }
    }
    Ok(())
}
