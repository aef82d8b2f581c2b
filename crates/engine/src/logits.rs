//! What vLLM's `SamplingParams` does to a sequence's logits before a token is picked:
//! `allowed_token_ids`, `bad_words`, `logit_bias`, the repetition, frequency and presence
//! penalties, and `min_p`. [`LogitsAdjust::apply`] runs them on the host, in vLLM's order
//! (vLLM 0.10 `v1/sample/sampler.py`): the allowed-token mask, bad words and logit bias on the
//! raw logits, then the penalties, then (after temperature, for random sampling only) `min_p`.
//! The [`Sampler`](crate::Sampler) then applies temperature, top-k and top-p as before.

use std::collections::HashMap;

/// Logit adjustments of one sequence; the default changes nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogitsAdjust {
    /// Subtracted once from every token already generated (OpenAI's `presence_penalty`).
    pub presence_penalty: f32,
    /// Subtracted per occurrence of a token in the generated tokens (`frequency_penalty`).
    pub frequency_penalty: f32,
    /// vLLM's `repetition_penalty` (1: off) on every token of the prompt or the generated
    /// tokens: a positive logit is divided by it, a negative one multiplied.
    pub repetition_penalty: f32,
    /// Added to a token's logit (`logit_bias`, already clamped to `[-100, 100]`).
    pub logit_bias: HashMap<u32, f32>,
    /// Tokens below `min_p` times the most likely token's probability (after temperature) are
    /// dropped (0: off).
    pub min_p: f32,
    /// Token sequences never generated: the last token of each is banned where the generated
    /// tokens end with the rest of it (vLLM's `bad_words`, tokenized).
    pub bad_words: Vec<Vec<u32>>,
    /// When set, only these tokens may be generated (`allowed_token_ids`).
    pub allowed_token_ids: Option<Vec<u32>>,
}

impl LogitsAdjust {
    /// Whether this changes nothing (the logits go to the sampler as they are).
    pub fn is_neutral(&self) -> bool {
        self.presence_penalty == 0.0
            && self.frequency_penalty == 0.0
            && (self.repetition_penalty == 1.0 || self.repetition_penalty == 0.0)
            && self.logit_bias.is_empty()
            && self.min_p <= 0.0
            && self.bad_words.is_empty()
            && self.allowed_token_ids.is_none()
    }

    /// Adjusts `logits` for the next token of a sequence with `prompt` and the `generated`
    /// tokens so far; `temperature` is the sampler's (`<= 0`: greedy, where `min_p` does
    /// nothing, as in vLLM).
    pub fn apply(&self, logits: &mut [f32], prompt: &[u32], generated: &[u32], temperature: f32) {
        let vocab = logits.len();
        if let Some(allowed) = &self.allowed_token_ids {
            let mut keep = vec![false; vocab];
            for &t in allowed {
                if let Some(k) = keep.get_mut(t as usize) {
                    *k = true;
                }
            }
            for (l, k) in logits.iter_mut().zip(keep) {
                if !k {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        for word in &self.bad_words {
            let Some((&last, prefix)) = word.split_last() else {
                continue;
            };
            if generated.ends_with(prefix) {
                if let Some(l) = logits.get_mut(last as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        for (&t, &bias) in &self.logit_bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += bias;
            }
        }
        self.penalize(logits, prompt, generated);
        if self.min_p > 0.0 && temperature > 0.0 {
            // p_i / p_max = exp((l_i - l_max) / T) >= min_p  <=>  l_i >= l_max + T ln(min_p)
            let max = logits
                .iter()
                .copied()
                .filter(|l| !l.is_nan())
                .fold(f32::NEG_INFINITY, f32::max);
            if max.is_finite() {
                let floor = f64::from(max) + f64::from(temperature) * f64::from(self.min_p).ln();
                for l in logits.iter_mut() {
                    if f64::from(*l) < floor {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }

    /// The repetition, frequency and presence penalties (vLLM's `apply_penalties`).
    fn penalize(&self, logits: &mut [f32], prompt: &[u32], generated: &[u32]) {
        let repetition = self.repetition_penalty > 0.0 && self.repetition_penalty != 1.0;
        if repetition {
            let mut seen = vec![false; logits.len()];
            for &t in prompt.iter().chain(generated) {
                if let Some(s) = seen.get_mut(t as usize) {
                    *s = true;
                }
            }
            for (l, s) in logits.iter_mut().zip(seen) {
                if s {
                    *l = if *l > 0.0 {
                        *l / self.repetition_penalty
                    } else {
                        *l * self.repetition_penalty
                    };
                }
            }
        }
        if self.frequency_penalty != 0.0 || self.presence_penalty != 0.0 {
            let mut counts: HashMap<u32, u32> = HashMap::new();
            for &t in generated {
                *counts.entry(t).or_default() += 1;
            }
            for (t, n) in counts {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= self.frequency_penalty * n as f32 + self.presence_penalty;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neutral_changes_nothing() {
        let a = LogitsAdjust {
            repetition_penalty: 1.0,
            ..LogitsAdjust::default()
        };
        assert!(a.is_neutral());
        let mut l = [1.0f32, -2.0, 3.0];
        a.apply(&mut l, &[0, 1], &[2, 2], 1.0);
        assert_eq!(l, [1.0, -2.0, 3.0]);
    }

    #[test]
    fn penalties_match_hand_computed_logits() {
        let a = LogitsAdjust {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            repetition_penalty: 2.0,
            ..LogitsAdjust::default()
        };
        let mut l = [4.0f32, -1.0, 2.0, 6.0, 1.0];
        // prompt: 0, 1; generated: 2, 2, 3
        a.apply(&mut l, &[0, 1], &[2, 2, 3], 1.0);
        // 0: prompt only → 4/2; 1: prompt only, negative → -1*2
        // 2: generated twice → 2/2 - 0.25*2 - 0.5; 3: once → 6/2 - 0.25 - 0.5; 4: untouched
        assert_eq!(l, [2.0, -2.0, 0.0, 2.25, 1.0]);
    }

    #[test]
    fn presence_and_frequency_skip_the_prompt() {
        let a = LogitsAdjust {
            presence_penalty: 1.0,
            frequency_penalty: 1.0,
            ..LogitsAdjust::default()
        };
        let mut l = [1.0f32, 1.0];
        a.apply(&mut l, &[0], &[], 1.0);
        assert_eq!(l, [1.0, 1.0]);
    }

    #[test]
    fn bias_allowed_and_bad_words() {
        let a = LogitsAdjust {
            logit_bias: HashMap::from([(1, 10.0), (9, 5.0)]),
            allowed_token_ids: Some(vec![0, 1, 2, 99]),
            bad_words: vec![vec![2], vec![0, 1], vec![4, 4, 0]],
            ..LogitsAdjust::default()
        };
        let mut l = [1.0f32, 1.0, 1.0, 1.0];
        // `[2]` is always banned; `[0, 1]` only right after a 0; `[4, 4, 0]` needs 4, 4
        a.apply(&mut l, &[], &[3, 0], 1.0);
        let inf = f32::NEG_INFINITY;
        assert_eq!(l, [1.0, inf, inf, inf]);
        let mut l = [1.0f32, 1.0, 1.0, 1.0];
        a.apply(&mut l, &[], &[4], 1.0);
        assert_eq!(l, [1.0, 11.0, inf, inf]);
    }

    #[test]
    fn min_p_is_relative_to_the_top_probability_after_temperature() {
        let a = LogitsAdjust {
            min_p: 0.1,
            ..LogitsAdjust::default()
        };
        // at T = 1: p_i / p_max = e^(l_i - 3): 1, e^-2 = 0.135 (kept), e^-3 = 0.0498 (dropped)
        let mut l = [3.0f32, 1.0, 0.0];
        a.apply(&mut l, &[], &[], 1.0);
        assert_eq!(l, [3.0, 1.0, f32::NEG_INFINITY]);
        // at T = 0.5 the ratios square: e^-4 = 0.018 is dropped too
        let mut l = [3.0f32, 1.0, 0.0];
        a.apply(&mut l, &[], &[], 0.5);
        assert_eq!(l, [3.0, f32::NEG_INFINITY, f32::NEG_INFINITY]);
        // greedy: no effect
        let mut l = [3.0f32, 1.0, 0.0];
        a.apply(&mut l, &[], &[], 0.0);
        assert_eq!(l, [3.0, 1.0, 0.0]);
    }
}
