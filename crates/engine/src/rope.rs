//! Rotary position embeddings as transformers computes them: inverse frequencies per rope type
//! (default, linear, llama3, yarn), a rotary width (partial rotary factor), and a factor applied
//! to cos and sin (YaRN's `attention_factor`).
//!
//! Rotation is NeoX style (`rotate_half`) *within the rotary slice*: for `j < r/2` element `j`
//! pairs with `j + r/2`; elements `r..head_dim` pass through. The angle of pair `j` at position
//! `p` is `f32(p) · inv_freq[j]` (an f32 product, as transformers' f32 matmul gives it).

use crate::config::ConfigJson;
use crate::error::Result;

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

    /// Reads the rope of one layer type from a config.
    ///
    /// `params` is the dotted path of the rope object (`rope_parameters`,
    /// `rope_parameters.full_attention`, or `rope_scaling` for the transformers 4 spelling);
    /// `theta_fallback` is where to find θ when the object has no `rope_theta` (the transformers
    /// 4 top-level `rope_theta`).
    pub fn from_config(
        cfg: &ConfigJson,
        params: Option<&str>,
        theta_fallback: &str,
        head_dim: usize,
        max_position_embeddings: usize,
    ) -> Result<Self> {
        let key = |k: &str| match params {
            Some(p) => format!("{p}.{k}"),
            None => k.to_owned(),
        };
        let theta = match params.map(|_| key("rope_theta")) {
            Some(k) if cfg.has(&k) => cfg.f64(&k)?,
            _ => cfg.f64(theta_fallback)?,
        };
        let partial = match params {
            Some(_) => cfg.opt_f64(&key("partial_rotary_factor"))?,
            None => None,
        }
        .or(cfg.opt_f64("partial_rotary_factor")?)
        .unwrap_or(1.0);
        let dim = (head_dim as f64 * partial) as usize;
        if dim == 0 || !dim.is_multiple_of(2) || dim > head_dim {
            return Err(cfg.error(
                &key("partial_rotary_factor"),
                format!(
                    "gives rotary width {dim} for head_dim {head_dim} (must be even, 2..=head_dim)"
                ),
            ));
        }
        let rope_type = match params {
            Some(_) => cfg
                .opt_str(&key("rope_type"))?
                .or(cfg.opt_str(&key("type"))?)
                .unwrap_or("default"),
            None => "default",
        };
        let base = default_inv_freq(theta, dim);
        match rope_type {
            "default" => Ok(Self {
                inv_freq: base,
                rotary_dim: dim,
                attention_factor: 1.0,
            }),
            "linear" => {
                let factor = cfg.f64(&key("factor"))? as f32;
                Ok(Self {
                    inv_freq: base.iter().map(|f| f / factor).collect(),
                    rotary_dim: dim,
                    attention_factor: 1.0,
                })
            }
            "llama3" => {
                let factor = cfg.f64(&key("factor"))?;
                let low = cfg.f64(&key("low_freq_factor"))?;
                let high = cfg.f64(&key("high_freq_factor"))?;
                let old = cfg.f64(&key("original_max_position_embeddings"))?;
                Ok(Self {
                    inv_freq: llama3_inv_freq(&base, factor, low, high, old),
                    rotary_dim: dim,
                    attention_factor: 1.0,
                })
            }
            "yarn" => {
                let orig = cfg.f64(&key("original_max_position_embeddings"))?;
                let factor = match cfg.opt_f64(&key("factor"))? {
                    Some(f) => f,
                    None => max_position_embeddings as f64 / orig,
                };
                let attention_factor = match cfg.opt_f64(&key("attention_factor"))? {
                    Some(a) => a,
                    None => {
                        let mscale = cfg.opt_f64(&key("mscale"))?;
                        let mscale_all = cfg.opt_f64(&key("mscale_all_dim"))?;
                        match (mscale, mscale_all) {
                            (Some(m), Some(a)) if m != 0.0 && a != 0.0 => {
                                yarn_mscale(factor, m) / yarn_mscale(factor, a)
                            }
                            _ => yarn_mscale(factor, 1.0),
                        }
                    }
                };
                let beta_fast = cfg
                    .opt_f64(&key("beta_fast"))?
                    .filter(|b| *b != 0.0)
                    .unwrap_or(32.0);
                let beta_slow = cfg
                    .opt_f64(&key("beta_slow"))?
                    .filter(|b| *b != 0.0)
                    .unwrap_or(1.0);
                let truncate = cfg.opt_bool(&key("truncate"))?.unwrap_or(true);
                Ok(Self {
                    inv_freq: yarn_inv_freq(
                        theta, dim, factor, orig, beta_fast, beta_slow, truncate,
                    ),
                    rotary_dim: dim,
                    attention_factor: attention_factor as f32,
                })
            }
            other => Err(cfg.error(
                &key("rope_type"),
                format!("rope type {other:?} is not supported (default, linear, llama3, yarn)"),
            )),
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

/// YaRN's default attention factor `0.1 · m · ln(s) + 1` (1 for `s <= 1`).
fn yarn_mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
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
    use serde_json::{json, Value};
    use std::path::Path;

    fn cfg(v: Value) -> ConfigJson {
        match v {
            Value::Object(m) => ConfigJson::from_map(Path::new("config.json"), m),
            _ => unreachable!(),
        }
    }

    #[test]
    fn laguna_s_yarn_ramp_and_factor() {
        let c = cfg(json!({"rope_parameters": {"full_attention": {
            "rope_type": "yarn", "rope_theta": 500000.0, "factor": 128.0,
            "original_max_position_embeddings": 8192, "beta_fast": 32.0, "beta_slow": 1.0,
            "attention_factor": 1.4852030263919618, "partial_rotary_factor": 0.5
        }}}));
        let r = RopeSpec::from_config(
            &c,
            Some("rope_parameters.full_attention"),
            "rope_theta",
            128,
            1 << 20,
        )
        .unwrap();
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
        let c = cfg(json!({"rope_theta": 100000.0}));
        let r = RopeSpec::from_config(&c, None, "rope_theta", 64, 8192).unwrap();
        assert_eq!(r.rotary_dim, 64);
        assert_eq!(r.inv_freq[0], 1.0);
        assert!((r.inv_freq[1] - 100000f32.powf(-2.0 / 64.0)).abs() < 1e-7);
        let mut cos = Vec::new();
        let mut sin = Vec::new();
        r.cos_sin(3, &mut cos, &mut sin);
        assert!((cos[0] - 3f32.cos()).abs() < 1e-7 && (sin[0] - 3f32.sin()).abs() < 1e-7);
    }

    #[test]
    fn unknown_rope_type_names_the_field() {
        let c = cfg(json!({"rope_parameters": {"rope_type": "weird", "rope_theta": 1.0}}));
        let e = RopeSpec::from_config(&c, Some("rope_parameters"), "rope_theta", 64, 10)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rope_parameters.rope_type"), "{e}");
    }
}
