//! Rotary position embeddings as transformers computes them: inverse frequencies per rope type
//! (default, linear, llama3, yarn), a rotary width (partial rotary factor), and a factor applied
//! to cos and sin (YaRN's `attention_factor`).
//!
//! Rotation is NeoX style (`rotate_half`) *within the rotary slice*: for `j < r/2` element `j`
//! pairs with `j + r/2`; elements `r..head_dim` pass through. The angle of pair `j` at position
//! `p` is `f32(p) · inv_freq[j]` (an f32 product, as transformers' f32 matmul gives it).

use fp4forge_arch::{Rope, RopeScaling};

/// One rotary embedding: everything a backend needs to build its cos/sin tables.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeSpec {
    /// `inv_freq[j]` for `j < rotary_dim / 2`.
    pub inv_freq: Vec<f32>,
    /// Width of the rotated slice of each head (even, `<= head_dim`).
    pub rotary_dim: usize,
    /// Factor multiplying cos and sin (YaRN `attention_factor`; 1 otherwise).
    pub attention_factor: f32,
}

impl RopeSpec {
    /// `cos` and `sin` of pair `j` at `position` (already multiplied by the attention factor),
    /// for `j < rotary_dim / 2`, appended to `cos` and `sin`.
    pub fn cos_sin(&self, position: usize, cos: &mut Vec<f32>, sin: &mut Vec<f32>) {
        let p = position as f32;
        for &f in &self.inv_freq {
            let angle = f64::from(p * f);
            cos.push(angle.cos() as f32 * self.attention_factor);
            sin.push(angle.sin() as f32 * self.attention_factor);
        }
    }

    /// The tables' inputs for a rope as `fp4forge_arch` read it from the config.
    pub fn from_arch(rope: &Rope) -> Self {
        let (theta, dim) = (rope.theta, rope.rotary_dim);
        let base = default_inv_freq(theta, dim);
        let inv_freq = match rope.scaling {
            RopeScaling::Default => base,
            RopeScaling::Linear { factor } => {
                let factor = factor as f32;
                base.iter().map(|f| f / factor).collect()
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => llama3_inv_freq(
                &base,
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            ),
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                truncate,
                ..
            } => yarn_inv_freq(
                theta,
                dim,
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                truncate,
            ),
        };
        Self {
            inv_freq,
            rotary_dim: dim,
            attention_factor: rope.attention_factor() as f32,
        }
    }
}

/// `pos_freqs[i] = θ^(2i/dim)` rounded to f32 (torch evaluates `base ** (arange/dim)` in f32).
fn pos_freqs(theta: f64, dim: usize) -> Vec<f32> {
    (0..dim / 2)
        .map(|i| {
            let e = (2 * i) as f32 / dim as f32;
            theta.powf(f64::from(e)) as f32
        })
        .collect()
}

/// `inv_freq[i] = 1 / θ^(2i/dim)` in f32.
pub fn default_inv_freq(theta: f64, dim: usize) -> Vec<f32> {
    pos_freqs(theta, dim).iter().map(|p| 1.0 / p).collect()
}

fn llama3_inv_freq(base: &[f32], factor: f64, low: f64, high: f64, old: f64) -> Vec<f32> {
    let low_wavelen = old / low;
    let high_wavelen = old / high;
    base.iter()
        .map(|&f| {
            let f = f64::from(f);
            let wavelen = 2.0 * std::f64::consts::PI / f;
            let scaled = if wavelen > low_wavelen { f / factor } else { f };
            let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
            if medium {
                let smooth = (old / wavelen - low) / (high - low);
                ((1.0 - smooth) * scaled / factor + smooth * scaled) as f32
            } else {
                scaled as f32
            }
        })
        .collect()
}

/// transformers' `_compute_yarn_parameters` inverse frequencies (f32 arithmetic as torch does
/// it; the correction range in f64 as Python does it).
fn yarn_inv_freq(
    theta: f64,
    dim: usize,
    factor: f64,
    orig: f64,
    beta_fast: f64,
    beta_slow: f64,
    truncate: bool,
) -> Vec<f32> {
    let correction_dim = |rotations: f64| {
        (dim as f64 * (orig / (rotations * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * theta.ln())
    };
    let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
    if truncate {
        low = low.floor();
        high = high.ceil();
    }
    let low = low.max(0.0);
    let mut high = high.min(dim as f64 - 1.0);
    if low == high {
        high += 0.001;
    }
    let (low32, span32) = (low as f32, (high - low) as f32);
    let factor32 = factor as f32;
    pos_freqs(theta, dim)
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            let extrapolation = 1.0 / p;
            let interpolation = 1.0 / (factor32 * p);
            let ramp = ((i as f32 - low32) / span32).clamp(0.0, 1.0);
            let extrapolation_factor = 1.0 - ramp;
            interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fp4forge_arch::ConfigJson;
    use serde_json::{json, Value};
    use std::path::Path;

    fn rope(v: Value, params: Option<&str>, head_dim: usize, max_pos: usize) -> RopeSpec {
        let Value::Object(m) = v else { unreachable!() };
        let c = ConfigJson::from_map(Path::new("config.json"), m);
        RopeSpec::from_arch(
            &Rope::from_config(&c, params, "rope_theta", head_dim, max_pos).unwrap(),
        )
    }

    #[test]
    fn laguna_s_yarn_ramp_and_factor() {
        let c = json!({"rope_parameters": {"full_attention": {
            "rope_type": "yarn", "rope_theta": 500000.0, "factor": 128.0,
            "original_max_position_embeddings": 8192, "beta_fast": 32.0, "beta_slow": 1.0,
            "attention_factor": 1.4852030263919618, "partial_rotary_factor": 0.5
        }}});
        let r = rope(c, Some("rope_parameters.full_attention"), 128, 1 << 20);
        assert_eq!(r.rotary_dim, 64);
        assert_eq!(r.inv_freq.len(), 32);
        assert!((r.attention_factor - 1.485_203).abs() < 1e-6);
        // low = 9, high = 18 (laguna.md §1.1): pairs below 9 extrapolate, above 18 interpolate.
        let base = default_inv_freq(500000.0, 64);
        assert_eq!(r.inv_freq[..=9], base[..=9]);
        for (i, (&got, &b)) in r.inv_freq.iter().zip(&base).enumerate().skip(18) {
            let interp = 1.0 / (128.0 * (1.0 / b));
            assert!((got - interp).abs() <= interp * 1e-6, "pair {i}");
        }
        assert!(r.inv_freq[12] < base[12] && r.inv_freq[12] > base[12] / 128.0);
    }

    #[test]
    fn default_rope_from_top_level_theta() {
        let r = rope(json!({"rope_theta": 100000.0}), None, 64, 8192);
        assert_eq!(r.rotary_dim, 64);
        assert_eq!(r.inv_freq[0], 1.0);
        assert!((r.inv_freq[1] - 100000f32.powf(-2.0 / 64.0)).abs() < 1e-7);
        let mut cos = Vec::new();
        let mut sin = Vec::new();
        r.cos_sin(3, &mut cos, &mut sin);
        assert!((cos[0] - 3f32.cos()).abs() < 1e-7 && (sin[0] - 3f32.sin()).abs() < 1e-7);
    }
}
