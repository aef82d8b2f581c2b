//! The network as it is loaded: what a model family builds and every backend runs.
//!
//! A [`Decoder`] holds resident weights (the backend's own associated types) and per-layer
//! geometry; nothing here reads a file or runs an op. Model families (`models`) fill it from a
//! checkpoint, [`crate::forward()`] runs it over a batch of sequences' chunks, and a backend may
//! recognise a whole pass it can fuse ([`crate::Backend::fused_pass`]). Backends import this
//! module, never `models`; the op parameters ([`AttentionParams`], [`RouterParams`]) live here so
//! that both sides name them from one place.

/// The objects a backend keeps resident, each in its own layout: the vocabulary of [`Decoder`]
/// and of a pass's [`SeqChunk`]s. [`crate::Backend`] adds the ops over them.
pub trait Resident: Send + Sync + Sized + 'static {
    /// An activation matrix `[rows, cols]` of f32 in backend memory.
    type Tensor: Send + Sync;
    /// A linear layer's weight as the backend keeps it (packed NVFP4 stays packed).
    type Linear: Send + Sync;
    /// All routed experts of one MoE layer.
    type Experts: Send + Sync;
    /// A rotary embedding's tables.
    type Rope: Send + Sync;
    /// One layer's KV cache.
    type KvLayer: Send + Sync;
    /// A router's decision for each token: selected experts and their weights.
    type Routing: Send + Sync;
}

/// Element type of cached keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvDtype {
    /// f32: exact, 4 bytes per element.
    F32,
    /// bfloat16, 2 bytes per element (the default).
    #[default]
    Bf16,
    /// fp8 e4m3 with a static per-layer scale, 1 byte per element.
    Fp8E4m3,
}

impl KvDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::Bf16 => 2,
            KvDtype::Fp8E4m3 => 1,
        }
    }
}

/// A KV cache dtype name that is none of [`KvDtype`]'s (vLLM's other KV types included).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unsupported KV cache dtype '{0}': expected bf16 (or auto, bfloat16), fp8 (or fp8_e4m3) or \
     f32 (or float32); fp8_e5m2 and the other vLLM types are not implemented"
)]
pub struct ParseKvDtypeError(pub String);

impl std::str::FromStr for KvDtype {
    type Err = ParseKvDtypeError;

    /// `bf16`, `fp8` or `f32`, and vLLM's spellings of the same storage (`auto`, `bfloat16`,
    /// `fp8_e4m3`, `float32`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "bf16" | "bfloat16" | "auto" => Ok(KvDtype::Bf16),
            "fp8" | "fp8_e4m3" => Ok(KvDtype::Fp8E4m3),
            "f32" | "float32" => Ok(KvDtype::F32),
            other => Err(ParseKvDtypeError(other.to_string())),
        }
    }
}

/// What one layer's cache holds.
#[derive(Debug, Clone, PartialEq)]
pub struct KvLayerSpec {
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of each head.
    pub head_dim: usize,
    /// Sliding window (keys at positions `p - window + 1 ..= p` are visible), or `None` for
    /// full attention.
    pub window: Option<usize>,
    /// Storage element type.
    pub dtype: KvDtype,
    /// Key dequantization scale (fp8 storage only; 1.0 otherwise).
    pub k_scale: f32,
    /// Value dequantization scale (fp8 storage only; 1.0 otherwise).
    pub v_scale: f32,
}

impl KvLayerSpec {
    /// Elements of one cached row (one position, all KV heads).
    pub fn row_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Whether a store of this layer holding `held` positions still has its first `len` on
    /// their own: `len` at most `held`, and a sliding ring not yet wrapped (or all of it).
    pub fn can_fork(&self, held: usize, len: usize) -> bool {
        len == held || (len < held && self.window.is_none_or(|w| held <= w))
    }
}

/// Which logits a chunk wants back from a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// None (a prefill chunk that is not the prompt's last).
    None,
    /// Its last token's (a decode step, or a prompt's last chunk).
    Last,
    /// Every token's (prompt scoring, speculative verification).
    All,
}

/// One sequence's part of a pass: new tokens appended to its KV cache.
pub struct SeqChunk<'a, B: Resident> {
    /// The sequence's KV cache, one store per layer.
    pub kv: &'a mut [B::KvLayer],
    /// Its new tokens (at least one; the caller has checked them against the vocabulary).
    pub ids: &'a [u32],
    /// Positions already in its cache (the first new token's position).
    pub pos0: usize,
    /// The logits it wants.
    pub want: Want,
}

/// One chunk of a pass as attention sees it: its rows of the stacked q/k/v (`rows`, after the
/// previous chunks' rows), their first position `pos0`, and this layer's KV store of its sequence.
pub struct AttnChunk<'a, B: Resident> {
    /// Positions already in `kv` (the chunk's first row's position).
    pub pos0: usize,
    /// The chunk's rows.
    pub rows: usize,
    /// The sequence's KV store of this layer.
    pub kv: &'a mut B::KvLayer,
}

/// The per-head RMSNorms of q and k that attention applies before the rope (Laguna's QK norms):
/// each side's weight (`None`: that side has none) and epsilon.
pub struct HeadNorms<'a, B: Resident> {
    /// q's per-head norm weight `[1, head_dim]`.
    pub q: Option<&'a B::Tensor>,
    /// k's per-head norm weight `[1, head_dim]`.
    pub k: Option<&'a B::Tensor>,
    /// The norms' epsilon.
    pub eps: f32,
}

impl<B: Resident> HeadNorms<'_, B> {
    /// No norm on either side.
    pub fn none() -> Self {
        Self {
            q: None,
            k: None,
            eps: 0.0,
        }
    }
}

impl<B: Resident> Clone for HeadNorms<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Resident> Copy for HeadNorms<'_, B> {}

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
pub struct Decoder<B: Resident> {
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
pub struct Layer<B: Resident> {
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
pub struct Attention<B: Resident> {
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
pub struct SwiGlu<B: Resident> {
    /// Gate projection `[inter, hidden]`.
    pub gate: B::Linear,
    /// Up projection `[inter, hidden]`.
    pub up: B::Linear,
    /// Down projection `[hidden, inter]`.
    pub down: B::Linear,
}

/// A routed mixture of SwiGLU experts, with an optional always-on shared expert.
pub struct Moe<B: Resident> {
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
pub enum Mlp<B: Resident> {
    /// A dense SwiGLU.
    Dense(SwiGlu<B>),
    /// A mixture of experts.
    Moe(Moe<B>),
}
