//! fp4forge-engine: runs lean NVFP4 builds (and bf16 originals) of decoder LLMs natively.
//!
//! # The life of a token
//!
//! ```text
//! Model::load(dir)          config.json → fp4forge_arch::ArchSpec (Llama | Laguna | Qwen3-MoE)
//!                           → every tensor it names found, its dtype and shape checked; weights borrowed from the mmap, packed
//!                           NVFP4 stays packed (resident memory ≈ file size)
//! model.new_session()       an empty KV cache per layer (ring of `window` slots for sliding
//!                           layers, growing for full ones; bf16, fp8 or f32)
//! session.prefill(ids)      token ids cross into the backend once, as an embedding lookup
//!   for each layer:         x += Attn(RMSNorm(x)):  q,k,v = linear → [q/k norm] → RoPE →
//!                                                    causal attention over cache + chunk →
//!                                                    [softplus head gate] → o_proj
//!                           x += MLP(RMSNorm(x)):   SwiGLU, or router → top-k experts
//!                                                    (+ shared expert)
//!   logits = RMSNorm(x) · lm_headᵀ   only the rows asked for; they cross back to the host
//! sampler.sample(logits)    greedy / temperature, top-k, top-p, seeded
//! session.step(token)       the same pass for one row: every linear is a GEMV that streams the
//!                           packed weights once, dequantizing 16-element blocks in registers
//! model.step_batch(ss, ts)  one pass for many sessions (continuous batching): their rows are
//!                           stacked through every linear and MLP, attention runs per session
//! ```
//!
//! Everything between the ids going in and the logits coming out happens behind the
//! [`Backend`] trait: the model's geometry (`fp4forge_arch`, loaded by [`models`]) says *what* to
//! compute, a backend (the CPU one here; CUDA later, behind the same trait) says *how*, on memory
//! it owns. Activations are
//! f32 throughout, the precision of the reference logits the tests compare against.
#![deny(missing_docs)]

pub mod backend;
mod batch;
pub mod config;
mod error;
mod generate;
pub mod kv_cache;
mod model;
pub mod models;
pub mod rope;
pub mod sampling;
mod session;
pub mod text;
pub mod weights;

#[cfg(feature = "cuda")]
pub use backend::CudaBackend;
pub use backend::{AttentionParams, Backend, CpuBackend, RouterParams, RouterScoring};
pub use batch::WantLogits;
pub use error::{EngineError, Result};
pub use generate::{GenerateOptions, Generation, GenerationStats, StopReason};
pub use kv_cache::{KvDtype, KvLayerSpec};
pub use model::{GenerationDefaults, Model, ModelInfo, ModelOptions, DEFAULT_PREFILL_CHUNK};
pub use models::{Family, SUPPORTED_ARCHITECTURES};
pub use sampling::{Sampler, SamplingParams};
pub use session::{Logits, Session};
pub use text::{ChatMessage, ChatTemplate, StreamDecoder, TextCodec};
pub use weights::{Bytes, ExpertWeights, LinearWeight, WeightLoader};
