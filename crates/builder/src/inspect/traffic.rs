//! Parameters, bytes and bytes read per decoded token, per component and precision.
//!
//! Decode at batch 1 reads every non-expert weight once per token, `top_k / E` of each MoE
//! layer's routed experts, one row of the embedding table, and all of `lm_head` (the whole
//! embedding table again when tied). KV-cache reads are added by [`super::kv`].

use std::collections::BTreeMap;

use serde::Serialize;

use super::arch::{Architecture, Mlp};
use super::components::{params, place, precisions, Component, Precision};
use super::tensor::TensorDesc;
use crate::BuilderError;

/// One component at one precision.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ComponentRow {
    /// The component.
    pub component: Component,
    /// Its storage precision.
    pub precision: Precision,
    /// Tensors (scales included).
    pub tensors: u64,
    /// Logical parameters (scales excluded).
    pub params: u64,
    /// Bytes on disk / in memory.
    pub bytes: u64,
    /// Bytes read per decoded token at batch 1.
    pub bytes_per_token: f64,
    /// Parameters used per token (embedding table excluded).
    pub active_params: f64,
}

/// Sums over all components.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Totals {
    /// Tensors.
    pub tensors: u64,
    /// Logical parameters.
    pub params: u64,
    /// Footprint in bytes.
    pub bytes: u64,
    /// Weight bytes read per decoded token (KV excluded).
    pub bytes_per_token: f64,
    /// Attention (q, k, v, o, gate) parameters.
    pub attention_params: u64,
    /// Attention bytes.
    pub attention_bytes: u64,
    /// Attention bytes per token (all of them: attention is dense).
    pub attention_bytes_per_token: f64,
    /// `attention_bytes_per_token / bytes_per_token`.
    pub attention_share: f64,
    /// Routed-expert bytes per token.
    pub routed_expert_bytes_per_token: f64,
    /// Parameters used per token, embedding table excluded.
    pub active_params: f64,
    /// Parameters used per token plus the whole embedding table (how model cards count).
    pub active_params_with_embedding: f64,
}

/// Accounts for every tensor; rows come sorted by component, then precision.
pub fn account(
    arch: &Architecture,
    tensors: &[TensorDesc],
) -> Result<(Vec<ComponentRow>, Totals), BuilderError> {
    let default_fraction = arch
        .moe()
        .map_or(1.0, |m| m.top_k as f64 / m.experts as f64);
    let expert_fraction = |layer: Option<usize>| match layer.and_then(|l| arch.layers.get(l)) {
        Some(l) => match &l.mlp {
            Mlp::Moe(m) => m.top_k as f64 / m.experts as f64,
            Mlp::Dense { .. } => default_fraction,
        },
        None => default_fraction,
    };
    let precs = precisions(tensors);
    let mut rows: BTreeMap<(Component, Precision), ComponentRow> = BTreeMap::new();
    let mut embedding_params = 0u64;
    for (t, precision) in tensors.iter().zip(precs) {
        let place = place(&t.name);
        let bytes = t.bytes()?;
        let p = params(t);
        let (read, active) = match place.component {
            Component::RoutedExperts => {
                let f = expert_fraction(place.layer);
                (f, f)
            }
            Component::Embedding => {
                embedding_params += p;
                (
                    1.0 / t.shape.first().copied().unwrap_or(1).max(1) as f64,
                    0.0,
                )
            }
            _ => (1.0, 1.0),
        };
        let row = rows
            .entry((place.component, precision.clone()))
            .or_insert_with(|| empty_row(place.component, precision));
        row.tensors += 1;
        row.params += p;
        row.bytes += bytes;
        row.bytes_per_token += bytes as f64 * read;
        row.active_params += p as f64 * active;
    }
    let has_lm_head = rows.keys().any(|(c, _)| *c == Component::LmHead);
    if arch.tie_word_embeddings && !has_lm_head {
        let tied: Vec<(Precision, u64)> = rows
            .iter()
            .filter(|((c, _), _)| *c == Component::Embedding)
            .map(|((_, p), r)| (p.clone(), r.bytes))
            .collect();
        for (precision, bytes) in tied {
            let mut row = empty_row(Component::LmHeadTied, precision.clone());
            row.bytes_per_token = bytes as f64;
            rows.insert((Component::LmHeadTied, precision), row);
        }
    }
    let rows: Vec<ComponentRow> = rows.into_values().collect();
    let sum = |f: &dyn Fn(&ComponentRow) -> bool, v: &dyn Fn(&ComponentRow) -> f64| {
        rows.iter().filter(|r| f(r)).map(v).sum::<f64>()
    };
    let all = |_: &ComponentRow| true;
    let attn = |r: &ComponentRow| r.component.is_attention();
    let bytes_per_token = sum(&all, &|r| r.bytes_per_token);
    let attention_bytes_per_token = sum(&attn, &|r| r.bytes_per_token);
    let active_params = sum(&all, &|r| r.active_params);
    let totals = Totals {
        tensors: rows.iter().map(|r| r.tensors).sum(),
        params: rows.iter().map(|r| r.params).sum(),
        bytes: rows.iter().map(|r| r.bytes).sum(),
        bytes_per_token,
        attention_params: rows.iter().filter(|r| attn(r)).map(|r| r.params).sum(),
        attention_bytes: rows.iter().filter(|r| attn(r)).map(|r| r.bytes).sum(),
        attention_bytes_per_token,
        attention_share: if bytes_per_token > 0.0 {
            attention_bytes_per_token / bytes_per_token
        } else {
            0.0
        },
        routed_expert_bytes_per_token: sum(&|r| r.component == Component::RoutedExperts, &|r| {
            r.bytes_per_token
        }),
        active_params,
        active_params_with_embedding: active_params + embedding_params as f64,
    };
    Ok((rows, totals))
}

fn empty_row(component: Component, precision: Precision) -> ComponentRow {
    ComponentRow {
        component,
        precision,
        tensors: 0,
        params: 0,
        bytes: 0,
        bytes_per_token: 0.0,
        active_params: 0.0,
    }
}
