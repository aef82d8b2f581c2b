//! fp4forge-format: the single home of fp4forge's numerics and file formats.
//!
//! # NVFP4 in twenty lines
//!
//! A Linear weight `W [out, in]` (bf16, fp16 or f32) becomes three tensors (compressed-tensors
//! `nvfp4-pack-quantized`):
//!
//! ```text
//! P.weight_packed        U8       [out, in/2]   two E2M1 codes per byte, even element low nibble
//! P.weight_scale         F8_E4M3  [out, in/16]  one scale per 16 consecutive inputs
//! P.weight_global_scale  F32      [1]           g = 2688 / amax  (a multiplier, not a divisor)
//! ```
//!
//! E2M1 codes are `sign << 3 | idx`, idx into {0, .5, 1, 1.5, 2, 3, 4, 6}. Dequantization is
//! `w = e2m1(code) · fp8(scale) / g`. Quantization follows compressed-tensors 0.20.1 exactly,
//! including its dtype roundings: g = round(round(1/amax)·2688) in the weight dtype; each block's
//! scale is `e4m3(clamp(g · round(amax_block / 6), 448))` with 0 replaced by 0.125; each element
//! is `e2m1(clamp(x / (fp8 / g), ±6))` with two f32 divisions (no reciprocal, no FMA) and
//! round-half-to-even thresholds. Fused siblings (q/k/v, gate/up) share one g, the g of their
//! largest amax. Why so exact: vLLM and transformers load these bytes as they are, and "bit-exact
//! with the reference quantizer" is how a build is proven correct.
#![deny(missing_docs)]

pub mod error;
pub mod float;
pub mod fp4;
pub mod fp8;
pub mod nvfp4;
#[cfg(target_arch = "x86_64")]
mod nvfp4_avx2;

pub mod checkpoint;
pub mod config;
mod fsutil;
pub mod gguf;
pub mod shard_writer;

pub use error::NumericsError;
pub use nvfp4::{
    dequantize_bf16, dequantize_bf16_into, dequantize_f32, global_scale, quantize, quantize_fused,
    quantize_with_global_scale, Nvfp4Tensor, Nvfp4View, SourceDtype, WeightView,
};

pub use checkpoint::{
    Checkpoint, CheckpointError, Dtype, LoadFormat, SafetensorsFile, ShardIndex, TensorEntry,
    TensorInfo,
};
pub use config::{
    write_file_atomic, Field, ModelConfig, QuantizationArgs, QuantizationConfig, QuantizationScheme,
};
pub use gguf::{GgmlType, GgufError, GgufFile, GgufHeader, TensorInfo as GgufTensorInfo};
pub use shard_writer::{ShardWriter, ShardWriterBuilder, TensorSpec, WrittenCheckpoint};
