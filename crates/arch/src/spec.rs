//! The typed geometry of a decoder-only model: [`ArchSpec`] and the per-layer specs it holds.

use std::path::PathBuf;

use crate::family::Family;
use crate::rope::Rope;

/// Whether a family's checkpoints carry a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Always there: a checkpoint without it is an error.
    Required,
    /// Taken when the checkpoint has it (the family's configs do not say).
    Optional,
    /// Never part of the model.
    Absent,
}

/// The attention of one layer.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionSpec {
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads (`q_heads` is a multiple).
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// `Some(w)`: sliding window of `w` keys (the query's own included); `None`: full attention.
    pub window: Option<usize>,
    /// Index into [`ArchSpec::ropes`].
    pub rope: usize,
    /// Per-head RMSNorm of q and k before the rotation (`q_norm`, `k_norm`).
    pub qk_norm: Presence,
    /// Biases of q/k/v/o (`{q,k,v,o}_proj.bias`).
    pub bias: Presence,
    /// Softplus output gate (`g_proj`) on the attention output.
    pub output_gate: OutputGate,
}

/// The softplus output gate of an attention layer (`self_attn.g_proj`), as the config states it.
/// Configs do not state it reliably (laguna.md §1): a loader of real weights tells the width by
/// the tensor's shape; the stated width is what a checkpoint made from the config gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputGate {
    /// No gate.
    Absent,
    /// One scalar per query head (`g_proj` rows = q heads).
    PerHead,
    /// One scalar per element (`g_proj` rows = q heads · head_dim).
    PerElement,
    /// The config turns it off; a `g_proj` the checkpoint has anyway is used.
    IfPresent,
}

impl AttentionSpec {
    /// `q_heads · head_dim`.
    pub fn q_dim(&self) -> usize {
        self.q_heads * self.head_dim
    }

    /// `kv_heads · head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Rows of `g_proj` the config states (`None`: no gate stated).
    pub fn gate_rows(&self) -> Option<usize> {
        match self.output_gate {
            OutputGate::PerHead => Some(self.q_heads),
            OutputGate::PerElement => Some(self.q_dim()),
            OutputGate::Absent | OutputGate::IfPresent => None,
        }
    }
}

/// How router logits become expert weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterScoring {
    /// Softmax over all experts, top-k of the probabilities (Qwen-MoE, Mixtral).
    Softmax,
    /// Independent sigmoid per expert (Laguna, DeepSeek-V3).
    Sigmoid,
}

/// The router of a MoE layer.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterSpec {
    /// Scoring function.
    pub scoring: RouterScoring,
    /// Experts per token.
    pub top_k: usize,
    /// Whether the top-k weights are renormalised to sum to 1 (`norm_topk_prob`).
    pub normalize: bool,
    /// A per-expert bias added to the scores for selection only (`e_score_correction_bias`).
    pub selection_bias: Presence,
    /// Factor on the routed experts' sum (`moe_routed_scaling_factor`; 1 when none).
    pub routed_scaling: f64,
    /// `c·tanh(logit/c)` before scoring when `> 0`.
    pub logit_softcap: f64,
}

/// A mixture-of-experts MLP.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeSpec {
    /// Routed experts.
    pub experts: usize,
    /// Intermediate size of one routed expert.
    pub intermediate: usize,
    /// Intermediate size of the always-on shared expert, if there is one.
    pub shared_intermediate: Option<usize>,
    /// The router.
    pub router: RouterSpec,
}

/// The MLP of one layer.
#[derive(Debug, Clone, PartialEq)]
pub enum MlpSpec {
    /// A dense SwiGLU of this intermediate size.
    Dense {
        /// Intermediate size.
        intermediate: usize,
    },
    /// A routed mixture of SwiGLU experts.
    Moe(MoeSpec),
}

/// One decoder layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerSpec {
    /// Its attention.
    pub attention: AttentionSpec,
    /// Its MLP.
    pub mlp: MlpSpec,
}

/// The accepted spellings of tensors whose name varies between checkpoints of one family,
/// relative to a layer's prefix (`model.layers.N.`), in order of preference.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TensorAliases {
    /// Module prefixes of the shared expert (`mlp.shared_expert`, `mlp.shared_experts`).
    pub shared_expert: Vec<&'static str>,
    /// Names of the router's selection bias (`mlp.gate.e_score_correction_bias`, ...).
    pub selection_bias: Vec<&'static str>,
    /// Module names of the shared expert's sigmoid gate (`mlp.shared_expert_gate`, Qwen2-MoE).
    pub shared_expert_gate: Vec<&'static str>,
}

/// Whether `lm_head` is the embedding matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tied {
    /// Tied: no `lm_head` tensor.
    Yes,
    /// Untied: `lm_head.weight` is stored.
    No,
    /// The config does not say; tied exactly when the checkpoint has no `lm_head`.
    IfNoLmHead,
}

/// A model's geometry, read once from its `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchSpec {
    /// The `config.json` it was read from (errors name it).
    pub file: PathBuf,
    /// `architectures[0]`.
    pub architecture: String,
    /// The family that read it.
    pub family: Family,
    /// Residual stream width.
    pub hidden_size: usize,
    /// Vocabulary rows of the embedding and of the logits.
    pub vocab_size: usize,
    /// ε of every RMSNorm (`rms_norm_eps`).
    pub rms_norm_eps: f64,
    /// Longest sequence (`max_position_embeddings`).
    pub max_position_embeddings: usize,
    /// Whether `lm_head` is the embedding.
    pub tie_word_embeddings: Tied,
    /// The rotary embeddings, one per layer type (layers index them).
    pub ropes: Vec<Rope>,
    /// The decoder layers, in order.
    pub layers: Vec<LayerSpec>,
    /// Accepted tensor-name spellings.
    pub aliases: TensorAliases,
}

impl ArchSpec {
    /// The MoE spec of the first MoE layer, if any layer routes.
    pub fn first_moe(&self) -> Option<&MoeSpec> {
        self.layers.iter().find_map(|l| match &l.mlp {
            MlpSpec::Moe(m) => Some(m),
            MlpSpec::Dense { .. } => None,
        })
    }
}
