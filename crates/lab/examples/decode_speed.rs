//! Prefill and decode speed of a checkpoint on the CPU backend, and peak resident memory.
//!
//! `cargo run --release -p fp4forge-lab --example decode_speed -- DIR [PROMPT_TOKENS]
//! [DECODE_TOKENS] [THREADS]` (defaults 128, 128, all cores). Token ids are synthetic (a fixed
//! pseudo-random sequence), decoding is greedy; the numbers are wall time of the engine only.

use std::time::Instant;

use fp4forge_engine::{GenerateOptions, Model, ModelOptions};

fn rss_kib(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = args
        .first()
        .ok_or("usage: decode_speed DIR [PROMPT] [DECODE] [THREADS]")?;
    let prompt_len: usize = args.get(1).map_or(Ok(128), |s| s.parse())?;
    let decode: usize = args.get(2).map_or(Ok(128), |s| s.parse())?;
    let threads: usize = args.get(3).map_or(Ok(0), |s| s.parse())?;

    let t = Instant::now();
    let model = Model::load(dir, ModelOptions::new().threads(threads))?;
    let info = model.info().clone();
    println!(
        "{}: {} ({} layers, vocab {}), weights {:.1} MB, backend {}, loaded in {:.2} s",
        dir,
        info.architecture,
        info.num_layers,
        info.vocab_size,
        info.weight_bytes as f64 / 1e6,
        info.backend,
        t.elapsed().as_secs_f64()
    );
    let prompt = fp4forge_lab::synthetic_prompt(prompt_len, info.vocab_size);
    let opts = GenerateOptions {
        max_tokens: decode + 1,
        ..Default::default()
    };
    // Warm-up (pages the weights in).
    model.new_session()?.generate(
        &prompt[..prompt_len.min(8)],
        &GenerateOptions {
            max_tokens: 2,
            ..Default::default()
        },
        |_| true,
    )?;
    let mut session = model.new_session()?;
    let g = session.generate(&prompt, &opts, |_| true)?;
    println!(
        "prefill {} tokens: {:.1} tok/s; decode {} tokens: {:.1} tok/s; KV {:.2} MB; peak RSS {:.1} MB (now {:.1} MB)",
        g.stats.prompt_tokens,
        g.stats.prefill_tokens_per_second(),
        g.stats.decode_steps,
        g.stats.decode_tokens_per_second(),
        session.kv_bytes() as f64 / 1e6,
        rss_kib("VmHWM:").unwrap_or(0) as f64 / 1024.0,
        rss_kib("VmRSS:").unwrap_or(0) as f64 / 1024.0,
    );
    Ok(())
}
