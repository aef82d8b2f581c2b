//! The statistics of the reports: percentiles, ratio estimates with standard errors, paired
//! deltas, and a small seeded generator for reproducible subsamples.
//!
//! Every score is a ratio `Σ num_i / Σ den_i` over items `i` (accuracy: num ∈ {0,1}, den = 1;
//! per-token NLL: num = summed NLL of a window, den = its token count). Its standard error is the
//! usual linearised (delta-method) one,
//! `σ = sqrt(Σ (num_i − r·den_i)² / (n(n−1))) / mean(den)`, which for accuracy is exactly the
//! binomial `sqrt(p(1−p)/(n−1))` of lm-evaluation-harness. A paired delta between two endpoints
//! scored on the same items uses the per-item differences of those linearised terms, which for
//! accuracy is `std(d_i) / sqrt(n)` with `d_i = x_i^B − x_i^A` (sample std, n−1).

use serde::{Deserialize, Serialize};

/// Deserializes a float written as `null` (serde_json writes NaN so) back to NaN.
pub(crate) fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// p50/p90/p99 (and mean) of a sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Number of values.
    pub n: usize,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Percentiles {
    /// The percentiles of `values` (NaNs dropped); all zero for an empty sample.
    pub fn of(values: &[f64]) -> Self {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return Self::default();
        }
        v.sort_by(|a, b| a.total_cmp(b));
        Self {
            n: v.len(),
            mean: v.iter().sum::<f64>() / v.len() as f64,
            p50: percentile_sorted(&v, 50.0),
            p90: percentile_sorted(&v, 90.0),
            p99: percentile_sorted(&v, 99.0),
        }
    }

    /// Every field multiplied by `k` (e.g. seconds → milliseconds).
    pub fn scaled(self, k: f64) -> Self {
        Self {
            n: self.n,
            mean: self.mean * k,
            p50: self.p50 * k,
            p90: self.p90 * k,
            p99: self.p99 * k,
        }
    }
}

/// The `q`-th percentile (0..=100) of ascending `sorted` values, linear interpolation between
/// closest ranks (numpy's default): rank `q/100 · (n−1)`. NaN for an empty slice.
pub fn percentile_sorted(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let rank = (q / 100.0).clamp(0.0, 1.0) * (n - 1) as f64;
            let lo = rank.floor() as usize;
            let hi = rank.ceil() as usize;
            sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
        }
    }
}

/// The median of `values` (NaN when empty).
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    percentile_sorted(&v, 50.0)
}

/// One item's contribution to a ratio score.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Numerator (1/0 for a correct/wrong answer, summed NLL for a window).
    pub num: f64,
    /// Denominator (1 for an answer, token count for a window).
    pub den: f64,
}

impl Sample {
    /// A 0/1 outcome.
    pub fn hit(correct: bool) -> Self {
        Self {
            num: if correct { 1.0 } else { 0.0 },
            den: 1.0,
        }
    }
}

/// A score with its standard error.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// The ratio `Σ num / Σ den`.
    #[serde(deserialize_with = "nan_if_null")]
    pub value: f64,
    /// Its standard error (0 for fewer than two items).
    #[serde(deserialize_with = "nan_if_null")]
    pub stderr: f64,
    /// Number of items.
    pub n: usize,
}

/// The ratio estimate of `samples` and its standard error (see the module docs).
pub fn ratio_estimate(samples: &[Sample]) -> Estimate {
    let n = samples.len();
    let den: f64 = samples.iter().map(|s| s.den).sum();
    if n == 0 || den == 0.0 {
        return Estimate {
            value: f64::NAN,
            stderr: f64::NAN,
            n,
        };
    }
    let r = samples.iter().map(|s| s.num).sum::<f64>() / den;
    let mean_den = den / n as f64;
    let stderr = if n < 2 {
        0.0
    } else {
        let ss: f64 = samples.iter().map(|s| (s.num - r * s.den).powi(2)).sum();
        (ss / (n * (n - 1)) as f64).sqrt() / mean_den
    };
    Estimate {
        value: r,
        stderr,
        n,
    }
}

/// Binomial standard error of a proportion `p` over `n` items, `sqrt(p(1−p)/(n−1))` (as
/// lm-evaluation-harness reports it).
pub fn binomial_stderr(p: f64, n: usize) -> f64 {
    if n < 2 {
        return 0.0;
    }
    (p * (1.0 - p) / (n - 1) as f64).sqrt()
}

/// The paired difference `B − A` of two ratio scores over the same items, with its standard
/// error from the per-item differences of the linearised terms (see the module docs).
/// `a` and `b` must be in the same item order; extra items of the longer one are ignored.
pub fn paired_delta(a: &[Sample], b: &[Sample]) -> Estimate {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let ea = ratio_estimate(a);
    let eb = ratio_estimate(b);
    if n < 2 {
        return Estimate {
            value: eb.value - ea.value,
            stderr: 0.0,
            n,
        };
    }
    let mean_den = |s: &[Sample]| s.iter().map(|x| x.den).sum::<f64>() / n as f64;
    let (ma, mb) = (mean_den(a), mean_den(b));
    let d: Vec<f64> = a
        .iter()
        .zip(b)
        .map(|(x, y)| (y.num - eb.value * y.den) / mb - (x.num - ea.value * x.den) / ma)
        .collect();
    let ss: f64 = d.iter().map(|v| v * v).sum();
    Estimate {
        value: eb.value - ea.value,
        stderr: (ss / (n * (n - 1)) as f64).sqrt(),
        n,
    }
}

/// SplitMix64: a tiny, seeded, portable generator (same numbers on every platform and version).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform integer in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }
}

/// `k` distinct indices of `0..n` chosen with `seed` (all of them when `k >= n`), ascending.
pub fn subsample(n: usize, k: usize, seed: u64) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..n).collect();
    if k >= n {
        return idx;
    }
    let mut rng = SplitMix64::new(seed);
    for i in 0..k {
        let j = i + rng.below(n - i);
        idx.swap(i, j);
    }
    idx.truncate(k);
    idx.sort_unstable();
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        // numpy.percentile(range(1, 11), [50, 90, 99]) = 5.5, 9.1, 9.91
        let p = Percentiles::of(&v);
        assert!(close(p.p50, 5.5) && close(p.p90, 9.1) && close(p.p99, 9.91));
        assert!(close(p.mean, 5.5));
        assert_eq!(p.n, 10);
        assert!(close(percentile_sorted(&[3.0], 99.0), 3.0));
        assert!(close(percentile_sorted(&[1.0, 2.0], 0.0), 1.0));
        assert!(close(percentile_sorted(&[1.0, 2.0], 100.0), 2.0));
        assert!(percentile_sorted(&[], 50.0).is_nan());
        // order does not matter, NaNs are dropped
        let q = Percentiles::of(&[9.0, f64::NAN, 1.0, 5.0]);
        assert_eq!(q.n, 3);
        assert!(close(q.p50, 5.0));
        assert_eq!(Percentiles::of(&[]), Percentiles::default());
    }

    #[test]
    fn accuracy_stderr_is_binomial() {
        let s: Vec<Sample> = (0..10).map(|i| Sample::hit(i < 7)).collect();
        let e = ratio_estimate(&s);
        assert!(close(e.value, 0.7));
        assert!(close(e.stderr, binomial_stderr(0.7, 10)));
        assert!(close(e.stderr, (0.7f64 * 0.3 / 9.0).sqrt()));
        assert_eq!(e.n, 10);
    }

    #[test]
    fn ratio_estimate_of_windows() {
        // two windows: 10 nats over 5 tokens, 30 nats over 5 tokens -> 4 nats/token
        let s = [
            Sample {
                num: 10.0,
                den: 5.0,
            },
            Sample {
                num: 30.0,
                den: 5.0,
            },
        ];
        let e = ratio_estimate(&s);
        assert!(close(e.value, 4.0));
        // residuals -10, +10; sqrt(200 / 2) / 5 = 2
        assert!(close(e.stderr, 2.0));
    }

    #[test]
    fn paired_delta_uses_the_std_of_differences() {
        let a: Vec<Sample> = [1, 1, 0, 1, 0, 1]
            .iter()
            .map(|&x| Sample::hit(x == 1))
            .collect();
        let b: Vec<Sample> = [1, 0, 0, 1, 1, 0]
            .iter()
            .map(|&x| Sample::hit(x == 1))
            .collect();
        let d = paired_delta(&a, &b);
        // d = 0,-1,0,0,1,-1: mean -1/6, sample std = sqrt(Σ(d-m)²/5)
        let diffs = [0.0, -1.0, 0.0, 0.0, 1.0, -1.0];
        let m: f64 = diffs.iter().sum::<f64>() / 6.0;
        let sd = (diffs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / 5.0).sqrt();
        assert!(close(d.value, m));
        assert!(close(d.stderr, sd / 6f64.sqrt()));
        // identical answers: no difference, no uncertainty
        let same = paired_delta(&a, &a);
        assert!(close(same.value, 0.0) && close(same.stderr, 0.0));
    }

    #[test]
    fn subsample_is_seeded_distinct_and_sorted() {
        let a = subsample(1000, 50, 7);
        assert_eq!(a, subsample(1000, 50, 7));
        assert_ne!(a, subsample(1000, 50, 8));
        assert_eq!(a.len(), 50);
        assert!(a.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(subsample(5, 10, 1), vec![0, 1, 2, 3, 4]);
    }
}
