//! Where a CPU decode step's time goes, op by op, through the production forward pass.
//!
//! `cargo run --release -p fp4forge-lab --example cpu_op_profile -- DIR [--threads N]
//! [--isa auto|avx512|avx2|portable] [--activations f32|int8] [--context N] [--steps N] [--copy] [--prefill]`
//!
//! Loads `DIR` on the CPU backend wrapped in [`fp4forge_lab::op_profile::Profiled`], prefills a
//! `--context`-token pseudo-random prompt (default 1), then times `--steps` greedy decode steps
//! (default 128) op by op. Prints per op: calls per step, µs per step, share of the step, and for
//! weight-reading ops the bandwidth they reach; the last line compares the step with the time
//! the weights' bytes take at the machine's memory bandwidth (measured here with a 256 MiB read).
//! `--copy` reads the weights into memory instead of mapping the files; `--prefill` profiles the
//! prefill of the `--context` tokens instead of the decode steps.

use std::time::Instant;

use fp4forge_engine::{
    CpuActivations, CpuBackend, CpuIsa, GenerateOptions, LoadFormat, Model, ModelOptions,
};
use fp4forge_lab::op_profile::Profiled;
use fp4forge_lab::take_arg;

/// Read bandwidth of `threads` threads over a 256 MiB buffer (best of 3), bytes per second.
fn read_bandwidth(pool: &rayon::ThreadPool) -> f64 {
    let n = 256usize << 20;
    let buf: Vec<u64> = (0..n / 8).map(|i| i as u64).collect();
    let threads = pool.current_num_threads();
    let mut best = 0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let sum: u64 = pool.install(|| {
            use rayon::prelude::*;
            buf.par_chunks(buf.len().div_ceil(threads))
                .map(|c| {
                    // Eight independent lanes: vectorised, so memory and not the adds bound it.
                    let mut lanes = [0u64; 8];
                    for block in c.chunks_exact(8) {
                        for (l, &v) in lanes.iter_mut().zip(block) {
                            *l ^= v;
                        }
                    }
                    lanes.iter().fold(0, |a, &b| a ^ b)
                })
                .reduce(|| 0, |a, b| a ^ b)
        });
        std::hint::black_box(sum);
        best = best.max(n as f64 / t.elapsed().as_secs_f64());
    }
    best
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let dir = args
        .first()
        .filter(|a| !a.starts_with("--"))
        .ok_or("usage: cpu_op_profile DIR [--threads N] [--isa I] [--context N] [--steps N]")?
        .clone();
    let threads: usize = take_arg(&mut args, "--threads", 0)?;
    let isa: CpuIsa = take_arg(&mut args, "--isa", CpuIsa::Auto)?;
    let act: CpuActivations = take_arg(&mut args, "--activations", CpuActivations::F32)?;
    let context: usize = take_arg(&mut args, "--context", 1)?;
    let steps: usize = take_arg(&mut args, "--steps", 128)?;
    let load_format = if args.iter().any(|a| a == "--copy") {
        LoadFormat::Copy
    } else {
        LoadFormat::Mmap
    };

    let backend = Profiled::new(
        CpuBackend::new()
            .with_isa(isa)?
            .with_activations(act)
            .with_threads(threads)?,
    );
    let model = Model::load_with_backend(
        &dir,
        ModelOptions::new()
            .threads(threads)
            .load_format(load_format),
        backend,
    )?;
    let info = model.info().clone();
    let prompt = fp4forge_lab::synthetic_prompt(context.max(1), info.vocab_size);
    // Warm-up: pages the weights in.
    let warm = GenerateOptions {
        max_tokens: 4,
        ..Default::default()
    };
    model
        .new_session()?
        .generate(&prompt[..1], &warm, |_| true)?;
    let prefill_only = args.iter().any(|a| a == "--prefill");
    let mut session = model.new_session()?;
    // (what was timed, passes, µs per pass, tok/s)
    let (label, passes, step_us, rate);
    let table;
    if prefill_only {
        model.backend().take();
        let t = Instant::now();
        session.prefill(&prompt)?;
        let us = t.elapsed().as_secs_f64() * 1e6;
        table = model.backend().take();
        label = format!("prefill of {} tokens", prompt.len());
        (passes, step_us, rate) = (1.0, us, prompt.len() as f64 / us * 1e6);
    } else {
        session.prefill(&prompt)?;
        model.backend().take();
        let opts = GenerateOptions {
            max_tokens: steps + 1,
            ..Default::default()
        };
        let g = session.generate(&[prompt[0]], &opts, |_| true)?;
        table = model.backend().take();
        // `generate` runs one 1-token prefill pass before its decode steps: the ops ran in
        // `decode_steps + 1` passes of one token each.
        let steps_run = g.stats.decode_steps.max(1) as f64;
        label = format!("context {context}, {} decode steps", g.stats.decode_steps);
        passes = steps_run + 1.0;
        step_us = g.stats.decode_time.as_secs_f64() / steps_run * 1e6;
        rate = g.stats.decode_tokens_per_second();
    }
    let per_step = |d: std::time::Duration| d.as_secs_f64() / passes * 1e6;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(if threads == 0 {
            rayon::current_num_threads()
        } else {
            threads
        })
        .build()?;
    let bw = read_bandwidth(&pool);

    println!(
        "{dir}: {} ({} layers), backend {}, {} threads, {label}: {rate:.1} tok/s ({step_us:.0} µs per pass)",
        info.architecture,
        info.num_layers,
        info.backend,
        pool.current_num_threads(),
    );
    println!(
        "{:<34} {:>8} {:>10} {:>7} {:>10} {:>8}",
        "op", "calls", "µs/pass", "share", "MB/pass", "GB/s"
    );
    let mut rows: Vec<_> = table.iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1.time));
    let mut total_us = 0.0;
    let mut total_bytes = 0.0;
    for (op, t) in rows {
        let us = per_step(t.time);
        let mb = t.weight_bytes as f64 / passes / 1e6;
        total_us += us;
        total_bytes += mb;
        let gbs = if t.weight_bytes > 0 {
            format!("{:.1}", mb * 1e6 / (us * 1e-6) / 1e9)
        } else {
            "-".into()
        };
        println!(
            "{:<34} {:>8.1} {:>10.1} {:>6.1}% {:>10.2} {:>8}",
            op,
            t.calls as f64 / passes,
            us,
            100.0 * us / step_us,
            mb,
            gbs
        );
    }
    println!(
        "{:<34} {:>8} {:>10.1} {:>6.1}% {:>10.2}",
        "sum of ops (rest: outside ops)",
        "",
        total_us,
        100.0 * total_us / step_us,
        total_bytes
    );
    println!(
        "memory read bandwidth ({} threads): {:.1} GB/s; the step's {:.1} MB of weights take {:.0} µs at it ({:.0}% of the step)",
        pool.current_num_threads(),
        bw / 1e9,
        total_bytes,
        total_bytes * 1e6 / bw * 1e6,
        100.0 * total_bytes * 1e6 / bw * 1e6 / step_us
    );
    Ok(())
}
