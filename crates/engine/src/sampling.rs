//! Choosing the next token from logits: greedy, or temperature with top-k and top-p (nucleus)
//! filtering, driven by a small seeded PRNG (xoshiro256++) so a seed reproduces a generation.

/// Temperatures below this are greedy (vLLM's rule, `_SAMPLING_EPS`): dividing the logits by a
/// tinier one overflows them to ±inf, and the softmax of those is NaN, not the argmax.
pub const GREEDY_BELOW_TEMPERATURE: f32 = 1e-5;

/// How to pick tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; below [`GREEDY_BELOW_TEMPERATURE`] (0 included) means greedy
    /// (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0: no limit).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p` (1: all).
    pub top_p: f32,
    /// PRNG seed.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::greedy()
    }
}

impl SamplingParams {
    /// Always the most likely token.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }

    /// Whether this is greedy decoding: a temperature below [`GREEDY_BELOW_TEMPERATURE`] (NaN
    /// included) or `top_k` 1.
    pub fn is_greedy(&self) -> bool {
        self.temperature.is_nan() || self.temperature < GREEDY_BELOW_TEMPERATURE || self.top_k == 1
    }
}

/// xoshiro256++ seeded through splitmix64.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator from a seed (any value, including 0).
    pub fn new(seed: u64) -> Self {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Self {
            s: [next(), next(), next(), next()],
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let out = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        out
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Picks tokens under [`SamplingParams`].
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
}

impl Sampler {
    /// A sampler seeded with `params.seed`.
    pub fn new(params: SamplingParams) -> Self {
        Self {
            rng: Rng::new(params.seed),
            params,
        }
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The next token for `logits` (NaN counts as -inf). Returns 0 for empty logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let u = self.draw();
        self.pick(logits, u)
    }

    /// The uniform draw in `[0, 1)` the next non-greedy pick uses (advancing the generator), or
    /// `None` for greedy parameters (which draw nothing). `sample` is `pick(logits, draw())`;
    /// a device that samples itself takes the same draw, so a seed gives the same tokens there.
    pub fn draw(&mut self) -> Option<f64> {
        (!self.params.is_greedy()).then(|| self.rng.next_f64())
    }

    /// The token for `logits` given the draw `u` of [`draw`](Self::draw) (`None`: greedy).
    /// Candidates are ordered by `logit / temperature` descending, then index; top-k, then the
    /// softmax in f64, then the top-p prefix; the first whose cumulative probability exceeds `u`.
    /// With top-k 0 and top-p 1 (no cut) any order samples the same distribution, so the
    /// candidates stay in index order and nothing is sorted ([`pick_in_index_order`]). Sums and
    /// cumulative sums run in [`SUM_PARTS`] parts ([`parted_sum`], [`parted_walk`]).
    pub fn pick(&self, logits: &[f32], u: Option<f64>) -> u32 {
        let Some(u) = u.filter(|_| !self.params.is_greedy()) else {
            return argmax(logits);
        };
        let t = self.params.temperature;
        let k = self.params.top_k;
        // (the nucleus below is cut only where top_p < 1: a NaN top_p cuts nothing either)
        let top_p = self.params.top_p;
        if k == 0 && (top_p >= 1.0 || top_p.is_nan()) {
            if logits.iter().all(|l| l.is_nan()) {
                return 0;
            }
            return pick_in_index_order(logits, t, u);
        }
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_nan())
            .map(|(i, &l)| (i as u32, l / t))
            .collect();
        if cand.is_empty() {
            return 0;
        }
        // (a total order: selecting the top k first and sorting only them is the full sort's
        // prefix, in O(vocab) instead of O(vocab log vocab))
        let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if k > 0 && k < cand.len() {
            cand.select_nth_unstable_by(k - 1, order);
            cand.truncate(k);
        }
        cand.sort_by(order);
        let max = cand[0].1;
        let mut probs: Vec<f64> = cand.iter().map(|c| f64::from(c.1 - max).exp()).collect();
        let total = parted_sum(&probs);
        for p in &mut probs {
            *p /= total;
        }
        if self.params.top_p < 1.0 {
            let top_p = f64::from(self.params.top_p);
            let keep = parted_walk(&probs, |acc| acc >= top_p).map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
            let total = parted_sum(&probs);
            for p in &mut probs {
                *p /= total;
            }
        }
        let i = parted_walk(&probs, |acc| u < acc).unwrap_or(probs.len() - 1);
        cand[i].0
    }
}

/// The pick of [`Sampler::pick`] at top-k 0 and top-p 1 (no cut), from `logits` with at
/// least one non-NaN value: every position's term `exp(logit / t - max)` in f64 (`max` the
/// largest `logit / t`; 0 for NaN) in index order, their parted sum, each term divided by it,
/// and the first position whose parted cumulative probability exceeds `u`. The pick has a
/// positive probability: where the walk stops on a zero term (a part's sum and its terms'
/// running sum differ in the last bits) the next positive one, where it finds none (`u` above
/// the rounded total) the last positive one, and where no term is positive (an infinite logit)
/// the first largest logit. NaN and `-inf` (a masked token) are never picked.
fn pick_in_index_order(logits: &[f32], t: f32, u: f64) -> u32 {
    let max = logits
        .iter()
        .filter(|l| !l.is_nan())
        .map(|&l| l / t)
        .fold(f32::NEG_INFINITY, f32::max);
    let mut probs: Vec<f64> = logits
        .iter()
        .map(|&l| {
            if l.is_nan() {
                0.0
            } else {
                f64::from(l / t - max).exp()
            }
        })
        .collect();
    let total = parted_sum(&probs);
    for p in &mut probs {
        *p /= total;
    }
    let stop = parted_walk(&probs, |acc| u < acc).unwrap_or(probs.len());
    let positive = |i: &usize| probs[*i] > 0.0;
    let pick = (stop..probs.len())
        .find(positive)
        .or_else(|| (0..probs.len()).rev().find(positive))
        .unwrap_or_else(|| argmax(logits) as usize);
    pick as u32
}

/// Parts that the sampler's sums over its candidates (sorted, or in index order) are cut into:
/// each part's terms are added in order, then the parts' sums in order, so that a device with
/// this many threads a row (the CUDA backend's `pick_sorted`) computes the same bits in
/// parallel. Up to this many candidates each part is one term: the plain sum in order.
pub const SUM_PARTS: usize = 1024;

/// Terms per part of a sum of `n` terms (the last part may hold fewer).
fn part_len(n: usize) -> usize {
    n.div_ceil(SUM_PARTS).max(1)
}

/// The terms of `p` added in order from 0.
fn sum_in_order(p: &[f64]) -> f64 {
    p.iter().fold(0.0, |acc, &x| acc + x)
}

/// The sum of `p` in [`SUM_PARTS`] parts: each part's terms added in order from 0, then the
/// parts' sums in order from 0.
pub(crate) fn parted_sum(p: &[f64]) -> f64 {
    let parts: Vec<f64> = p.chunks(part_len(p.len())).map(sum_in_order).collect();
    sum_in_order(&parts)
}

/// The first index at which the cumulative sum of `p` satisfies `hit`, the cumulative sum in
/// parts: the sums of the parts before (each as in [`parted_sum`]) added in order, then the
/// part's own terms in order; `None` where no index does.
pub(crate) fn parted_walk(p: &[f64], hit: impl Fn(f64) -> bool) -> Option<usize> {
    let len = part_len(p.len());
    let mut before = 0.0;
    for (j, part) in p.chunks(len).enumerate() {
        let mut acc = before;
        for (i, &x) in part.iter().enumerate() {
            acc += x;
            if hit(acc) {
                return Some(j * len + i);
            }
        }
        before += sum_in_order(part);
    }
    None
}

/// Index of the largest logit (the first one on ties; NaN ignored).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Up to [`SUM_PARTS`] terms the parted sums are the plain ones in order; beyond, parts of
    /// `ceil(n / SUM_PARTS)` terms.
    #[test]
    fn parted_sums_are_the_plain_ones_up_to_the_part_count() {
        let terms: Vec<f64> = (0..3000)
            .map(|i| 1.0 / (1.0 + i as f64).powf(1.3))
            .collect();
        let plain = |p: &[f64]| p.iter().fold(0.0, |a, &x| a + x);
        for n in [1, 2, 1000, SUM_PARTS] {
            let p = &terms[..n];
            assert_eq!(parted_sum(p).to_bits(), plain(p).to_bits(), "{n}");
            let half = plain(p) / 2.0;
            let mut acc = 0.0;
            let first = p.iter().position(|&x| {
                acc += x;
                acc >= half
            });
            assert_eq!(parted_walk(p, |a| a >= half), first, "{n}");
        }
        // 3,000 terms: 1,000 parts of 3
        let parts: Vec<f64> = terms.chunks(3).map(plain).collect();
        assert_eq!(parted_sum(&terms).to_bits(), plain(&parts).to_bits());
        assert_ne!(parted_sum(&terms).to_bits(), plain(&terms).to_bits());
        // the walk: the parts before added in order, then the part's terms
        let target = plain(&parts[..500]) + terms[1500] + terms[1501] / 2.0;
        assert_eq!(parted_walk(&terms, |a| a >= target), Some(1501));
        assert_eq!(parted_walk(&terms, |a| a > 1e9), None);
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, f32::NAN]), 1);
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&[0.0, -1.0, 5.0]), 2);
    }

    #[test]
    fn tiny_temperatures_are_greedy() {
        // 1e-39 is a subnormal f32: logits / t overflow to inf, and the softmax of those is NaN.
        let logits = [0.5, 2.0, 1.0, -3.0];
        for t in [1e-39_f32, 1e-30, 1e-6, 0.0] {
            let params = SamplingParams {
                temperature: t,
                top_k: 0,
                top_p: 1.0,
                seed: 7,
            };
            assert!(params.is_greedy(), "{t}");
            for seed in 0..20 {
                let mut s = Sampler::new(SamplingParams { seed, ..params });
                assert_eq!(s.sample(&logits), 1, "temperature {t}, seed {seed}");
            }
        }
        let warm = SamplingParams {
            temperature: 1e-5,
            ..SamplingParams::greedy()
        };
        assert!(!warm.is_greedy());
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_respects_top_k() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 3,
            top_p: 1.0,
            seed: 7,
        };
        let a: Vec<u32> = {
            let mut s = Sampler::new(p);
            (0..100).map(|_| s.sample(&logits)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(p);
            (0..100).map(|_| s.sample(&logits)).collect()
        };
        assert_eq!(a, b);
        let mut top: Vec<u32> = (0..50).collect();
        top.sort_by(|&x, &y| logits[y as usize].total_cmp(&logits[x as usize]));
        assert!(a.iter().all(|t| top[..3].contains(t)));
        assert!(top[..3].iter().all(|t| a.contains(t)));
    }

    #[test]
    fn top_k_cuts_ties_by_index() {
        // three tokens tie for the top: top-2 keeps the two lowest indices, each equally likely
        let logits = [1.0f32, 2.0, 2.0, 2.0, 0.0, f32::NAN];
        let s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 2,
            top_p: 1.0,
            seed: 0,
        });
        assert_eq!(s.pick(&logits, Some(0.0)), 1);
        assert_eq!(s.pick(&logits, Some(0.49)), 1);
        assert_eq!(s.pick(&logits, Some(0.51)), 2);
        assert_eq!(s.pick(&logits, Some(0.999)), 2);
        // greedy parameters ignore the draw
        let g = Sampler::new(SamplingParams::greedy());
        assert_eq!(g.pick(&logits, Some(0.9)), 1);
    }

    /// At top-k 0 and top-p 1 the candidates stay in index order: each token's share of evenly
    /// spaced draws is its probability, and NaN, `-inf` and zero terms are never picked.
    #[test]
    fn uncut_picks_walk_the_vocabulary_in_index_order() {
        let whole = |top_k| {
            Sampler::new(SamplingParams {
                temperature: 1.0,
                top_k,
                top_p: 1.0,
                seed: 0,
            })
        };
        // probabilities 1/4, 1/2, 1/4 at 0, 2 and 4, in that order along the draw (sorted, 2
        // would come first)
        let logits = [
            0.0f32,
            f32::NAN,
            std::f32::consts::LN_2,
            f32::NEG_INFINITY,
            0.0,
            -1e30,
        ];
        let draws = [0.0, 0.2, 0.3, 0.7, 0.8, 0.999];
        let picks =
            |s: &Sampler| -> Vec<u32> { draws.iter().map(|&u| s.pick(&logits, Some(u))).collect() };
        assert_eq!(picks(&whole(0)), [0, 0, 2, 2, 4, 4]);
        // a top-k, even one above the candidates, sorts them: the likeliest first
        assert_eq!(picks(&whole(100)), [2, 2, 2, 0, 4, 4]);
        // a draw past the rounded total: the last positive term, not the NaN or -inf after it
        let s = whole(0);
        assert_eq!(
            s.pick(&[1.0, 1.0, f32::NEG_INFINITY, f32::NAN], Some(1.0)),
            1
        );
        // an infinite logit leaves no positive term: the first largest logit
        assert_eq!(
            s.pick(&[0.0, f32::INFINITY, 1.0, f32::INFINITY], Some(0.5)),
            1
        );
        // shares of 20,000 evenly spaced draws over 2,000 tokens (parts of 2 terms)
        let logits: Vec<f32> = (0..2000).map(|i| (i as f32 * 0.731).sin() * 4.0).collect();
        let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let terms: Vec<f64> = logits.iter().map(|&l| f64::from(l - max).exp()).collect();
        let total: f64 = terms.iter().sum();
        let draws = 20_000;
        let mut count = vec![0usize; logits.len()];
        for j in 0..draws {
            count[s.pick(&logits, Some((j as f64 + 0.5) / draws as f64)) as usize] += 1;
        }
        for (i, (&c, &t)) in count.iter().zip(&terms).enumerate() {
            let expected = t / total * draws as f64;
            assert!(
                (c as f64 - expected).abs() <= 2.0,
                "token {i}: {c} draws, {expected:.2} expected"
            );
        }
    }

    #[test]
    fn top_p_keeps_the_nucleus() {
        // One token holds ~0.9999 of the mass: top_p 0.5 keeps only it.
        let logits = [10.0f32, 0.0, 0.0, 0.0];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            seed: 1,
        });
        assert!((0..50).all(|_| s.sample(&logits) == 0));
    }
}
