//! The seam between model families and kernels.
//!
//! A model family (Llama, Laguna) is written once against [`Backend`]: it uploads its weights at
//! load time and then calls a small set of ops on activations that live in backend memory
//! ([`Backend::Tensor`]). The model never touches activation memory itself; host data crosses the
//! seam only as token ids ([`Backend::embed`]) and logits ([`Backend::download`]), plus
//! [`Backend::upload`] for small constant vectors (norm weights, biases) at load time.
//!
//! Every resident object is an associated type, so a device backend chooses its own layout:
//! weights ([`Backend::Linear`], [`Backend::Experts`], possibly repacked or swizzled), rotary
//! tables ([`Backend::Rope`]), the KV cache ([`Backend::KvLayer`], paged or ring) and routing
//! results ([`Backend::Routing`], indices and weights that never leave the device). Ops take
//! `&self` and return new tensors (or modify one in place), a shape that also fits recording a
//! CUDA graph of a decode step: a backend may record instead of execute, and replay.
//!
//! Shapes: an activation tensor is a row-major matrix `[rows, cols]`, one row per token.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

use crate::error::Result;
use crate::ir::{Decoder, KvLayerSpec, SeqChunk};
use crate::logprobs::TokenLogprob;
use crate::rope::RopeSpec;
use crate::sampling::SamplingParams;
use crate::weights::{ExpertWeights, LinearWeight};

pub use crate::ir::{AttentionParams, AttnChunk, HeadNorms, Resident, RouterParams, RouterScoring};
pub use cpu::CpuBackend;
#[cfg(feature = "cuda")]
pub use cuda::CudaBackend;

/// One row for [`Backend::sample`]: a sequence's last logits (`[1, vocab]`), its sampler's
/// parameters and the sampler's uniform draw for this token (`None`: the sampler is greedy).
pub struct SampleRequest<'a, T> {
    /// The logits to pick from.
    pub logits: &'a T,
    /// How to pick.
    pub params: &'a SamplingParams,
    /// The draw [`Sampler::pick`](crate::Sampler::pick) would use.
    pub u: Option<f64>,
}

/// One tensor of logits for [`Backend::logprobs`] (`[rows, vocab]`): row `r` scores
/// `targets[r]` with its `top` most likely alternatives (`targets` may be shorter than the rows:
/// the others are not scored).
pub struct LogprobRequest<'a, T> {
    /// The logits.
    pub logits: &'a T,
    /// The token each row scores.
    pub targets: &'a [u32],
    /// Alternatives per row.
    pub top: usize,
}

/// The memory of a backend's KV caches, bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvMemory {
    /// Held by caches (blocks shared between forked caches counted once).
    pub used: usize,
    /// What caches may take in all (`None`: no cap).
    pub capacity: Option<usize>,
    /// Of `capacity - used`, what caches can still take (less than the difference where free
    /// memory is kept in blocks of another size than a cache needs); `None` without a cap.
    pub available: Option<usize>,
}

/// A cap on a backend's KV memory ([`Backend::limit_kv_memory`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvLimit {
    /// At most this many bytes (vLLM's `--kv-cache-memory-bytes`).
    Bytes(usize),
    /// What is left of this fraction (0, 1] of a GPU's memory after what is in use once the
    /// weights are loaded, less a reserve for activations (vLLM's `--gpu-memory-utilization`).
    DeviceFraction(f64),
}

/// Ops and resident objects of one device (CPU, CUDA, ...). See the module docs.
pub trait Backend: Resident {
    /// A short name for messages (`cpu`, `cpu-avx2`, `cuda:0`).
    fn name(&self) -> String;

    /// Runs `f` (one whole forward pass: a sequence of ops) in the backend's execution context.
    /// The CPU backend runs it on a worker of its thread pool, so each op's parallel loop is a
    /// cheap fork-join instead of a cross-thread hand-off; a device backend may bracket it with
    /// stream set-up or graph capture. The default just calls `f`.
    fn execute<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        f()
    }

    // ---- residency ---------------------------------------------------------------------

    /// Makes a weight resident. `name` identifies it in errors.
    fn load_linear(&self, name: &str, weight: LinearWeight) -> Result<Self::Linear>;
    /// Makes one MoE layer's routed experts resident (index = expert id).
    fn load_experts(&self, name: &str, experts: Vec<ExpertWeights>) -> Result<Self::Experts>;
    /// Builds a rotary embedding's tables.
    fn load_rope(&self, rope: &RopeSpec) -> Result<Self::Rope>;
    /// An empty KV store for one layer.
    fn new_kv_layer(&self, spec: &KvLayerSpec) -> Result<Self::KvLayer>;
    /// Bytes a KV store holds now.
    fn kv_layer_bytes(&self, layer: &Self::KvLayer) -> usize;
    /// A new store holding a copy of the first `len` positions' keys and values (a prefix of
    /// the sequence reused by another request); `layer` is unchanged. Callers ensure `len` is at
    /// most the stored length and, for a sliding layer whose length is past its window, equal to
    /// it (a ring has overwritten older slots); otherwise an error.
    fn kv_fork(&self, layer: &Self::KvLayer, len: usize) -> Result<Self::KvLayer>;
    /// Bytes that `layer` takes on top of what it holds to hold `positions` positions (0 where
    /// it already has room; a sliding layer never holds more than its window).
    fn kv_growth_bytes(&self, layer: &Self::KvLayer, positions: usize) -> usize;
    /// The memory of all KV caches of this backend: what they hold and, where the backend caps
    /// it, the cap.
    fn kv_memory(&self) -> KvMemory;
    /// Caps the memory of all KV caches of this backend (a cache that would grow past it fails
    /// with an error that says so) and returns the cap, bytes. Errors where the backend cannot
    /// honour `limit` (a device fraction on the CPU) or nothing is left for the caches.
    fn limit_kv_memory(&self, limit: KvLimit) -> Result<usize>;

    // ---- data in and out ---------------------------------------------------------------

    /// A tensor from host f32 data (`rows * cols` values, row-major).
    fn upload(&self, rows: usize, cols: usize, data: &[f32]) -> Result<Self::Tensor>;
    /// A tensor's values, row-major, in host memory.
    fn download(&self, x: &Self::Tensor) -> Result<Vec<f32>>;
    /// `(rows, cols)` of a tensor.
    fn dims(&self, x: &Self::Tensor) -> (usize, usize);
    /// Rows `start..start + len` of `x`, copied.
    fn rows(&self, x: &Self::Tensor, start: usize, len: usize) -> Result<Self::Tensor>;
    /// The rows of `parts` one after another (all of one width): `[Σ rows, cols]`. Batched
    /// decoding joins the attention outputs of its sequences with it. The default goes through
    /// host memory; a device backend should override it with a device-side copy.
    fn concat_rows(&self, parts: &[&Self::Tensor]) -> Result<Self::Tensor> {
        let cols = parts.first().map_or(0, |p| self.dims(p).1);
        let mut rows = 0;
        let mut data = Vec::new();
        for p in parts {
            let (r, c) = self.dims(p);
            if c != cols {
                return Err(crate::error::EngineError::Backend {
                    backend: self.name(),
                    reason: format!("concat_rows of {c} columns onto {cols}"),
                });
            }
            rows += r;
            data.extend_from_slice(&self.download(p)?);
        }
        self.upload(rows, cols, &data)
    }

    // ---- ops -----------------------------------------------------------------------------

    /// `[ids.len(), cols]`: row `ids[t]` of `table` for each `t` (embedding lookup). Ids must be
    /// `< table rows` (the caller checks).
    fn embed(&self, table: &Self::Linear, ids: &[u32]) -> Result<Self::Tensor>;
    /// RMSNorm over each consecutive group of `width` columns (`width = cols` for a hidden state,
    /// `head_dim` for per-head q/k norms): `x / sqrt(mean(x²) + eps) · weight`, `weight` is
    /// `[1, width]`.
    fn rms_norm(
        &self,
        x: &Self::Tensor,
        weight: &Self::Tensor,
        eps: f32,
        width: usize,
    ) -> Result<Self::Tensor>;
    /// `x · Wᵀ (+ bias)`: `[rows, in] → [rows, out]`; `bias` is `[1, out]`.
    fn linear(
        &self,
        x: &Self::Tensor,
        w: &Self::Linear,
        bias: Option<&Self::Tensor>,
    ) -> Result<Self::Tensor>;
    /// `y += x · Wᵀ (+ bias)`: a linear added to a residual stream (`y` is `[rows, out]`). A
    /// backend may add inside the linear's epilogue (where the last scaling and the add may round
    /// once instead of twice); the default is [`Backend::linear`] then [`Backend::add_scaled`].
    fn linear_add(
        &self,
        y: &mut Self::Tensor,
        x: &Self::Tensor,
        w: &Self::Linear,
        bias: Option<&Self::Tensor>,
    ) -> Result<()> {
        let h = self.linear(x, w, bias)?;
        self.add_scaled(y, 1.0, &h)
    }
    /// `y += (x ⊙ softplus(gate)) · Wᵀ (+ bias)`, each value of `gate` gating
    /// `x.cols / gate.cols` columns of its row (the attention output's per-head gate, then
    /// `o_proj` added to the residual stream). A backend may apply the gate where the linear
    /// reads x; the default is [`Backend::softplus_gate`] then [`Backend::linear_add`].
    fn gated_linear_add(
        &self,
        y: &mut Self::Tensor,
        mut x: Self::Tensor,
        gate: &Self::Tensor,
        w: &Self::Linear,
        bias: Option<&Self::Tensor>,
    ) -> Result<()> {
        self.softplus_gate(&mut x, gate)?;
        self.linear_add(y, &x, w, bias)
    }
    /// [`Backend::linear`] of several weights on the same input (q/k/v, gate/up), in order. A
    /// backend may run them as one parallel region or one launch; the default calls `linear`
    /// for each.
    fn linears(
        &self,
        x: &Self::Tensor,
        ws: &[(&Self::Linear, Option<&Self::Tensor>)],
    ) -> Result<Vec<Self::Tensor>> {
        ws.iter()
            .map(|&(w, bias)| self.linear(x, w, bias))
            .collect()
    }
    /// Rotates each `head_dim`-wide head of `x` in place, NeoX style within the rope's rotary
    /// slice; row `t` is at position `pos0 + t`.
    fn rope(
        &self,
        x: &mut Self::Tensor,
        rope: &Self::Rope,
        head_dim: usize,
        pos0: usize,
    ) -> Result<()>;
    /// `x = rope(rms_norm(x))` per `head_dim`-wide head (`norm`: the per-head norm's weight,
    /// `None`: the rope alone), row `t` at position `pos0 + t`: q or k of a chunk before
    /// attention. The default runs [`Backend::rms_norm`] then [`Backend::rope`]; a device
    /// backend may do both in one pass (the same values).
    fn norm_rope(
        &self,
        x: &mut Self::Tensor,
        norm: Option<&Self::Tensor>,
        eps: f32,
        rope: &Self::Rope,
        (head_dim, pos0): (usize, usize),
    ) -> Result<()> {
        if let Some(w) = norm {
            *x = self.rms_norm(x, w, eps, head_dim)?;
        }
        self.rope(x, rope, head_dim, pos0)
    }
    /// Causal attention of `q [T, heads·d]` over the cache plus this chunk's `k, v
    /// [T, kv_heads·d]` (row `t` at position `pos0 + t`, where `pos0` is the number of positions
    /// already in `cache`), honouring the cache's sliding window; appends the chunk to the cache.
    /// Returns `[T, heads·d]`.
    fn attention(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        cache: &mut Self::KvLayer,
        params: &AttentionParams,
    ) -> Result<Self::Tensor>;
    /// The per-head norms (`norms`), rotation ([`Backend::rope`] of q and k) and
    /// [`Backend::attention`] of a pass's chunks: `q`, `k`, `v` hold the chunks' rows one after
    /// another (chunk `i`: `chunks[i].rows` rows at positions `chunks[i].pos0..`, attending over
    /// its own `chunks[i].kv`, to which they are appended). Returns the outputs stacked the same
    /// way. The default norms all rows, then rotates and attends chunk by chunk
    /// ([`crate::forward::attention_each`]); a device backend may run all chunks in one launch.
    fn attention_chunks(
        &self,
        (q, k, v): (Self::Tensor, Self::Tensor, &Self::Tensor),
        norms: HeadNorms<'_, Self>,
        rope: &Self::Rope,
        chunks: &mut [AttnChunk<'_, Self>],
        params: &AttentionParams,
    ) -> Result<Self::Tensor> {
        crate::forward::attention_each(self, (q, k, v), norms, rope, chunks, params)
    }
    /// `x[t, j] *= softplus(gate[t, j / group])` with `group = cols(x) / cols(gate)` (per-head
    /// output gate: `group = head_dim`), softplus in f32 with threshold 20.
    fn softplus_gate(&self, x: &mut Self::Tensor, gate: &Self::Tensor) -> Result<()>;
    /// `silu(gate) ⊙ up`.
    fn silu_mul(&self, gate: &Self::Tensor, up: &Self::Tensor) -> Result<Self::Tensor>;
    /// `y = x · alpha + y` (residual adds, scaled sums).
    fn add_scaled(&self, y: &mut Self::Tensor, alpha: f32, x: &Self::Tensor) -> Result<()>;
    /// A router's decision per token from its logits `[T, experts]`: scores, top-k selected on
    /// `score + bias` (the bias `[1, experts]` only selects), selected scores renormalised if
    /// asked, multiplied by `scale`.
    fn route(
        &self,
        logits: &Self::Tensor,
        selection_bias: Option<&Self::Tensor>,
        params: &RouterParams,
        scale: f32,
    ) -> Result<Self::Routing>;
    /// `Σ_j w_j · Expert_{e_j}(x_t)` per token, `Expert(x) = down(silu(gate x) ⊙ up x)`.
    fn experts(
        &self,
        x: &Self::Tensor,
        routing: &Self::Routing,
        experts: &Self::Experts,
    ) -> Result<Self::Tensor>;

    /// For each of `rows`, the token [`Sampler::pick`](crate::Sampler::pick) chooses from its
    /// logits (`[1, vocab]`) with its parameters and draw, picked where the logits are, all rows
    /// at once (only the token ids come back, in one transfer). `None` for a row (the default:
    /// every row) where the backend does not sample those parameters itself: the caller
    /// downloads that row's logits and picks on the host.
    fn sample(&self, rows: &[SampleRequest<'_, Self::Tensor>]) -> Result<Vec<Option<u32>>> {
        Ok(vec![None; rows.len()])
    }

    /// For each of `requests`, the log-probabilities of its rows' targets
    /// ([`token_logprob`](crate::logprobs::token_logprob) of each row), computed where the
    /// logits are, all requests at once: only the scores come back, never the vocabulary's
    /// logits. `None` for a request (the default: every request) that the backend does not score
    /// itself: the caller downloads its logits and scores them on the host.
    fn logprobs(
        &self,
        requests: &[LogprobRequest<'_, Self::Tensor>],
    ) -> Result<Vec<Option<Vec<TokenLogprob>>>> {
        Ok(vec![None; requests.len()])
    }

    // ---- whole passes -----------------------------------------------------------------------

    /// The whole pass of [`crate::forward()`] run the backend's own way (fused launches on fixed
    /// buffers), with the same results up to f32 summation order: `Ok(Some(logits per chunk))`.
    /// `Ok(None)` (the default) where the backend has no such path for this pass (its shape, or
    /// something in `net` it does not cover): the generic ops run instead.
    fn fused_pass(
        &self,
        net: &Decoder<Self>,
        seqs: &mut [SeqChunk<'_, Self>],
    ) -> Result<Option<Vec<Option<Self::Tensor>>>> {
        let _ = (net, seqs);
        Ok(None)
    }
}
