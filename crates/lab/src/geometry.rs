//! The shapes of a Laguna `config.json` that the decode benchmark and the stream probe lay out,
//! read through `fp4forge-arch` (the one reader of model geometry), plus which modules the
//! checkpoint's `quantization_config` makes NVFP4 (the stock or lean build).

use std::path::Path;

use fp4forge_arch::{ArchSpec, ConfigJson, MlpSpec, Rope};
use serde_json::{Map, Value};

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
    /// The rope of the full-attention layers.
    pub rope_full: Rope,
    /// The rope of the sliding layers.
    pub rope_sliding: Rope,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Multiplier of the routed experts' sum.
    pub routed_scale: f32,
}

/// Reads the [`Geometry`] of the Laguna `config.json` at `config`; errors name the file.
pub fn read_geometry(config: &Path) -> Result<Geometry, String> {
    let at = |e: String| format!("{}: {e}", config.display());
    let text = std::fs::read_to_string(config).map_err(|e| at(e.to_string()))?;
    let cfg: Map<String, Value> = serde_json::from_str(&text).map_err(|e| at(e.to_string()))?;
    geometry(config, cfg)
}

/// Reads the [`Geometry`] of a Laguna `config.json` (`file` names it in errors).
pub fn geometry(file: &Path, cfg: Map<String, Value>) -> Result<Geometry, String> {
    let at = |e: String| format!("{}: {e}", file.display());
    let targets: Vec<String> = cfg
        .get("quantization_config")
        .and_then(|q| q.get("config_groups"))
        .and_then(Value::as_object)
        .map(|g| {
            g.values()
                .filter_map(|v| v.get("targets").and_then(Value::as_array))
                .flatten()
                .filter_map(|t| t.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let spec =
        ArchSpec::from_config(&ConfigJson::from_map(file, cfg)).map_err(|e| e.to_string())?;
    let first = spec.layers.first().ok_or_else(|| at("no layers".into()))?;
    let moe = spec
        .first_moe()
        .ok_or_else(|| at("no mixture-of-experts layer".into()))?;
    let dense_inter = spec
        .layers
        .iter()
        .find_map(|l| match l.mlp {
            MlpSpec::Dense { intermediate } => Some(intermediate),
            MlpSpec::Moe(_) => None,
        })
        .unwrap_or(0);
    let sliding = spec.layers.iter().find(|l| l.attention.window.is_some());
    let full = spec.layers.iter().find(|l| l.attention.window.is_none());
    let rope_of = |l: Option<&fp4forge_arch::LayerSpec>| {
        spec.ropes[l.unwrap_or(first).attention.rope].clone()
    };
    Ok(Geometry {
        hidden: spec.hidden_size,
        layers: spec.layers.len(),
        full: spec
            .layers
            .iter()
            .map(|l| l.attention.window.is_none())
            .collect(),
        heads: spec.layers.iter().map(|l| l.attention.q_heads).collect(),
        kv_heads: first.attention.kv_heads,
        head_dim: first.attention.head_dim,
        window: sliding.and_then(|l| l.attention.window).unwrap_or(0),
        experts: moe.experts,
        top_k: moe.router.top_k,
        moe_inter: moe.intermediate,
        shared_inter: moe.shared_intermediate.unwrap_or(0),
        dense_inter,
        dense_layers: spec
            .layers
            .iter()
            .map(|l| matches!(l.mlp, MlpSpec::Dense { .. }))
            .collect(),
        vocab: spec.vocab_size,
        attn_nvfp4: targets.iter().any(|t| t.contains("self_attn")),
        experts_nvfp4: targets.iter().any(|t| t.contains("experts")),
        rope_full: rope_of(full),
        rope_sliding: rope_of(sliding),
        eps: spec.rms_norm_eps as f32,
        routed_scale: moe.router.routed_scaling as f32,
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
