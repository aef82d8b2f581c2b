//! Log-probabilities from logits: the chosen token's and the `n` most likely alternatives',
//! from the model's raw distribution (`log_softmax` of the logits, before temperature or
//! filtering), accumulated in f64.

use std::collections::BTreeMap;

use fp4forge_api::{PromptLogprob, PromptLogprobs};
use fp4forge_engine::{Logits, TextCodec};
use rayon::prelude::*;

/// One position's log-probabilities.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TokenLogprob {
    /// `log p(token)` of the token actually at this position.
    pub logprob: f32,
    /// The token's rank in the vocabulary (1: the most likely; ties share the best rank).
    pub rank: u32,
    /// The most likely tokens and their log-probabilities, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// `log Σ exp(logits)`, NaN ignored.
fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = logits
        .iter()
        .filter(|x| !x.is_nan())
        .fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    if !max.is_finite() {
        return f64::from(max);
    }
    let m = f64::from(max);
    let sum: f64 = logits
        .iter()
        .filter(|x| !x.is_nan())
        .map(|&x| (f64::from(x) - m).exp())
        .sum();
    m + sum.ln()
}

/// The log-probability of `token` and the `top` most likely tokens under `logits`.
pub(crate) fn token_logprob(logits: &[f32], token: u32, top: usize) -> TokenLogprob {
    let lse = log_sum_exp(logits);
    let lp = |i: usize| (f64::from(logits[i]) - lse) as f32;
    let logprob = logits
        .get(token as usize)
        .map_or(f32::NEG_INFINITY, |_| lp(token as usize));
    let rank = logits
        .get(token as usize)
        .map_or(logits.len() as u32, |&x| {
            1 + logits.iter().filter(|&&y| y > x).count() as u32
        });
    let top = top_k(logits, top)
        .into_iter()
        .map(|i| (i as u32, lp(i)))
        .collect();
    TokenLogprob { logprob, rank, top }
}

/// vLLM's `prompt_logprobs` of `prompt` from its per-position logprobs (`None` where there are
/// none, as for the first token): each position's `top` most likely tokens (ranks 1..) and the
/// prompt's own token.
pub(crate) fn prompt_logprobs_wire(
    codec: &TextCodec,
    prompt: &[u32],
    logprobs: &[Option<TokenLogprob>],
    top: usize,
) -> PromptLogprobs {
    let entry = |id: u32, logprob: f32, rank: u32| PromptLogprob {
        logprob: f64::from(logprob),
        rank: Some(u64::from(rank)),
        decoded_token: codec.decode(&[id], true).ok(),
    };
    prompt
        .iter()
        .zip(logprobs)
        .map(|(&id, lp)| {
            let lp = lp.as_ref()?;
            let mut map: BTreeMap<u32, PromptLogprob> = lp
                .top
                .iter()
                .take(top)
                .enumerate()
                .map(|(r, &(t, v))| (t, entry(t, v, r as u32 + 1)))
                .collect();
            map.insert(id, entry(id, lp.logprob, lp.rank));
            Some(map)
        })
        .collect()
}

/// [`token_logprob`] of every row `r` of `logits` with token `targets[r]` (`targets` may be
/// shorter than the rows: the rest are skipped), split over `pool`'s threads when there is one.
pub(crate) fn rows_logprobs(
    pool: Option<&rayon::ThreadPool>,
    logits: &Logits,
    targets: &[u32],
    top: usize,
) -> Vec<TokenLogprob> {
    let n = targets.len().min(logits.rows);
    let one = |r: usize| token_logprob(logits.row(r), targets[r], top);
    match pool {
        Some(pool) if n > 1 => pool.install(|| (0..n).into_par_iter().map(one).collect()),
        _ => (0..n).map(one).collect(),
    }
}

/// Indices of the `k` largest logits, largest first (lower index first on ties; NaN last).
fn top_k(logits: &[f32], k: usize) -> Vec<usize> {
    let k = k.min(logits.len());
    if k == 0 {
        return Vec::new();
    }
    let key = |i: usize| {
        let v = logits[i];
        if v.is_nan() {
            f32::NEG_INFINITY
        } else {
            v
        }
    };
    let better = |a: usize, b: usize| key(a) > key(b) || (key(a) == key(b) && a < b);
    // A small sorted buffer: k is at most a few dozen.
    let mut best: Vec<usize> = Vec::with_capacity(k + 1);
    for i in 0..logits.len() {
        if best.len() == k && !better(i, best[k - 1]) {
            continue;
        }
        let at = best.partition_point(|&j| better(j, i));
        best.insert(at, i);
        best.truncate(k);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_normalised_and_top_is_sorted() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, f32::NAN];
        let t = token_logprob(&logits, 2, 3);
        let total: f64 = [1.0f64, 3.0, 2.0, 3.0].iter().map(|x| x.exp()).sum();
        assert!((f64::from(t.logprob) - (2.0 - total.ln())).abs() < 1e-6);
        let ids: Vec<u32> = t.top.iter().map(|p| p.0).collect();
        assert_eq!(ids, vec![1, 3, 2]);
        assert!(t.top[0].1 >= t.top[2].1);
        assert_eq!(t.rank, 3);
        assert_eq!(token_logprob(&logits, 1, 0).rank, 1);
        assert!(token_logprob(&logits, 9, 0).top.is_empty());
    }
}
