//! `fp4forge import-gguf FILE.gguf DST`: convert a llama.cpp GGUF to an HF checkpoint
//! (safetensors, config.json, tokenizer.json, chat template).

use std::path::PathBuf;

use fp4forge_builder::import_gguf::{ImportGgufBuilder, OutputDtype};

use crate::progress::Bar;

/// Arguments of `fp4forge import-gguf`.
#[derive(clap::Args)]
pub struct ImportGgufArgs {
    /// The GGUF file (llama or qwen2 architecture; F32/F16/BF16, Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 and
    /// K-quant tensors).
    file: PathBuf,
    /// Output directory (created atomically).
    dst: PathBuf,
    /// Replace an existing DST.
    #[arg(long)]
    force: bool,
    /// dtype of every output tensor: bf16 (rounded to nearest even) or f32 (the dequantized
    /// values exactly).
    #[arg(long, default_value = "bf16", value_parser = ["bf16", "f32"])]
    dtype: String,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs the subcommand.
pub fn run(args: ImportGgufArgs) -> anyhow::Result<()> {
    let dtype = match args.dtype.as_str() {
        "f32" => OutputDtype::F32,
        _ => OutputDtype::Bf16,
    };
    crate::progress::install_interrupt_handler();
    let bar = Bar::new("import");
    let result = ImportGgufBuilder::new(&args.file, &args.dst)
        .force(args.force)
        .dtype(dtype)
        .run(&bar);
    bar.finish();
    let report = result?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
        return Ok(());
    }
    let types: Vec<String> = report
        .source_types
        .iter()
        .map(|(t, n)| format!("{n}×{t}"))
        .collect();
    outln!(
        "{} -> {} ({}, {})",
        report.source.display(),
        report.output.display(),
        report.architecture,
        dtype.torch_name()
    )?;
    outln!(
        "tensors      {} ({}), {} parameters, {} Q/K un-permuted{}",
        report.tensors,
        types.join(", "),
        report.parameters,
        report.unpermuted,
        if report.tied_embeddings {
            ", tied embeddings"
        } else {
            ""
        }
    )?;
    outln!(
        "bytes        {:.1} MB -> {:.1} MB",
        report.source_bytes as f64 / 1e6,
        report.output_bytes as f64 / 1e6
    )?;
    match &report.tokenizer {
        Some(t) => outln!(
            "tokenizer    {} tokens, {} merges, {} added, pre-tokenizer {}{}",
            t.vocab_size,
            t.merges,
            t.added_tokens,
            t.pre_tokenizer,
            if t.chat_template {
                ", chat template"
            } else {
                ""
            }
        )?,
        None => outln!("tokenizer    none in the GGUF")?,
    }
    outln!("files        {}", report.files.join(", "))?;
    outln!("time         {:.2} s", report.seconds)?;
    Ok(())
}
