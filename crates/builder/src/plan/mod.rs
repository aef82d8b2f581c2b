//! Quantization plans: which modules are quantized, and how.

pub mod fusion;
pub mod matcher;
pub mod modules;
pub mod quantize_plan;
pub mod untie;

pub use matcher::{is_embedding_module, is_linear_weight, ModulePattern, TargetMatcher};
pub use quantize_plan::{
    Job, PlanRequest, PlanSummary, QuantizeMember, QuantizePlan, UntiedLmHead, DEFAULT_TARGETS,
};
pub use untie::UntieLmHead;
