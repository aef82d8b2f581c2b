//! Built-in Laguna configurations: the real S-2.1 and XS-2.1 geometries (laguna.md §1.1, §1.2)
//! and a tiny model of the same structure for tests.

use std::fmt;
use std::str::FromStr;

use serde_json::{json, Map, Value};

/// A built-in model configuration for `fp4forge synth --preset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Preset {
    /// Laguna's structure at toy size (5 layers: full attention at `i % 4 == 0`, so a full dense
    /// layer 0, three sliding MoE layers and a full MoE layer; hidden 64, head_dim 16, 2 KV heads,
    /// 4 query heads on full / 6 on sliding layers, 8 experts top-2 of width 32, shared expert 32,
    /// dense MLP 128, vocab 512, window 16). Under 1 MB.
    Tiny,
    /// Laguna-XS-2.1: 33.4 B parameters, 40 layers, hidden 2048, 256 experts top-8.
    Xs,
    /// Laguna-S-2.1: 117.6 B parameters, 48 layers, hidden 3072, 256 experts top-10.
    S,
}

/// The numbers that tell the presets apart.
struct Shape {
    hidden: usize,
    layers: usize,
    heads_full: usize,
    heads_sliding: usize,
    kv_heads: usize,
    head_dim: usize,
    experts: usize,
    top_k: usize,
    moe_intermediate: usize,
    shared_intermediate: usize,
    dense_intermediate: usize,
    vocab: usize,
    window: usize,
    max_position_embeddings: usize,
    yarn_factor: f64,
    yarn_original_max: usize,
    yarn_beta_fast: f64,
    yarn_attention_factor: f64,
}

impl Preset {
    /// Every preset, smallest first.
    pub const ALL: [Preset; 3] = [Preset::Tiny, Preset::Xs, Preset::S];

    /// The preset's name on the command line: `tiny`, `xs`, `s`.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Tiny => "tiny",
            Preset::Xs => "xs",
            Preset::S => "s",
        }
    }

    fn shape(self) -> Shape {
        match self {
            Preset::Tiny => Shape {
                hidden: 64,
                layers: 5,
                heads_full: 4,
                heads_sliding: 6,
                kv_heads: 2,
                head_dim: 16,
                experts: 8,
                top_k: 2,
                moe_intermediate: 32,
                shared_intermediate: 32,
                dense_intermediate: 128,
                vocab: 512,
                window: 16,
                max_position_embeddings: 4096,
                yarn_factor: 32.0,
                yarn_original_max: 128,
                yarn_beta_fast: 32.0,
                yarn_attention_factor: 1.346_573_590_279_972_7,
            },
            Preset::Xs => Shape {
                hidden: 2048,
                layers: 40,
                heads_full: 48,
                heads_sliding: 64,
                kv_heads: 8,
                head_dim: 128,
                experts: 256,
                top_k: 8,
                moe_intermediate: 512,
                shared_intermediate: 512,
                dense_intermediate: 8192,
                vocab: 100_352,
                window: 512,
                max_position_embeddings: 262_144,
                yarn_factor: 32.0,
                yarn_original_max: 8192,
                yarn_beta_fast: 64.0,
                yarn_attention_factor: 1.346_573_590_279_972_7,
            },
            Preset::S => Shape {
                hidden: 3072,
                layers: 48,
                heads_full: 48,
                heads_sliding: 72,
                kv_heads: 8,
                head_dim: 128,
                experts: 256,
                top_k: 10,
                moe_intermediate: 1024,
                shared_intermediate: 1024,
                dense_intermediate: 12288,
                vocab: 100_352,
                window: 512,
                max_position_embeddings: 1_048_576,
                yarn_factor: 128.0,
                yarn_original_max: 8192,
                yarn_beta_fast: 32.0,
                yarn_attention_factor: 1.485_203_026_391_961_8,
            },
        }
    }

    /// The preset's complete `config.json` (bf16, no `quantization_config`), with the keys and
    /// key order of the real Laguna-S-2.1 release: `architectures`, `model_type`, then the rest
    /// sorted. Full attention at layers `i % 4 == 0` (YaRN, partial rotary 0.5), sliding
    /// elsewhere (plain RoPE θ 10000); layer 0 dense, the rest MoE; per-head softplus gating.
    pub fn config(self) -> Map<String, Value> {
        let s = self.shape();
        let full = |i: usize| i.is_multiple_of(4);
        let layer_types: Vec<&str> = (0..s.layers)
            .map(|i| {
                if full(i) {
                    "full_attention"
                } else {
                    "sliding_attention"
                }
            })
            .collect();
        let heads: Vec<usize> = (0..s.layers)
            .map(|i| {
                if full(i) {
                    s.heads_full
                } else {
                    s.heads_sliding
                }
            })
            .collect();
        let mlp_types: Vec<&str> = (0..s.layers)
            .map(|i| if i == 0 { "dense" } else { "sparse" })
            .collect();
        let config = json!({
            "architectures": ["LagunaForCausalLM"],
            "model_type": "laguna",
            "attention_bias": false,
            "bos_token_id": 2,
            "decoder_sparse_step": 1,
            "eos_token_id": [2, 24],
            "gating": "per-head",
            "gating_types": vec!["per_head"; s.layers],
            "head_dim": s.head_dim,
            "hidden_act": "silu",
            "hidden_size": s.hidden,
            "intermediate_size": s.dense_intermediate,
            "layer_types": layer_types,
            "max_position_embeddings": s.max_position_embeddings,
            "mlp_layer_types": mlp_types,
            "mlp_only_layers": [0],
            "moe_apply_router_weight_on_input": false,
            "moe_intermediate_size": s.moe_intermediate,
            "moe_routed_scaling_factor": 2.5,
            "moe_router_logit_softcapping": 0.0,
            "norm_topk_prob": true,
            "num_attention_heads": s.heads_full,
            "num_attention_heads_per_layer": heads,
            "num_experts": s.experts,
            "num_experts_per_tok": s.top_k,
            "num_hidden_layers": s.layers,
            "num_key_value_heads": s.kv_heads,
            "pad_token_id": 9,
            "qkv_bias": false,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {
                "full_attention": {
                    "rope_type": "yarn",
                    "rope_theta": 500000.0,
                    "factor": s.yarn_factor,
                    "original_max_position_embeddings": s.yarn_original_max,
                    "beta_fast": s.yarn_beta_fast,
                    "beta_slow": 1.0,
                    "attention_factor": s.yarn_attention_factor,
                    "partial_rotary_factor": 0.5
                },
                "sliding_attention": {
                    "rope_type": "default",
                    "rope_theta": 10000.0,
                    "partial_rotary_factor": 1.0
                }
            },
            "rope_theta": 500000.0,
            "shared_expert_intermediate_size": s.shared_intermediate,
            "sliding_window": s.window,
            "swa_attention_sink_enabled": false,
            "tie_word_embeddings": false,
            "torch_dtype": "bfloat16",
            "use_cache": true,
            "vocab_size": s.vocab
        });
        match config {
            Value::Object(map) => map,
            _ => unreachable!("a JSON object literal"),
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Preset {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Preset::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown preset {s:?} (expected tiny, xs or s)"))
    }
}
