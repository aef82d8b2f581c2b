//! The KV cache: one store per layer, owned by a session.
//!
//! Full-attention layers grow with the sequence. Sliding-window layers keep a ring of `window`
//! slots (position `p` lives in slot `p % window`), so their memory is bounded however long the
//! sequence runs. A prefill chunk longer than the window is safe: attention reads the previous
//! ring contents and the chunk's own keys, and only then are the chunk's last `window` rows
//! written to the ring (the CPU store's `commit`), so no query reads a key that overwrote one it
//! needed.
//!
//! Storage is bf16 (default), fp8 e4m3 with per-layer static scales (`self_attn.k_scale` /
//! `v_scale` from the checkpoint, else 1.0: `x ≈ e4m3(x / scale) · scale`, vLLM's convention), or
//! f32 (exact; what the reference-logit tests use). New keys are rounded to the storage type
//! *before* attention reads them, so a token sees the same keys whether it was prefilled with its
//! neighbours or decoded one step at a time.

use crate::backend::Backend;
use crate::error::Result;
use crate::ir::KvLayerSpec;

/// A session's cache: one backend store per layer.
pub struct KvCache<B: Backend> {
    layers: Vec<B::KvLayer>,
}

impl<B: Backend> KvCache<B> {
    /// Empty stores for `specs`.
    pub fn new(backend: &B, specs: &[KvLayerSpec]) -> Result<Self> {
        let layers = specs
            .iter()
            .map(|s| backend.new_kv_layer(s))
            .collect::<Result<_>>()?;
        Ok(Self { layers })
    }

    /// A new cache holding a copy of the first `len` positions of every layer
    /// ([`Backend::kv_fork`]).
    pub fn fork(&self, backend: &B, len: usize) -> Result<Self> {
        let layers = self
            .layers
            .iter()
            .map(|l| backend.kv_fork(l, len))
            .collect::<Result<_>>()?;
        Ok(Self { layers })
    }

    /// The per-layer stores.
    pub fn layers_mut(&mut self) -> &mut [B::KvLayer] {
        &mut self.layers
    }

    /// Bytes held by layer `i`'s store.
    pub fn layer_bytes(&self, backend: &B, i: usize) -> usize {
        self.layers.get(i).map_or(0, |l| backend.kv_layer_bytes(l))
    }

    /// Bytes the stores take on top of what they hold to hold `positions` positions.
    pub fn growth_bytes(&self, backend: &B, positions: usize) -> usize {
        self.layers
            .iter()
            .map(|l| backend.kv_growth_bytes(l, positions))
            .sum()
    }

    /// Bytes held by all stores.
    pub fn bytes(&self, backend: &B) -> usize {
        self.layers.iter().map(|l| backend.kv_layer_bytes(l)).sum()
    }

    /// Number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Whether there are no layers.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}
