//! fp4forge-engine: runs lean NVFP4 builds (and bf16 originals) of decoder LLMs natively.
//!
//! # The life of a token
//!
//! ```text
//! open(device, dir, opts, f) Device → backend type (the one place that knows them); then
//! Model::load(dir)          config.json → fp4forge_arch::ArchSpec (Llama | Laguna | Qwen3-MoE)
//!                           → every tensor it names found, its dtype and shape checked; weights
//!                           borrowed from the mmap, packed NVFP4 stays packed (resident memory
//!                           ≈ file size) → an ir::Decoder
//! model.new_session()       an empty KV cache per layer (ring of `window` slots for sliding
//!                           layers, growing for full ones; bf16, fp8 or f32)
//! session.prefill(ids)      a pass with a batch of one, per prefill chunk:
//! forward(b, net, chunks)   THE pass, over many sequences' chunks at once (a session's step, a
//!                           continuous-batching step, a draft chunk to verify):
//!   b.fused_pass(..)?       first the backend may run the whole pass its own way (CUDA: one
//!                           token of one sequence on fused launches); otherwise the generic ops:
//!   embed                   token ids cross into the backend once, as an embedding lookup
//!   for each layer:         x += Attn(RMSNorm(x)):  q,k,v = linear → [q/k norm] → RoPE →
//!                                                    causal attention over cache + chunk (per
//!                                                    sequence) → [softplus head gate] → o_proj
//!                           x += MLP(RMSNorm(x)):   SwiGLU, or router → top-k experts
//!                                                    (+ shared expert)
//!   logits = RMSNorm(x) · lm_headᵀ   only the rows each chunk wants (`Want`), left on the device
//! sampler / b.sample(..)    greedy / temperature, top-k, top-p, seeded; on the device where the
//!                           backend samples (only the token id crosses back), else on the host
//! model.forward_batch(..)   what a scheduler calls: one pass for many sessions, checked once
//! ```
//!
//! Everything between the ids going in and the logits coming out happens behind the
//! [`Backend`] trait: the model's geometry (`fp4forge_arch`) says *what* to compute, the loader
//! ([`models`]) builds it into an [`ir::Decoder`], [`forward()`] runs it, and a backend (CPU, or
//! CUDA behind a feature) says *how*, on memory it owns. Activations are f32 throughout, the
//! precision of the reference logits the tests compare against.
#![deny(missing_docs)]

pub mod backend;
mod batch;
pub mod config;
pub mod constraint;
mod device;
mod error;
pub mod forward;
mod generate;
pub mod ir;
pub mod kv_cache;
pub mod logits;
pub mod logprobs;
mod model;
pub mod models;
pub mod rope;
pub mod sampling;
mod session;
pub mod text;
pub mod weights;

pub use backend::cpu::{CpuActivations, CpuIsa, ParseCpuActivationsError, ParseCpuIsaError};
#[cfg(feature = "cuda")]
pub use backend::CudaBackend;
pub use backend::{Backend, CpuBackend, KvLimit, KvMemory, LogprobRequest, SampleRequest};
pub use constraint::Constraint;
pub use device::{open, Device, ParseDeviceError, WithModel};
pub use error::{EngineError, Result};
pub use forward::forward;
pub use fp4forge_format::LoadFormat;
pub use generate::{GenerateOptions, Generation, GenerationStats, StopReason};
pub use ir::{
    AttentionParams, KvDtype, KvLayerSpec, ParseKvDtypeError, Resident, RouterParams,
    RouterScoring, SeqChunk, Want,
};
pub use logits::LogitsAdjust;
pub use logprobs::{token_logprob, LogprobSpec, TokenLogprob};
pub use model::{
    GenerationDefaults, Model, ModelInfo, ModelOptions, DEFAULT_PREFILL_CHUNK,
    DEFAULT_PREFILL_CHUNK_GPU,
};
pub use models::{Family, SUPPORTED_ARCHITECTURES};
pub use sampling::{Sampler, SamplingParams, GREEDY_BELOW_TEMPERATURE};
pub use session::{Logits, Output, Session};
pub use text::{to_python_json, ChatInput, ChatMessage, ChatTemplate, StreamDecoder, TextCodec};
pub use weights::{Bytes, ExpertWeights, LinearWeight, WeightLoader};
