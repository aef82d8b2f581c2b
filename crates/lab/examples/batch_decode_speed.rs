//! Decode throughput of batched steps against one session stepping alone, on any device: for
//! each batch size B, B sessions with a prompt each (4 tokens; `--prompt`) advance together through
//! `Model::forward_batch_sampled` with greedy samplers (the server's call: the backend picks each
//! token where it can, only ids come back); tokens/s of the whole batch and time per step.
//!
//! `cargo run --release -p fp4forge-lab [--features cuda] --example batch_decode_speed -- DIR
//! [--device cuda] [--kv-dtype fp8] [--top-k K] [--top-p P] [--prompt P] [--profile N]
//! [--timeline N] [STEPS]
//! [BATCHES...]`
//! (defaults: cpu, bf16 caches, greedy, 4-token prompts, 32 steps, batches 1 2 4 8 16).
//! `--prompt P`: each session prefills P tokens before the steps (e.g. 128, the serve
//! benchmark's concurrency sweep, whose steps then attend over 128 to 256 positions).
//! `--top-k K`: samplers at temperature 1 over the K most likely tokens (seeded), as the server
//! samples for a checkpoint whose generation config asks for that (the synthetic ones: top-k 20)
//! and a request that sets no sampling field; `--top-k all`: over the whole vocabulary (top-k 0,
//! the default of a checkpoint whose generation config sets no top-k). `--top-p P` (default 1):
//! the samplers' nucleus (below 1, a whole-vocabulary row is sorted; at 1 it is walked in index
//! order). `--profile N` (CUDA):
//! the first N timed steps of each batch run inside Nsight's capture range
//! (`fp4forge_lab::profiler_capture`), so that `ncu --profile-from-start off` profiles exactly
//! those steps' kernels (not the prompts' prefills or the warm-up step). `--timeline N` (CUDA, CUPTI's library on the loader's path):
//! N more steps of each batch (after one more untimed), after the warm-up and before the timed
//! ones, traced with CUPTI (`fp4forge_lab::timeline`): per step the GPU's busy and idle time,
//! the gaps between kernels, each kernel's share of the busy time; the timed steps that follow
//! run untraced.

use std::path::Path;
use std::time::Instant;

use fp4forge_engine::ir::Want;
use fp4forge_engine::{
    Backend, KvDtype, Model, ModelOptions, Output, Sampler, SamplingParams, WithModel,
};

/// The measurement, for whatever backend the device loads.
struct Measure {
    steps: usize,
    batches: Vec<usize>,
    /// Timed steps of each batch inside the profiler's capture range (0: none).
    profile: usize,
    /// Steps of each batch traced with CUPTI before the timed ones (0: none).
    timeline: usize,
    /// Tokens each session prefills before its steps.
    prompt: usize,
    /// The samplers' top-k at temperature 1 (`Some(0)`: the whole vocabulary; `None`: greedy).
    top_k: Option<usize>,
    /// The samplers' top-p.
    top_p: f32,
}

impl WithModel for Measure {
    type Output = Result<(), Box<dyn std::error::Error>>;

    fn with<B: Backend>(self, model: Model<B>) -> Self::Output {
        let vocab = model.info().vocab_size as u32;
        println!("backend {}", model.info().backend);
        println!("{:>5} {:>12} {:>12}", "batch", "ms/step", "tok/s");
        for &b in &self.batches {
            let mut sessions = (0..b)
                .map(|i| {
                    let mut s = model.new_session()?;
                    let prompt: Vec<u32> = (0..self.prompt as u32)
                        .map(|j| (7 * i as u32 + 3 + 11 * j) % vocab)
                        .collect();
                    s.prefill(&prompt)?;
                    Ok(s)
                })
                .collect::<fp4forge_engine::Result<Vec<_>>>()?;
            let mut tokens: Vec<u32> = (0..b as u32).map(|i| (i * 31 + 5) % vocab).collect();
            let mut samplers: Vec<Sampler> = (0..b)
                .map(|i| {
                    Sampler::new(match self.top_k {
                        None => SamplingParams::greedy(),
                        Some(k) => SamplingParams {
                            temperature: 1.0,
                            top_k: k,
                            top_p: self.top_p,
                            seed: i as u64 + 1,
                        },
                    })
                })
                .collect();
            let wants = vec![Want::Last; b];
            let mut run = |tokens: &mut Vec<u32>| -> Result<(), Box<dyn std::error::Error>> {
                let mut refs: Vec<_> = sessions.iter_mut().collect();
                let lists: Vec<&[u32]> = tokens.iter().map(std::slice::from_ref).collect();
                let mut picks: Vec<Option<&mut Sampler>> = samplers.iter_mut().map(Some).collect();
                let outs = model.forward_batch_sampled(&mut refs, &lists, &wants, &mut picks)?;
                for (t, o) in tokens.iter_mut().zip(outs) {
                    match o {
                        Output::Token(id) => *t = id,
                        _ => return Err("a sampler gave no token".into()),
                    }
                }
                Ok(())
            };
            // one warm-up step (kernel compilation, buffers)
            run(&mut tokens)?;
            let timeline = if self.timeline > 0 {
                Some(trace_steps(self.timeline, || run(&mut tokens))?)
            } else {
                None
            };
            let start = Instant::now();
            for step in 0..self.steps {
                if step == 0 && self.profile > 0 {
                    fp4forge_lab::profiler_capture(true)?;
                }
                run(&mut tokens)?;
                if step + 1 == self.profile.min(self.steps) {
                    fp4forge_lab::profiler_capture(false)?;
                }
            }
            let s = start.elapsed().as_secs_f64();
            println!(
                "{b:>5} {:>12.2} {:>12.1}",
                1e3 * s / self.steps as f64,
                (b * self.steps) as f64 / s
            );
            if let Some(t) = timeline {
                print!("{}", t.render(&format!("{b} rows")));
            }
        }
        Ok(())
    }
}

/// Runs `steps` steps under a CUPTI trace, a mark before each and after the last. One step
/// runs before the first mark: the first traced step carried a ~0.8 ms gap (CUPTI's own start,
/// H100, 2026-12-07), which the summary leaves out this way.
#[cfg(feature = "cuda")]
fn trace_steps(
    steps: usize,
    mut step: impl FnMut() -> Result<(), Box<dyn std::error::Error>>,
) -> Result<fp4forge_lab::timeline::Timeline, Box<dyn std::error::Error>> {
    let mut trace = fp4forge_lab::timeline::KernelTrace::start()?;
    step()?;
    for _ in 0..steps {
        trace.mark()?;
        step()?;
    }
    trace.mark()?;
    let (spans, marks) = trace.finish()?;
    Ok(fp4forge_lab::timeline::summarize(&spans, &marks))
}

/// Without the `cuda` feature there is no GPU work to trace: refused.
#[cfg(not(feature = "cuda"))]
fn trace_steps(
    _steps: usize,
    _step: impl FnMut() -> Result<(), Box<dyn std::error::Error>>,
) -> Result<fp4forge_lab::timeline::Timeline, Box<dyn std::error::Error>> {
    Err("--timeline traces CUDA work: it needs the lab's `cuda` feature".into())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let device = fp4forge_lab::take_device(&mut args)?;
    let kv = fp4forge_lab::take_arg(&mut args, "--kv-dtype", KvDtype::Bf16)?;
    let profile = fp4forge_lab::take_arg(&mut args, "--profile", 0usize)?;
    let timeline = fp4forge_lab::take_arg(&mut args, "--timeline", 0usize)?;
    // (0: greedy; `all`: top-k 0, every token a candidate)
    let top_k = match fp4forge_lab::take_arg(&mut args, "--top-k", String::from("0"))?.as_str() {
        "all" => Some(0),
        k => match k.parse::<usize>() {
            Ok(0) => None,
            Ok(k) => Some(k),
            Err(e) => return Err(format!("--top-k {k}: {e} (a count, or `all`)").into()),
        },
    };
    let top_p = fp4forge_lab::take_arg(&mut args, "--top-p", 1.0f32)?;
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(format!("--top-p {top_p}: in (0, 1]").into());
    }
    let prompt = fp4forge_lab::take_arg(&mut args, "--prompt", 4usize)?;
    if prompt == 0 {
        return Err("--prompt: at least one token".into());
    }
    if profile > 0 && device == fp4forge_engine::Device::Cpu {
        return Err("--profile captures CUDA work: it needs --device cuda".into());
    }
    if timeline > 0 && device == fp4forge_engine::Device::Cpu {
        return Err("--timeline traces CUDA work: it needs --device cuda".into());
    }
    let dir = args.first().ok_or(
        "usage: batch_decode_speed DIR [--device D] [--kv-dtype T] [--top-k K] [--prompt P] \
         [--profile N] [--timeline N] [STEPS] [BATCHES...]",
    )?;
    let steps: usize = args.get(1).map_or(Ok(32), |s| s.parse())?;
    let batches: Vec<usize> = if args.len() > 2 {
        args[2..]
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?
    } else {
        vec![1, 2, 4, 8, 16]
    };
    let sampling = match top_k {
        None => "greedy".to_string(),
        Some(0) => "whole-vocabulary sampling at temperature 1".to_string(),
        Some(k) => format!("top-{k} sampling at temperature 1"),
    };
    println!("{dir} on {device}, {kv:?} KV caches, {sampling}, {prompt}-token prompts");
    fp4forge_engine::open(
        device,
        Path::new(dir),
        ModelOptions::new().kv_dtype(kv),
        Measure {
            steps,
            batches,
            profile,
            timeline,
            prompt,
            top_k,
            top_p,
        },
    )?
}
