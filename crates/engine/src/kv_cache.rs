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
