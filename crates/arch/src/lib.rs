//! What a model is: the one reader of model geometry.
//!
//! A Hugging Face checkpoint describes its network in `config.json`, in a schema that differs by
//! family (Laguna lists query heads per layer and nests rope parameters per layer type; Llama
//! has one rope and maybe a bare `sliding_window`; Qwen3-MoE picks dense layers by
//! `mlp_only_layers` and `decoder_sparse_step`). This crate reads that file once, with the family
//! `architectures[0]` names, into one typed [`ArchSpec`]:
//!
//! - per layer, the attention ([`AttentionSpec`]: q and KV heads, head width, sliding window or
//!   full, which rope, q/k norm, biases, output gate) and the MLP ([`MlpSpec`]: a dense SwiGLU or
//!   a MoE with its router: softmax or sigmoid scoring, top-k, renormalisation, selection bias,
//!   routed scaling, shared expert);
//! - the rotary embeddings, one per layer type ([`Rope`]: θ, partial rotary width, scaling);
//! - vocabulary, ε, context length, tied embeddings, and the tensor-name spellings each family
//!   accepts ([`TensorAliases`]).
//!
//! Byte accounting (the builder's `inspect`) reads a lenient [`ShapeSpec`] instead: sizes only,
//! from partial configs (no ε, no rope, no `architectures`) and from `model_type`s the engine
//! does not run, with the unquantized tensor set it implies ([`ShapeSpec::tensors`]).
//!
//! Consumers (the engine's loader, the builder's inspect and synth) take the `ArchSpec` or the
//! `ShapeSpec` and never read geometry from JSON themselves. Every error names the file and the field
//! ([`ArchError`]); a missing field takes a default only where transformers' config class has
//! that default, and each family's file says which.
//!
//! A new family is one file in `families/` plus its [`Family`] variant.

#![deny(missing_docs)]

mod error;
mod families;
mod family;
mod fields;
mod layout;
mod rope;
mod shape;
mod spec;

pub use error::{ArchError, Result};
pub use family::{Family, SUPPORTED_ARCHITECTURES};
pub use fields::ConfigJson;
pub use layout::{TensorShape, EMBEDDING_MODULE, LM_HEAD_MODULE};
pub use rope::{Rope, RopeScaling};
pub use shape::{AttentionKind, LayerShape, MlpShape, MoeShape, ShapeSpec};
pub use spec::{
    ArchSpec, AttentionSpec, LayerSpec, MlpSpec, MoeSpec, OutputGate, Presence, RouterScoring,
    RouterSpec, TensorAliases, Tied,
};
