//! fp4forge builder: quantization plans, the streaming executor, verify, inspect and synth.
#![deny(missing_docs)]

mod error;
pub mod inspect;
pub mod plan;

pub use error::BuilderError;
