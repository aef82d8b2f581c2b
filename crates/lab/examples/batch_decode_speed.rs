//! Decode throughput of batched steps (`Model::step_batch`) against one session stepping alone,
//! on the CPU backend: for each batch size B, B sessions with a short prompt each advance
//! together; tokens/s of the whole batch and time per step.
//!
//! `cargo run --release -p fp4forge-lab --example batch_decode_speed -- DIR [STEPS]
//! [BATCHES...]` (defaults 32 steps, batches 1 2 4 8 16).

use std::time::Instant;

use fp4forge_engine::{Model, ModelOptions, Session};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = args
        .first()
        .ok_or("usage: batch_decode_speed DIR [STEPS] [BATCHES...]")?;
    let steps: usize = args.get(1).map_or(Ok(32), |s| s.parse())?;
    let batches: Vec<usize> = if args.len() > 2 {
        args[2..]
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?
    } else {
        vec![1, 2, 4, 8, 16]
    };
    let model = Model::load(dir, ModelOptions::new())?;
    let vocab = model.info().vocab_size as u32;
    println!("{dir}: backend {}", model.info().backend);
    println!("{:>5} {:>12} {:>12}", "batch", "ms/step", "tok/s");
    for &b in &batches {
        let mut sessions: Vec<Session> = (0..b)
            .map(|i| {
                let mut s = model.new_session().unwrap();
                s.prefill(&[(7 * i as u32 + 3) % vocab, 11, 13, 17])
                    .unwrap();
                s
            })
            .collect();
        let mut tokens: Vec<u32> = (0..b as u32).map(|i| (i * 31 + 5) % vocab).collect();
        let start = Instant::now();
        for _ in 0..steps {
            let logits = if b == 1 {
                vec![sessions[0].step(tokens[0])?]
            } else {
                let mut refs: Vec<&mut Session> = sessions.iter_mut().collect();
                model.step_batch(&mut refs, &tokens)?
            };
            for (t, l) in tokens.iter_mut().zip(&logits) {
                *t = fp4forge_engine::sampling::argmax(l);
            }
        }
        let s = start.elapsed().as_secs_f64();
        println!(
            "{b:>5} {:>12.2} {:>12.1}",
            1e3 * s / steps as f64,
            (b * steps) as f64 / s
        );
    }
    Ok(())
}
