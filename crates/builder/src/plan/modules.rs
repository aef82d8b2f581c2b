//! The linear modules of a checkpoint, as compressed-tensors and vLLM see them: every 2-D
//! `.weight` outside the embedding, every already-packed NVFP4 module, and the per-expert 2-D
//! modules that transformers-style fused 3-D experts split into (llmcompressor's linearisation).

use std::ops::Range;

use fp4forge_format::checkpoint::TensorInfo;
use fp4forge_format::Dtype;

use super::matcher::is_embedding_module;

/// Tensor-name suffixes of a packed NVFP4 module, in the order they are written.
pub const NVFP4_SUFFIXES: [&str; 4] = [
    "weight_packed",
    "weight_scale",
    "weight_global_scale",
    "input_global_scale",
];

/// Where a high-precision linear weight's bytes live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WeightSource {
    /// A whole 2-D tensor `module.weight`.
    Tensor(String),
    /// Rows of a 3-D fused-expert tensor: expert `expert`'s `[rows, cols]` slice, given as a
    /// byte range of the source tensor.
    ExpertSlice {
        /// The 3-D source tensor (`….experts.gate_up_proj` or `….experts.down_proj`).
        tensor: String,
        /// Byte range of the slice inside the tensor's bytes.
        bytes: Range<usize>,
    },
}

/// How a linear module is stored in the source checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub enum ModuleState {
    /// A high-precision weight (bf16, fp16 or f32, or a dtype that cannot be quantized).
    Dense {
        /// Where its bytes are.
        source: WeightSource,
        /// Its dtype.
        dtype: Dtype,
    },
    /// Already NVFP4 (`weight_packed`, `weight_scale`, `weight_global_scale`); `w4a4` when it
    /// also carries `input_global_scale`.
    Packed {
        /// Whether the module has an `input_global_scale` (W4A4).
        w4a4: bool,
    },
}

/// One linear module: its name (no `.weight`), logical `[rows, cols]` shape and storage.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearModule {
    /// Module name, e.g. `model.layers.0.self_attn.q_proj`.
    pub name: String,
    /// Output dimension.
    pub rows: usize,
    /// Input dimension (unpacked).
    pub cols: usize,
    /// How it is stored.
    pub state: ModuleState,
}

/// The 3-D fused-expert spellings transformers uses in memory (and some checkpoints on disk):
/// `….experts.gate_up_proj [E, 2I, H]` (gate rows first) and `….experts.down_proj [E, H, I]`.
pub fn fused_expert_kind<'a>(
    tensor: &'a str,
    shape: &[usize],
) -> Option<(&'a str, FusedExpertKind)> {
    if shape.len() != 3 {
        return None;
    }
    let base = tensor.strip_suffix(".weight").unwrap_or(tensor);
    if let Some(prefix) = base.strip_suffix(".gate_up_proj") {
        return prefix
            .ends_with("experts")
            .then_some((prefix, FusedExpertKind::GateUp));
    }
    if let Some(prefix) = base.strip_suffix(".down_proj") {
        return prefix
            .ends_with("experts")
            .then_some((prefix, FusedExpertKind::Down));
    }
    None
}

/// Which fused-expert tensor a 3-D tensor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FusedExpertKind {
    /// `gate_up_proj [E, 2I, H]`.
    GateUp,
    /// `down_proj [E, H, I]`.
    Down,
}

/// The per-expert 2-D modules a fused 3-D expert tensor splits into, in expert order.
pub fn split_fused_experts(
    experts_prefix: &str,
    kind: FusedExpertKind,
    tensor: &TensorInfo,
) -> Vec<LinearModule> {
    let (experts, rows, cols) = (tensor.shape[0], tensor.shape[1], tensor.shape[2]);
    let size = tensor.dtype.size();
    let slice = |e: usize, first_row: usize, n_rows: usize| WeightSource::ExpertSlice {
        tensor: tensor.name.clone(),
        bytes: ((e * rows + first_row) * cols * size)
            ..((e * rows + first_row + n_rows) * cols * size),
    };
    let module = |name: String, rows: usize, source: WeightSource| LinearModule {
        name,
        rows,
        cols,
        state: ModuleState::Dense {
            source,
            dtype: tensor.dtype,
        },
    };
    let mut out = Vec::new();
    for e in 0..experts {
        match kind {
            FusedExpertKind::GateUp => {
                let half = rows / 2;
                out.push(module(
                    format!("{experts_prefix}.{e}.gate_proj"),
                    half,
                    slice(e, 0, half),
                ));
                out.push(module(
                    format!("{experts_prefix}.{e}.up_proj"),
                    half,
                    slice(e, half, half),
                ));
            }
            FusedExpertKind::Down => out.push(module(
                format!("{experts_prefix}.{e}.down_proj"),
                rows,
                slice(e, 0, rows),
            )),
        }
    }
    out
}

/// Every linear module of a checkpoint, in tensor order (fused 3-D experts expanded in place).
pub fn linear_modules<'a>(tensors: impl IntoIterator<Item = &'a TensorInfo>) -> Vec<LinearModule> {
    let tensors: Vec<&TensorInfo> = tensors.into_iter().collect();
    let has = |name: &str| tensors.iter().any(|t| t.name == name);
    let mut out = Vec::new();
    for t in &tensors {
        if let Some(module) = t.name.strip_suffix(".weight_packed") {
            if t.shape.len() == 2 {
                out.push(LinearModule {
                    name: module.to_string(),
                    rows: t.shape[0],
                    cols: t.shape[1] * 2,
                    state: ModuleState::Packed {
                        w4a4: has(&format!("{module}.input_global_scale")),
                    },
                });
            }
        } else if let Some((prefix, kind)) = fused_expert_kind(&t.name, &t.shape) {
            if kind == FusedExpertKind::Down || t.shape[1] % 2 == 0 {
                out.extend(split_fused_experts(prefix, kind, t));
            }
        } else if let Some(module) = t.name.strip_suffix(".weight") {
            if t.shape.len() == 2 && !is_embedding_module(module) {
                out.push(LinearModule {
                    name: module.to_string(),
                    rows: t.shape[0],
                    cols: t.shape[1],
                    state: ModuleState::Dense {
                        source: WeightSource::Tensor(t.name.clone()),
                        dtype: t.dtype,
                    },
                });
            }
        }
    }
    out
}
