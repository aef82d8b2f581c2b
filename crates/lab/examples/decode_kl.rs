//! How far a candidate's decode steps move the next-token distribution from a base's: both
//! checkpoints (or one checkpoint with two CPU settings) read the same text one token at a time
//! through `Session::step` (the production decode path: one token per matmul), and every
//! position's full distributions are compared.
//!
//! `cargo run --release -p fp4forge-lab --example decode_kl -- BASE_DIR CANDIDATE_DIR
//! [--base-activations f32|int8] [--activations f32|int8] [--tokens N] [--window N]
//! [--threads N] [--text FILE]`
//!
//! Prints the mean KL(base ‖ candidate) in nats per token (with its standard error), its 99th
//! percentile, how often the two agree on the most likely token, and both perplexities of the
//! text. The text (default `../shared/data/wikitext-2-raw-test.txt`) is tokenized with the base's
//! tokenizer and read in windows of `--window` tokens (default 256), each from an empty cache.

use std::path::Path;

use fp4forge_engine::{CpuActivations, Model, ModelOptions, TextCodec};
use fp4forge_lab::take_arg;

/// `log softmax(logits)`, in f64.
fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let sum: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    logits.iter().map(|&v| v as f64 - lse).collect()
}

fn argmax(v: &[f64]) -> usize {
    v.iter()
        .enumerate()
        .fold((0, f64::NEG_INFINITY), |(bi, bv), (i, &x)| {
            if x > bv {
                (i, x)
            } else {
                (bi, bv)
            }
        })
        .0
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: decode_kl BASE_DIR CANDIDATE_DIR [--base-activations A] [--activations A] \
                 [--tokens N] [--window N] [--threads N] [--text FILE]";
    let (base_dir, cand_dir) = match (args.first(), args.get(1)) {
        (Some(a), Some(b)) if !a.starts_with("--") && !b.starts_with("--") => {
            (a.clone(), b.clone())
        }
        _ => return Err(usage.into()),
    };
    let base_act: CpuActivations = take_arg(&mut args, "--base-activations", CpuActivations::F32)?;
    let cand_act: CpuActivations = take_arg(&mut args, "--activations", CpuActivations::F32)?;
    let total: usize = take_arg(&mut args, "--tokens", 1024)?;
    let window: usize = take_arg(&mut args, "--window", 256)?.max(2);
    let threads: usize = take_arg(&mut args, "--threads", 0)?;
    let text_path: String = take_arg(
        &mut args,
        "--text",
        "../shared/data/wikitext-2-raw-test.txt".to_string(),
    )?;

    let text = std::fs::read_to_string(&text_path).map_err(|e| format!("{text_path}: {e}"))?;
    let codec = TextCodec::load(Path::new(&base_dir))?;
    let tokens = codec.encode(&text, false)?;
    let tokens = &tokens[..total.min(tokens.len())];
    let load = |dir: &str, act| {
        Model::load(
            dir,
            ModelOptions::new().threads(threads).cpu_activations(act),
        )
    };
    let base = load(&base_dir, base_act)?;
    let cand = load(&cand_dir, cand_act)?;

    let mut kls = Vec::new();
    let (mut agree, mut nll_base, mut nll_cand) = (0usize, 0f64, 0f64);
    for chunk in tokens.chunks(window).filter(|c| c.len() >= 2) {
        let mut sb = base.new_session()?;
        let mut sc = cand.new_session()?;
        for (i, &tok) in chunk[..chunk.len() - 1].iter().enumerate() {
            let lb = log_softmax(&sb.step(tok)?);
            let lc = log_softmax(&sc.step(tok)?);
            let kl: f64 = lb.iter().zip(&lc).map(|(a, b)| a.exp() * (a - b)).sum();
            kls.push(kl.max(0.0));
            agree += usize::from(argmax(&lb) == argmax(&lc));
            let next = chunk[i + 1] as usize;
            nll_base -= lb.get(next).copied().unwrap_or(f64::NAN);
            nll_cand -= lc.get(next).copied().unwrap_or(f64::NAN);
        }
    }
    let n = kls.len().max(1) as f64;
    let mean = kls.iter().sum::<f64>() / n;
    let var = kls.iter().map(|k| (k - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    let mut sorted = kls.clone();
    sorted.sort_by(f64::total_cmp);
    let p99 = sorted
        .get(((sorted.len() as f64) * 0.99) as usize)
        .copied()
        .unwrap_or(0.0);
    println!(
        "base {base_dir} ({base_act} activations, backend {}), candidate {cand_dir} ({cand_act}, {})",
        base.info().backend,
        cand.info().backend
    );
    println!(
        "{} positions in windows of {window}: KL(base‖candidate) {mean:.5} ± {:.5} nats/token \
         (p99 {p99:.4}), top-1 agreement {:.2}%, perplexity {:.3} (base) / {:.3} (candidate)",
        kls.len(),
        (var / n).sqrt(),
        100.0 * agree as f64 / n,
        (nll_base / n).exp(),
        (nll_cand / n).exp()
    );
    Ok(())
}
