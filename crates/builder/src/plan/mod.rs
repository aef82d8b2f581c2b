//! Quantization plans: which modules are quantized, and how.

pub mod matcher;

pub use matcher::{is_embedding_module, is_linear_weight, ModulePattern, TargetMatcher};
