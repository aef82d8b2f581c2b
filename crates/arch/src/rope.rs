//! Rotary position embeddings as a config states them: θ, the rotary width (partial rotary
//! factor) and the frequency scaling (default, linear, llama3, yarn), with every default taken
//! where transformers' rope initialisation takes it. The inverse frequencies themselves are
//! arithmetic and belong to whoever builds the tables (the engine's `RopeSpec`).

use crate::fields::ConfigJson;
use crate::Result;

/// One rotary embedding, as read.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    /// Base θ.
    pub theta: f64,
    /// Width of the rotated slice of each head (even, `2..=head_dim`).
    pub rotary_dim: usize,
    /// How the frequencies are scaled.
    pub scaling: RopeScaling,
}

/// Frequency scaling of a [`Rope`] (`rope_type`).
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// `default`: `inv_freq[i] = 1 / θ^(2i/dim)`.
    Default,
    /// `linear`: default frequencies divided by `factor`.
    Linear {
        /// `factor`.
        factor: f64,
    },
    /// `llama3`: low frequencies divided by `factor`, a smooth ramp between the wavelengths.
    Llama3 {
        /// `factor`.
        factor: f64,
        /// `low_freq_factor`.
        low_freq_factor: f64,
        /// `high_freq_factor`.
        high_freq_factor: f64,
        /// `original_max_position_embeddings`.
        original_max_position_embeddings: f64,
    },
    /// `yarn`: NTK-by-parts interpolation plus a factor on cos and sin.
    Yarn {
        /// `factor` (default: `max_position_embeddings / original_max_position_embeddings`).
        factor: f64,
        /// `original_max_position_embeddings`.
        original_max_position_embeddings: f64,
        /// `attention_factor`, else from `mscale`/`mscale_all_dim`, else `0.1·ln(factor) + 1`.
        attention_factor: f64,
        /// `beta_fast` (default 32; 0 also means the default).
        beta_fast: f64,
        /// `beta_slow` (default 1; 0 also means the default).
        beta_slow: f64,
        /// `truncate` (default true): round the correction range to whole dimensions.
        truncate: bool,
    },
}

impl Rope {
    /// Reads the rope of one layer type from a config.
    ///
    /// `params` is the dotted path of the rope object (`rope_parameters`,
    /// `rope_parameters.full_attention`, or `rope_scaling` for the transformers 4 spelling);
    /// `theta_fallback` is where to find θ when the object has no `rope_theta` (the transformers
    /// 4 top-level `rope_theta`). The partial rotary factor is the object's, else the top-level
    /// one, else 1.
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
        let rotary_dim = (head_dim as f64 * partial) as usize;
        if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) || rotary_dim > head_dim {
            return Err(cfg.error(
                &key("partial_rotary_factor"),
                format!(
                    "gives rotary width {rotary_dim} for head_dim {head_dim} (must be even, \
                     2..=head_dim)"
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
        let scaling = match rope_type {
            "default" => RopeScaling::Default,
            "linear" => RopeScaling::Linear {
                factor: cfg.f64(&key("factor"))?,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: cfg.f64(&key("factor"))?,
                low_freq_factor: cfg.f64(&key("low_freq_factor"))?,
                high_freq_factor: cfg.f64(&key("high_freq_factor"))?,
                original_max_position_embeddings: cfg
                    .f64(&key("original_max_position_embeddings"))?,
            },
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
                RopeScaling::Yarn {
                    factor,
                    original_max_position_embeddings: orig,
                    attention_factor,
                    beta_fast: cfg
                        .opt_f64(&key("beta_fast"))?
                        .filter(|b| *b != 0.0)
                        .unwrap_or(32.0),
                    beta_slow: cfg
                        .opt_f64(&key("beta_slow"))?
                        .filter(|b| *b != 0.0)
                        .unwrap_or(1.0),
                    truncate: cfg.opt_bool(&key("truncate"))?.unwrap_or(true),
                }
            }
            other => {
                return Err(cfg.error(
                    &key("rope_type"),
                    format!("rope type {other:?} is not supported (default, linear, llama3, yarn)"),
                ))
            }
        };
        Ok(Self {
            theta,
            rotary_dim,
            scaling,
        })
    }

    /// The factor on cos and sin (YaRN's attention factor; 1 otherwise).
    pub fn attention_factor(&self) -> f64 {
        match self.scaling {
            RopeScaling::Yarn {
                attention_factor, ..
            } => attention_factor,
            _ => 1.0,
        }
    }
}

/// YaRN's default attention factor `0.1 · m · ln(s) + 1` (1 for `s <= 1`).
fn yarn_mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
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
    fn laguna_s_yarn() {
        let c = cfg(json!({"rope_parameters": {"full_attention": {
            "rope_type": "yarn", "rope_theta": 500000.0, "factor": 128.0,
            "original_max_position_embeddings": 8192, "beta_fast": 32.0, "beta_slow": 1.0,
            "attention_factor": 1.4852030263919618, "partial_rotary_factor": 0.5
        }}}));
        let r = Rope::from_config(
            &c,
            Some("rope_parameters.full_attention"),
            "rope_theta",
            128,
            1 << 20,
        )
        .unwrap();
        assert_eq!(r.rotary_dim, 64);
        assert_eq!(r.theta, 500000.0);
        assert!((r.attention_factor() - 1.485_203_026).abs() < 1e-9);
    }

    #[test]
    fn yarn_defaults_follow_transformers() {
        let c = cfg(json!({"rope_theta": 10000.0, "rope_scaling": {
            "rope_type": "yarn", "original_max_position_embeddings": 1024
        }}));
        let r = Rope::from_config(&c, Some("rope_scaling"), "rope_theta", 64, 4096).unwrap();
        let RopeScaling::Yarn {
            factor,
            attention_factor,
            beta_fast,
            beta_slow,
            truncate,
            ..
        } = r.scaling
        else {
            panic!("{r:?}")
        };
        assert_eq!(
            (factor, beta_fast, beta_slow, truncate),
            (4.0, 32.0, 1.0, true)
        );
        assert!((attention_factor - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-12);
    }

    #[test]
    fn unknown_rope_type_names_the_field() {
        let c = cfg(json!({"rope_parameters": {"rope_type": "weird", "rope_theta": 1.0}}));
        let e = Rope::from_config(&c, Some("rope_parameters"), "rope_theta", 64, 10)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rope_parameters.rope_type"), "{e}");
    }
}
