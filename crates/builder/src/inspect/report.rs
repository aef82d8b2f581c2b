//! The report: plain data that prints as tables ([`std::fmt::Display`]) and serializes as JSON.

use serde::Serialize;

use super::arch::{Architecture, AttentionKind, Mlp};
use super::components::Component;
use super::hardware::RooflineRow;
use super::kv::KvReport;
use super::quant::{QuantConfig, WeightScheme};
use super::traffic::{ComponentRow, Totals};

/// Where the tensor set came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// Derived from `config.json` alone (architecture + `quantization_config`).
    Config,
    /// Read from the checkpoint's safetensors headers.
    Headers,
}

/// The model's shape in a few numbers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSummary {
    /// `model_type`.
    pub model_type: String,
    /// `architectures`.
    pub architectures: Vec<String>,
    /// Decoder layers.
    pub layers: u64,
    /// Full-attention layers.
    pub full_attention_layers: u64,
    /// Sliding-window layers.
    pub sliding_attention_layers: u64,
    /// Window of the sliding layers.
    pub sliding_window: Option<u64>,
    /// Residual width.
    pub hidden_size: u64,
    /// Per-head dimension.
    pub head_dim: u64,
    /// Vocabulary size.
    pub vocab_size: u64,
    /// Layers with a dense MLP.
    pub dense_mlp_layers: u64,
    /// Layers with an MoE.
    pub moe_layers: u64,
    /// Routed experts per MoE layer.
    pub experts: Option<u64>,
    /// Experts used per token.
    pub experts_per_token: Option<u64>,
    /// `max_position_embeddings`.
    pub max_position_embeddings: Option<u64>,
    /// Whether `lm_head` is the embedding.
    pub tie_word_embeddings: bool,
    /// Unquantized weight dtype.
    pub dtype: String,
}

impl ModelSummary {
    /// Summarizes an architecture.
    pub fn of(arch: &Architecture) -> Self {
        let count = |f: &dyn Fn(&super::arch::LayerArch) -> bool| {
            arch.layers.iter().filter(|l| f(l)).count() as u64
        };
        let moe = arch.moe();
        Self {
            model_type: arch.model_type.clone(),
            architectures: arch.architectures.clone(),
            layers: arch.layers.len() as u64,
            full_attention_layers: count(&|l| l.attention == AttentionKind::Full),
            sliding_attention_layers: count(&|l| l.attention == AttentionKind::Sliding),
            sliding_window: arch.sliding_window,
            hidden_size: arch.hidden_size,
            head_dim: arch.head_dim,
            vocab_size: arch.vocab_size,
            dense_mlp_layers: count(&|l| matches!(l.mlp, Mlp::Dense { .. })),
            moe_layers: count(&|l| matches!(l.mlp, Mlp::Moe(_))),
            experts: moe.map(|m| m.experts),
            experts_per_token: moe.map(|m| m.top_k),
            max_position_embeddings: arch.max_position_embeddings,
            tie_word_embeddings: arch.tie_word_embeddings,
            dtype: arch.dtype.clone(),
        }
    }
}

/// One quantization group, for display.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupSummary {
    /// The group's key.
    pub name: String,
    /// `nvfp4 (w4a4)`, `nvfp4a16`, `fp8`, ...
    pub scheme: String,
    /// Its targets, as written.
    pub targets: Vec<String>,
}

/// The `quantization_config`, for display.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuantSummary {
    /// The groups.
    pub groups: Vec<GroupSummary>,
    /// The ignore list, as written.
    pub ignore: Vec<String>,
    /// KV-cache bits, if `kv_cache_scheme` is set.
    pub kv_cache_bits: Option<u64>,
}

impl QuantSummary {
    /// Summarizes a parsed config.
    pub fn of(q: &QuantConfig) -> Self {
        Self {
            groups: q
                .groups
                .iter()
                .map(|g| GroupSummary {
                    name: g.name.clone(),
                    scheme: match (g.weights, g.activations) {
                        (WeightScheme::Nvfp4, true) => "nvfp4 (w4a4)".into(),
                        (WeightScheme::Nvfp4, false) => "nvfp4a16".into(),
                        (_, true) => "fp8 (w8a8)".into(),
                        (_, false) => "fp8 (w8a16)".into(),
                    },
                    targets: g.matcher.targets().iter().map(|p| p.to_string()).collect(),
                })
                .collect(),
            ignore: q.ignore.clone(),
            kv_cache_bits: q.kv_cache_bits,
        }
    }
}

/// Everything `inspect` knows about one checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The path inspected.
    pub source: String,
    /// Config-derived or header-read tensor set.
    pub basis: Basis,
    /// The model's shape.
    pub model: ModelSummary,
    /// Its `quantization_config`, if any.
    pub quantization: Option<QuantSummary>,
    /// Per component and precision.
    pub components: Vec<ComponentRow>,
    /// Sums.
    pub totals: Totals,
    /// KV cache.
    pub kv_cache: KvReport,
    /// Decode ceilings per device.
    pub roofline: Vec<RooflineRow>,
}

/// One component before and after.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ComponentDelta {
    /// The component.
    pub component: Component,
    /// Precisions before, joined with `+`.
    pub before_precision: String,
    /// Precisions after, joined with `+`.
    pub after_precision: String,
    /// Bytes before.
    pub before_bytes: u64,
    /// Bytes after.
    pub after_bytes: u64,
    /// Bytes per token before.
    pub before_bytes_per_token: f64,
    /// Bytes per token after.
    pub after_bytes_per_token: f64,
}

/// Decode speedup at one context (the same on every device: the ratio of bytes per token).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SpeedupAt {
    /// Context; 0 = weights only.
    pub context: u64,
    /// Bytes per token before (weights + KV).
    pub before_bytes_per_token: f64,
    /// Bytes per token after.
    pub after_bytes_per_token: f64,
    /// before ÷ after.
    pub speedup: f64,
}

/// Two reports side by side (`--against`): typically stock vs lean.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// The first checkpoint.
    pub before: Report,
    /// The second (`--against`).
    pub after: Report,
    /// Per component.
    pub components: Vec<ComponentDelta>,
    /// after − before, bytes.
    pub footprint_delta_bytes: i64,
    /// after ÷ before.
    pub footprint_ratio: f64,
    /// after − before, weight bytes per token.
    pub bytes_per_token_delta: f64,
    /// after ÷ before, weight bytes per token.
    pub bytes_per_token_ratio: f64,
    /// Ceiling speedups, weights only and at each context both reports share.
    pub speedup: Vec<SpeedupAt>,
}

impl Comparison {
    /// Compares two reports.
    pub fn new(before: Report, after: Report) -> Self {
        let mut comps: Vec<Component> = before
            .components
            .iter()
            .chain(&after.components)
            .map(|r| r.component)
            .collect();
        comps.sort();
        comps.dedup();
        let side = |r: &Report, c: Component| {
            let rows: Vec<&ComponentRow> =
                r.components.iter().filter(|x| x.component == c).collect();
            let prec: Vec<String> = rows.iter().map(|x| x.precision.to_string()).collect();
            (
                if prec.is_empty() {
                    "-".to_string()
                } else {
                    prec.join("+")
                },
                rows.iter().map(|x| x.bytes).sum::<u64>(),
                rows.iter().map(|x| x.bytes_per_token).sum::<f64>(),
            )
        };
        let components = comps
            .into_iter()
            .map(|c| {
                let (bp, bb, bt) = side(&before, c);
                let (ap, ab, at) = side(&after, c);
                ComponentDelta {
                    component: c,
                    before_precision: bp,
                    after_precision: ap,
                    before_bytes: bb,
                    after_bytes: ab,
                    before_bytes_per_token: bt,
                    after_bytes_per_token: at,
                }
            })
            .collect();
        let per_token = |r: &Report| {
            let w = r.totals.bytes_per_token;
            let kv = &r.kv_cache;
            std::iter::once((0, w))
                .chain(
                    kv.contexts
                        .iter()
                        .map(|c| (c.context, w + c.bytes(kv.dtype) as f64)),
                )
                .collect::<Vec<(u64, f64)>>()
        };
        let after_bytes = per_token(&after);
        let speedup = per_token(&before)
            .into_iter()
            .filter_map(|(context, b)| {
                let &(_, a) = after_bytes.iter().find(|(c, _)| *c == context)?;
                Some(SpeedupAt {
                    context,
                    before_bytes_per_token: b,
                    after_bytes_per_token: a,
                    speedup: b / a,
                })
            })
            .collect();
        let (b, a) = (&before.totals, &after.totals);
        Self {
            components,
            footprint_delta_bytes: a.bytes as i64 - b.bytes as i64,
            footprint_ratio: a.bytes as f64 / b.bytes as f64,
            bytes_per_token_delta: a.bytes_per_token - b.bytes_per_token,
            bytes_per_token_ratio: a.bytes_per_token / b.bytes_per_token,
            speedup,
            before,
            after,
        }
    }
}
