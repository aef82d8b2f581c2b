//! Log-probabilities from logits: a token's and the `n` most likely alternatives', from the
//! model's raw distribution (`log_softmax` of the logits, before temperature or filtering),
//! accumulated in f64. This is the host's arithmetic; a backend that computes them where the
//! logits are ([`Backend::logprobs`](crate::Backend::logprobs)) follows it.

/// One position's log-probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// `log p(token)` of the token scored at this position.
    pub logprob: f32,
    /// The token's rank in the vocabulary (1: the most likely; ties share the best rank).
    pub rank: u32,
    /// The most likely tokens and their log-probabilities, most likely first (lower id first
    /// on ties; a NaN logit counts as `-inf`).
    pub top: Vec<(u32, f32)>,
}

/// What log-probabilities a session wants from a pass
/// ([`Model::forward_batch_scored`](crate::Model::forward_batch_scored)), computed where the
/// logits are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogprobSpec<'a> {
    /// Row `r` of the logits the session wants scores `targets[r]` (a prompt's next tokens);
    /// rows past the end of `targets` come back as logits. With a sampler the picked token is
    /// scored instead and `targets` is not read.
    pub targets: &'a [u32],
    /// How many of the most likely tokens per row (`top`).
    pub top: usize,
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

/// The log-probability of `token` and the `top` most likely tokens under `logits` (a token
/// outside the vocabulary: `-inf`, ranked last).
pub fn token_logprob(logits: &[f32], token: u32, top: usize) -> TokenLogprob {
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

/// Indices of the `k` largest logits, largest first (lower index first on ties; NaN counts as
/// `-inf`).
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
        assert_eq!(token_logprob(&logits, 9, 0).rank, 5);
        // NaN counts as -inf (ties by index); its own logprob is NaN
        let t = token_logprob(&[f32::NAN, f32::NEG_INFINITY, 0.0], 0, 3);
        assert_eq!(t.top.iter().map(|p| p.0).collect::<Vec<_>>(), vec![2, 0, 1]);
        assert!(t.logprob.is_nan());
    }
}
