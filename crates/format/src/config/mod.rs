//! Typed `config.json` and compressed-tensors `quantization_config` that round-trip exactly:
//! unknown keys, `null`s and key order survive a read and a write.

mod field;
mod model;
mod quantization;

pub use crate::fsutil::write_file_atomic;
pub use field::{Field, KeyOrder};
pub use model::ModelConfig;
pub use quantization::{
    DynamicMode, QuantizationArgs, QuantizationConfig, QuantizationScheme, CT_VERSION,
    NVFP4_PACK_QUANTIZED,
};
