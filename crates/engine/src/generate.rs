//! The generation loop: prefill the prompt, then sample and step until a stop token, the token
//! budget, the context limit, or the caller says stop; timed separately for prefill and decode.

use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::error::Result;
use crate::sampling::{Sampler, SamplingParams};
use crate::session::Session;

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOptions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// How to pick them.
    pub sampling: SamplingParams,
    /// Tokens that end the generation (not emitted), e.g. the model's EOS ids.
    pub stop_tokens: Vec<u32>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            max_tokens: 128,
            sampling: SamplingParams::greedy(),
            stop_tokens: Vec::new(),
        }
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// `max_tokens` were generated.
    MaxTokens,
    /// A stop token was sampled (it is not part of the output).
    StopToken(u32),
    /// The callback asked to stop.
    Callback,
    /// The sequence reached the model's context.
    ContextFull,
}

/// Timing of a generation.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GenerationStats {
    /// Prompt tokens prefilled.
    pub prompt_tokens: usize,
    /// Wall time of the prefill.
    pub prefill_time: Duration,
    /// Decode steps run (each one forward pass of one token).
    pub decode_steps: usize,
    /// Wall time of the decode steps.
    pub decode_time: Duration,
}

impl GenerationStats {
    /// Prompt tokens per second.
    pub fn prefill_tokens_per_second(&self) -> f64 {
        rate(self.prompt_tokens, self.prefill_time)
    }

    /// Decode steps per second.
    pub fn decode_tokens_per_second(&self) -> f64 {
        rate(self.decode_steps, self.decode_time)
    }
}

fn rate(n: usize, t: Duration) -> f64 {
    let s = t.as_secs_f64();
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

/// A finished generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Generated tokens (stop token excluded).
    pub tokens: Vec<u32>,
    /// Why it ended.
    pub stop: StopReason,
    /// Timing.
    pub stats: GenerationStats,
}

impl<B: Backend> Session<'_, B> {
    /// Prefills `prompt` and generates after it, calling `on_token` with each new token as soon
    /// as it is chosen (return `false` to stop). Errors: an empty prompt, a token outside the
    /// vocabulary, a prompt that does not fit the context.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<Generation> {
        let mut sampler = Sampler::new(options.sampling);
        let mut stats = GenerationStats {
            prompt_tokens: prompt.len(),
            ..Default::default()
        };
        let start = Instant::now();
        let logits = self.prefill(prompt)?;
        stats.prefill_time = start.elapsed();
        let mut tokens = Vec::new();
        let max_context = self.model().info().max_context;
        // each decode step picks its successor where the logits are (`step_sampled`)
        let mut pending = (options.max_tokens > 0).then(|| sampler.sample(&logits));
        let stop = loop {
            let Some(next) = pending.take() else {
                break StopReason::MaxTokens;
            };
            if options.stop_tokens.contains(&next) {
                break StopReason::StopToken(next);
            }
            tokens.push(next);
            if !on_token(next) {
                break StopReason::Callback;
            }
            if tokens.len() >= options.max_tokens {
                break StopReason::MaxTokens;
            }
            if self.position() >= max_context {
                break StopReason::ContextFull;
            }
            let t = Instant::now();
            pending = Some(self.step_sampled(next, &mut sampler)?);
            stats.decode_time += t.elapsed();
            stats.decode_steps += 1;
        };
        Ok(Generation {
            tokens,
            stop,
            stats,
        })
    }
}
