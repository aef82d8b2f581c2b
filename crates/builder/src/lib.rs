//! fp4forge builder: quantization plans, the streaming executor, verify, inspect and synth.
#![deny(missing_docs)]

pub mod build;
mod error;
pub mod inspect;
pub mod plan;
pub mod verify;

pub use error::BuilderError;
