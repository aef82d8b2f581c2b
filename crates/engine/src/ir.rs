//! The network as it is loaded: what a model family builds and every backend runs.
//!
//! A [`Decoder`] holds resident weights (the backend's own associated types) and per-layer
//! geometry; nothing here reads a file or runs an op. Model families (`models`) fill it from a
//! checkpoint, [`crate::forward()`] runs it over a batch of sequences' chunks, and a backend may
//! recognise a whole pass it can fuse ([`crate::Backend::fused_pass`]). Backends import this
//! module, never `models`; the op parameters ([`AttentionParams`], [`RouterParams`]) live here so
//! that both sides name them from one place.

use crate::backend::Backend;
pub use crate::kv_cache::{KvDtype, KvLayerSpec};

/// Attention geometry of one call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (`heads` is a multiple of it: grouped-query attention).
    pub kv_heads: usize,
    /// Width of each head.
    pub head_dim: usize,
    /// Multiplier of `q · k` before the softmax (usually `1/sqrt(head_dim)`).
    pub scale: f32,
}

/// How a mixture-of-experts router turns logits into expert weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouterParams {
    /// Experts per token.
    pub top_k: usize,
    /// `sigmoid` (Laguna, DeepSeek-V3 style) or `softmax` scores.
    pub scoring: RouterScoring,
    /// Whether the selected scores are renormalised to sum to 1 (`norm_topk_prob`).
    pub normalize: bool,
    /// Logit soft-capping `tanh(l / c) · c` before scoring; 0 disables it.
    pub logit_softcap: f32,
}

/// The router's score function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterScoring {
    /// `sigmoid(logit)` per expert.
    Sigmoid,
    /// `softmax(logits)` over experts.
    Softmax,
}

/// A loaded decoder-only transformer: resident weights and per-layer geometry.
pub struct Decoder<B: Backend> {
    /// The input embedding `[vocab, hidden]`.
    pub embed: B::Linear,
    /// The output projection; `None` when tied to [`embed`](Self::embed).
    pub lm_head: Option<B::Linear>,
    /// The final RMSNorm's weight `[1, hidden]`.
    pub norm: B::Tensor,
    /// RMSNorm epsilon (every norm of the model).
    pub eps: f32,
    /// Residual stream width.
    pub hidden: usize,
    /// The decoder layers, in order.
    pub layers: Vec<Layer<B>>,
    /// Rotary tables, one per distinct rope of the model ([`Attention::rope`] indexes it).
    pub ropes: Vec<B::Rope>,
}

/// One pre-norm residual block: `x += attn(norm(x)); x += mlp(post_norm(x))`.
pub struct Layer<B: Backend> {
    /// RMSNorm weight before attention `[1, hidden]`.
    pub input_norm: B::Tensor,
    /// RMSNorm weight before the MLP `[1, hidden]`.
    pub post_norm: B::Tensor,
    /// The attention block.
    pub attn: Attention<B>,
    /// The MLP block.
    pub mlp: Mlp<B>,
}

/// Grouped-query attention with optional biases, q/k norms and a softplus output gate.
pub struct Attention<B: Backend> {
    /// Query projection `[heads·d, hidden]`.
    pub q: B::Linear,
    /// Key projection `[kv_heads·d, hidden]`.
    pub k: B::Linear,
    /// Value projection `[kv_heads·d, hidden]`.
    pub v: B::Linear,
    /// Output projection `[hidden, heads·d]`.
    pub o: B::Linear,
    /// Query bias `[1, heads·d]`, if any.
    pub q_bias: Option<B::Tensor>,
    /// Key bias, if any.
    pub k_bias: Option<B::Tensor>,
    /// Value bias, if any.
    pub v_bias: Option<B::Tensor>,
    /// Output bias, if any.
    pub o_bias: Option<B::Tensor>,
    /// Per-head query RMSNorm weight `[1, d]`, if any (applied before rope).
    pub q_norm: Option<B::Tensor>,
    /// Per-head key RMSNorm weight `[1, d]`, if any (applied before rope).
    pub k_norm: Option<B::Tensor>,
    /// Softplus output gate (`g_proj`): one scalar per head (or per element).
    pub gate: Option<B::Linear>,
    /// Index into [`Decoder::ropes`].
    pub rope: usize,
    /// Head counts, width and score scale.
    pub params: AttentionParams,
    /// The layer's KV cache layout.
    pub kv: KvLayerSpec,
}

/// A SwiGLU MLP: `down(silu(gate x) ⊙ up x)`.
pub struct SwiGlu<B: Backend> {
    /// Gate projection `[inter, hidden]`.
    pub gate: B::Linear,
    /// Up projection `[inter, hidden]`.
    pub up: B::Linear,
    /// Down projection `[hidden, inter]`.
    pub down: B::Linear,
}

/// A routed mixture of SwiGLU experts, with an optional always-on shared expert.
pub struct Moe<B: Backend> {
    /// Router `[experts, hidden]`.
    pub router: B::Linear,
    /// Bias added to the scores for selection only (`e_score_correction_bias`), if any.
    pub selection_bias: Option<B::Tensor>,
    /// The routed experts.
    pub experts: B::Experts,
    /// The shared expert, if any.
    pub shared: Option<SwiGlu<B>>,
    /// Top-k, scoring, renormalisation, soft-cap.
    pub params: RouterParams,
    /// Multiplier of the routed experts' weighted sum.
    pub routed_scale: f32,
}

/// The MLP of one layer.
pub enum Mlp<B: Backend> {
    /// A dense SwiGLU.
    Dense(SwiGlu<B>),
    /// A mixture of experts.
    Moe(Moe<B>),
}
