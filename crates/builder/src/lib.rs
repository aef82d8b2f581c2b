//! fp4forge builder: quantization plans, the streaming executor, verify, inspect and synth.
#![deny(missing_docs)]

pub mod build;
pub mod context;
mod error;
pub mod import_gguf;
pub mod inspect;
pub mod plan;
pub mod staging;
pub mod synth;
pub mod validate;
pub mod verify;

pub use error::BuilderError;
