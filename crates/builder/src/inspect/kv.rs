//! KV-cache bytes: per token, per sequence, and read per decode step at a context length.
//!
//! Per layer and token the cache holds K and V: `2 · kv_heads · head_dim · bytes`. A full-attention
//! layer keeps every token; a sliding layer keeps at most `sliding_window`. A decode step reads
//! the whole cache of its sequence, so the bytes read per token at context `c` equal the cache
//! size at `c`.

use serde::Serialize;

use super::arch::{Architecture, AttentionKind};

/// Bytes of one cached element.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvDtype {
    /// 16-bit (bf16/f16): 2 bytes.
    Bf16,
    /// fp8 e4m3: 1 byte.
    Fp8,
}

impl KvDtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Self::Bf16 => 2,
            Self::Fp8 => 1,
        }
    }

    /// Short name.
    pub fn label(self) -> &'static str {
        match self {
            Self::Bf16 => "bf16",
            Self::Fp8 => "fp8",
        }
    }
}

/// The layers of one attention kind.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvLayerGroup {
    /// `full` or `sliding`.
    pub kind: &'static str,
    /// How many layers.
    pub layers: u64,
    /// The window, for sliding layers.
    pub window: Option<u64>,
    /// K+V bytes per token of one layer in bf16, if all layers of the kind agree.
    pub per_layer_bytes_bf16: Option<u64>,
    /// K+V bytes per token of all these layers together, bf16.
    pub bytes_per_token_bf16: u64,
    /// K+V bytes per token of all these layers together, fp8.
    pub bytes_per_token_fp8: u64,
    /// Cap per sequence in bf16 (sliding layers only).
    pub cap_bytes_bf16: Option<u64>,
    /// Cap per sequence in fp8 (sliding layers only).
    pub cap_bytes_fp8: Option<u64>,
}

/// The cache of one sequence at one context length.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvAtContext {
    /// Tokens in the sequence.
    pub context: u64,
    /// Cache bytes in bf16 (= bytes read per decode step).
    pub bytes_bf16: u64,
    /// Cache bytes in fp8.
    pub bytes_fp8: u64,
}

impl KvAtContext {
    /// The figure for one dtype.
    pub fn bytes(&self, dtype: KvDtype) -> u64 {
        match dtype {
            KvDtype::Bf16 => self.bytes_bf16,
            KvDtype::Fp8 => self.bytes_fp8,
        }
    }
}

/// KV-cache accounting for one model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvReport {
    /// The dtype the checkpoint asks for (`kv_cache_scheme` 8-bit → fp8, else bf16); rooflines use it.
    pub dtype: KvDtype,
    /// Full and sliding layers.
    pub groups: Vec<KvLayerGroup>,
    /// The cache at several context lengths.
    pub contexts: Vec<KvAtContext>,
}

/// Cache bytes of one sequence of `c` tokens, all layers.
fn cache_bytes(arch: &Architecture, c: u64, dtype: KvDtype) -> u64 {
    arch.layers
        .iter()
        .map(|l| {
            let tokens = match l.attention {
                AttentionKind::Full => c,
                AttentionKind::Sliding => c.min(arch.sliding_window.unwrap_or(c)),
            };
            2 * l.kv_heads * arch.head_dim * dtype.bytes() * tokens
        })
        .sum()
}

/// The KV report at the given context lengths (those past `max_position_embeddings` are clamped
/// to it, duplicates dropped).
pub fn kv_report(arch: &Architecture, dtype: KvDtype, contexts: &[u64]) -> KvReport {
    let mut groups = Vec::new();
    for (kind, name) in [
        (AttentionKind::Full, "full"),
        (AttentionKind::Sliding, "sliding"),
    ] {
        let per_layer: Vec<u64> = arch
            .layers
            .iter()
            .filter(|l| l.attention == kind)
            .map(|l| 2 * l.kv_heads * arch.head_dim)
            .collect();
        if per_layer.is_empty() {
            continue;
        }
        let elems: u64 = per_layer.iter().sum();
        let window = (kind == AttentionKind::Sliding)
            .then_some(arch.sliding_window)
            .flatten();
        groups.push(KvLayerGroup {
            kind: name,
            layers: per_layer.len() as u64,
            window,
            per_layer_bytes_bf16: per_layer
                .iter()
                .all(|&e| e == per_layer[0])
                .then(|| per_layer[0] * 2),
            bytes_per_token_bf16: elems * 2,
            bytes_per_token_fp8: elems,
            cap_bytes_bf16: window.map(|w| elems * 2 * w),
            cap_bytes_fp8: window.map(|w| elems * w),
        });
    }
    let max = arch.max_position_embeddings.unwrap_or(u64::MAX);
    let mut ctxs: Vec<u64> = contexts.iter().map(|&c| c.min(max)).collect();
    ctxs.sort_unstable();
    ctxs.dedup();
    KvReport {
        dtype,
        groups,
        contexts: ctxs
            .into_iter()
            .map(|c| KvAtContext {
                context: c,
                bytes_bf16: cache_bytes(arch, c, KvDtype::Bf16),
                bytes_fp8: cache_bytes(arch, c, KvDtype::Fp8),
            })
            .collect(),
    }
}
