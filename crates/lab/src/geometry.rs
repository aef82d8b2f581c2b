//! The shapes of a Laguna `config.json` that the decode benchmark and the stream probe lay out.
//!
//! (To be ported to `crates/arch`'s `ArchSpec` reader once it lands.)

use std::path::Path;

use serde_json::Value;

/// The shapes of a Laguna config that the benchmark and the stream probe lay out.
#[derive(Debug, Clone)]
pub struct Geometry {
    /// Residual stream width.
    pub hidden: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Per layer: full attention (else sliding).
    pub full: Vec<bool>,
    /// Per layer: query heads.
    pub heads: Vec<usize>,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of each head.
    pub head_dim: usize,
    /// Sliding window (positions).
    pub window: usize,
    /// Routed experts per MoE layer.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// A routed expert's intermediate width.
    pub moe_inter: usize,
    /// The shared expert's intermediate width.
    pub shared_inter: usize,
    /// The dense MLP's intermediate width.
    pub dense_inter: usize,
    /// Per layer: a dense MLP (else MoE).
    pub dense_layers: Vec<bool>,
    /// Vocabulary size.
    pub vocab: usize,
    /// q/k/v/o are NVFP4 (the lean build; else bf16).
    pub attn_nvfp4: bool,
    /// The routed experts are NVFP4.
    pub experts_nvfp4: bool,
    /// Rope theta of the full-attention layers.
    pub theta_full: f64,
    /// Rope theta of the sliding layers.
    pub theta_sliding: f64,
    /// Rotated fraction of a full-attention head.
    pub partial_full: f64,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Multiplier of the routed experts' sum.
    pub routed_scale: f32,
}

/// Reads the [`Geometry`] of the Laguna `config.json` at `config`; errors name the file.
pub fn read_geometry(config: &Path) -> Result<Geometry, String> {
    let at = |e: String| format!("{}: {e}", config.display());
    let text = std::fs::read_to_string(config).map_err(|e| at(e.to_string()))?;
    let cfg: Value = serde_json::from_str(&text).map_err(|e| at(e.to_string()))?;
    geometry(&cfg).map_err(at)
}

/// Reads the [`Geometry`] of a Laguna `config.json`.
pub fn geometry(cfg: &Value) -> Result<Geometry, String> {
    let u = |k: &str| {
        cfg.get(k)
            .and_then(Value::as_u64)
            .map(|v| v as usize)
            .ok_or(format!("config: no `{k}`"))
    };
    let layers = u("num_hidden_layers")?;
    // A per-layer list of strings (empty when absent).
    let strs = |k: &str| -> Vec<String> {
        cfg.get(k)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let types = strs("layer_types");
    let full: Vec<bool> = (0..layers)
        .map(|i| !matches!(types.get(i), Some(t) if t != "full_attention"))
        .collect();
    let heads: Vec<usize> = match cfg
        .get("num_attention_heads_per_layer")
        .and_then(Value::as_array)
    {
        Some(a) => a.iter().map(|v| v.as_u64().unwrap_or(0) as usize).collect(),
        None => vec![u("num_attention_heads")?; layers],
    };
    let mlp_types = strs("mlp_layer_types");
    let dense_layers = (0..layers)
        .map(|i| mlp_types.get(i).is_some_and(|t| t == "dense"))
        .collect();
    let targets: Vec<String> = cfg
        .pointer("/quantization_config/config_groups")
        .and_then(Value::as_object)
        .map(|g| {
            g.values()
                .filter_map(|v| v.get("targets").and_then(Value::as_array))
                .flatten()
                .filter_map(|t| t.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let rp = |path: &str| cfg.pointer(path).and_then(Value::as_f64);
    Ok(Geometry {
        hidden: u("hidden_size")?,
        layers,
        full,
        heads,
        kv_heads: u("num_key_value_heads")?,
        head_dim: u("head_dim")?,
        window: u("sliding_window")?,
        experts: u("num_experts")?,
        top_k: u("num_experts_per_tok")?,
        moe_inter: u("moe_intermediate_size")?,
        shared_inter: u("shared_expert_intermediate_size")?,
        dense_inter: u("intermediate_size")?,
        dense_layers,
        vocab: u("vocab_size")?,
        attn_nvfp4: targets.iter().any(|t| t.contains("self_attn")),
        experts_nvfp4: targets.iter().any(|t| t.contains("experts")),
        theta_full: rp("/rope_parameters/full_attention/rope_theta").unwrap_or(500000.0),
        theta_sliding: rp("/rope_parameters/sliding_attention/rope_theta").unwrap_or(10000.0),
        partial_full: rp("/rope_parameters/full_attention/partial_rotary_factor").unwrap_or(1.0),
        eps: cfg
            .get("rms_norm_eps")
            .and_then(Value::as_f64)
            .unwrap_or(1e-6) as f32,
        routed_scale: cfg
            .get("moe_routed_scaling_factor")
            .and_then(Value::as_f64)
            .unwrap_or(1.0) as f32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Laguna-S-2.1 fixtures: 48 layers (12 full attention, one dense MLP), 256 experts of
    /// which 10 per token; the lean build's attention is NVFP4, the stock build's is not.
    #[test]
    fn laguna_s_fixtures_read() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../builder/tests/fixtures");
        for (build, attn_nvfp4) in [("laguna-s-2.1", false), ("laguna-s-2.1-lean", true)] {
            let g = read_geometry(&dir.join(build).join("config.json")).expect("fixture");
            assert_eq!((g.layers, g.hidden, g.head_dim), (48, 3072, 128));
            assert_eq!(g.full.iter().filter(|&&f| f).count(), 12);
            assert_eq!(g.dense_layers.iter().filter(|&&d| d).count(), 1);
            assert_eq!((g.experts, g.top_k, g.window), (256, 10, 512));
            assert_eq!(
                (g.attn_nvfp4, g.experts_nvfp4),
                (attn_nvfp4, true),
                "{build}"
            );
        }
        assert!(read_geometry(Path::new("/nonexistent/config.json"))
            .unwrap_err()
            .contains("/nonexistent/config.json"));
    }
}
