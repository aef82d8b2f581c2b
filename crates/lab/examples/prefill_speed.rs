//! Prefill throughput of one session on any device: a prompt of N synthetic token ids appended
//! through `Session::prefill` (the model's prefill chunk: 2,048 tokens on a GPU), timed per
//! repetition on a fresh session after one warm-up; prints each repetition and the median. Several
//! prompt lengths (`2048,16384`) are measured one after the other on the same loaded model.
//!
//! `cargo run --release -p fp4forge-lab [--features cuda] --example prefill_speed -- DIR
//! [--device cuda] [TOKENS[,TOKENS...]] [REPS]` (defaults: cpu, 2048 tokens, 5 repetitions).

use std::path::Path;
use std::time::Instant;

use fp4forge_engine::{Backend, Model, ModelOptions, WithModel};

/// The measurement, for whatever backend the device loads.
struct Measure {
    /// Prompt lengths, measured in this order.
    tokens: Vec<usize>,
    reps: usize,
}

impl WithModel for Measure {
    type Output = Result<(), Box<dyn std::error::Error>>;

    fn with<B: Backend>(self, model: Model<B>) -> Self::Output {
        println!("backend {}", model.info().backend);
        for &tokens in &self.tokens {
            // a fixed pseudo-random prompt, so MoE routing spreads as on real text
            let ids = fp4forge_lab::synthetic_prompt(tokens, model.info().vocab_size);
            let mut times = Vec::with_capacity(self.reps);
            for rep in 0..=self.reps {
                let mut session = model.new_session()?;
                let start = Instant::now();
                session.prefill(&ids)?;
                let s = start.elapsed().as_secs_f64();
                if rep == 0 {
                    println!("warm-up {:>10.1} ms", 1e3 * s);
                    continue;
                }
                println!(
                    "rep {rep:>3} {:>10.1} ms {:>10.0} tok/s",
                    1e3 * s,
                    tokens as f64 / s
                );
                times.push(s);
            }
            times.sort_by(f64::total_cmp);
            if let Some(&median) = times.get(times.len() / 2) {
                println!(
                    "prefill {tokens} tokens: median {:.1} ms, {:.0} tok/s",
                    1e3 * median,
                    tokens as f64 / median
                );
            }
        }
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let device = fp4forge_lab::take_device(&mut args)?;
    let dir = args
        .first()
        .ok_or("usage: prefill_speed DIR [--device D] [TOKENS[,TOKENS...]] [REPS]")?;
    let tokens: Vec<usize> = match args.get(1) {
        None => vec![2048],
        Some(list) => list
            .split(',')
            .map(|t| {
                t.parse()
                    .map_err(|e| format!("prompt length {t:?} in {list:?}: {e}"))
            })
            .collect::<Result<_, _>>()?,
    };
    let reps: usize = args.get(2).map_or(Ok(5), |s| s.parse())?;
    println!("{dir} on {device}");
    let options = ModelOptions::new().prefill_chunk(device.default_prefill_chunk());
    fp4forge_engine::open(device, Path::new(dir), options, Measure { tokens, reps })?
}
