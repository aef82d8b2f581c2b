//! One tensor as a safetensors header describes it: name, dtype, shape.

use serde::Serialize;

use crate::BuilderError;

/// A tensor's header entry; all that byte accounting needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TensorDesc {
    /// Full tensor name, e.g. `model.layers.1.mlp.experts.0.up_proj.weight_packed`.
    pub name: String,
    /// safetensors dtype string (`BF16`, `F32`, `U8`, `F8_E4M3`, ...).
    pub dtype: String,
    /// Shape; empty for a scalar.
    pub shape: Vec<u64>,
}

impl TensorDesc {
    /// A tensor entry.
    pub fn new(name: impl Into<String>, dtype: impl Into<String>, shape: Vec<u64>) -> Self {
        Self {
            name: name.into(),
            dtype: dtype.into(),
            shape,
        }
    }

    /// Number of stored elements.
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Payload bytes; fails on a dtype this crate does not know.
    pub fn bytes(&self) -> Result<u64, BuilderError> {
        let bits = dtype_bits(&self.dtype).ok_or_else(|| BuilderError::Tensor {
            tensor: self.name.clone(),
            reason: format!("unknown dtype {:?}", self.dtype),
        })?;
        Ok((self.numel() * bits).div_ceil(8))
    }

    /// The module the tensor belongs to: its name without the last `.`-segment.
    pub fn module(&self) -> &str {
        self.name.rsplit_once('.').map_or("", |(m, _)| m)
    }

    /// The last `.`-segment of its name (`weight`, `weight_packed`, `k_scale`, ...).
    pub fn leaf(&self) -> &str {
        self.name.rsplit_once('.').map_or(&self.name, |(_, l)| l)
    }
}

/// Bits per element of a safetensors dtype, or `None` if unknown.
pub fn dtype_bits(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" | "F8_E8M0" => 8,
        "BF16" | "F16" | "I16" | "U16" => 16,
        "F32" | "I32" | "U32" => 32,
        "F64" | "I64" | "U64" => 64,
        "F4" => 4,
        "F6_E2M3" | "F6_E3M2" => 6,
        _ => return None,
    })
}
