//! GGUF tensor names (llama.cpp's `LLM_TENSOR_NAMES`) to transformers' Llama/Qwen2 names.
//!
//! ```text
//! token_embd.weight          model.embed_tokens.weight
//! output_norm.weight         model.norm.weight
//! output.weight              lm_head.weight            (absent: tied embeddings)
//! blk.N.attn_norm.weight     model.layers.N.input_layernorm.weight
//! blk.N.attn_{q,k,v}.*       model.layers.N.self_attn.{q,k,v}_proj.*   (weight, bias)
//! blk.N.attn_output.*        model.layers.N.self_attn.o_proj.*
//! blk.N.ffn_norm.weight      model.layers.N.post_attention_layernorm.weight
//! blk.N.ffn_{gate,up,down}.* model.layers.N.mlp.{gate,up,down}_proj.*
//! ```

/// What a GGUF tensor is, in HF terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mapped {
    /// The HF tensor name.
    pub hf: String,
    /// The layer, for per-layer tensors.
    pub layer: Option<usize>,
    /// The HF module leaf (`q_proj`, `input_layernorm`, `embed_tokens`, ...).
    pub leaf: &'static str,
    /// `weight` or `bias`.
    pub kind: &'static str,
}

const LAYER_LEAVES: [(&str, &str, &str); 9] = [
    ("attn_norm", "input_layernorm", ""),
    ("attn_q", "q_proj", "self_attn."),
    ("attn_k", "k_proj", "self_attn."),
    ("attn_v", "v_proj", "self_attn."),
    ("attn_output", "o_proj", "self_attn."),
    ("ffn_norm", "post_attention_layernorm", ""),
    ("ffn_gate", "gate_proj", "mlp."),
    ("ffn_up", "up_proj", "mlp."),
    ("ffn_down", "down_proj", "mlp."),
];

/// The HF name of a GGUF tensor; `None` for names this importer does not know.
pub(crate) fn map_name(gguf: &str) -> Option<Mapped> {
    let (stem, kind) = match gguf.rsplit_once('.')? {
        (stem, "weight") => (stem, "weight"),
        (stem, "bias") => (stem, "bias"),
        _ => return None,
    };
    let top = |hf: &str, leaf| {
        Some(Mapped {
            hf: format!("{hf}.{kind}"),
            layer: None,
            leaf,
            kind,
        })
    };
    match stem {
        "token_embd" if kind == "weight" => return top("model.embed_tokens", "embed_tokens"),
        "output_norm" if kind == "weight" => return top("model.norm", "norm"),
        "output" if kind == "weight" => return top("lm_head", "lm_head"),
        _ => {}
    }
    let rest = stem.strip_prefix("blk.")?;
    let (layer, leaf) = rest.split_once('.')?;
    if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) || layer.len() > 6 {
        return None;
    }
    let n: usize = layer.parse().ok()?;
    let &(_, hf_leaf, parent) = LAYER_LEAVES.iter().find(|(g, _, _)| *g == leaf)?;
    if kind == "bias" && parent.is_empty() {
        return None; // norms have no bias in Llama/Qwen2
    }
    Some(Mapped {
        hf: format!("model.layers.{n}.{parent}{hf_leaf}.{kind}"),
        layer: Some(n),
        leaf: hf_leaf,
        kind,
    })
}

/// The GGUF leaves every layer must have.
pub(crate) fn required_layer_weights() -> impl Iterator<Item = &'static str> {
    LAYER_LEAVES.iter().map(|(g, _, _)| *g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_assets_md() {
        let hf = |g: &str| map_name(g).map(|m| m.hf);
        assert_eq!(
            hf("token_embd.weight").unwrap(),
            "model.embed_tokens.weight"
        );
        assert_eq!(hf("output_norm.weight").unwrap(), "model.norm.weight");
        assert_eq!(hf("output.weight").unwrap(), "lm_head.weight");
        assert_eq!(
            hf("blk.0.attn_q.weight").unwrap(),
            "model.layers.0.self_attn.q_proj.weight"
        );
        assert_eq!(
            hf("blk.29.attn_output.weight").unwrap(),
            "model.layers.29.self_attn.o_proj.weight"
        );
        assert_eq!(
            hf("blk.3.attn_k.bias").unwrap(),
            "model.layers.3.self_attn.k_proj.bias"
        );
        assert_eq!(
            hf("blk.1.ffn_down.weight").unwrap(),
            "model.layers.1.mlp.down_proj.weight"
        );
        assert_eq!(
            hf("blk.1.attn_norm.weight").unwrap(),
            "model.layers.1.input_layernorm.weight"
        );
        assert_eq!(
            hf("blk.1.ffn_norm.weight").unwrap(),
            "model.layers.1.post_attention_layernorm.weight"
        );
        for bad in [
            "rope_freqs.weight",
            "blk.x.attn_q.weight",
            "blk.1.attn_norm.bias",
            "blk.1.ffn_gate_exps.weight",
            "blk..attn_q.weight",
            "token_embd.scale",
            "blk.-1.attn_q.weight",
        ] {
            assert_eq!(map_name(bad), None, "{bad}");
        }
    }
}
