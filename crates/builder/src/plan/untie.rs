//! `--untie-lm-head`: a tied model's output matrix (the input embedding) written as its own
//! `lm_head`, quantized to NVFP4 exactly like any other targeted Linear (its own global scale),
//! with `tie_word_embeddings: false` in the output config. The embedding itself is copied byte
//! for byte; the geometry ([`fp4forge_arch::ShapeSpec`]) names it and says whether the model
//! is tied.
//!
//! A tied model's `lm_head` is the embedding, half of the bytes a small model reads per decoded
//! token; untied and quantized it is a quarter of that. vLLM and transformers load the output as
//! any untied checkpoint whose `quantization_config` targets `lm_head` by name (vLLM's
//! `ParallelLMHead` is no `Linear` class, so the new group names `lm_head` explicitly).

use fp4forge_arch::{ShapeSpec, Tied, EMBEDDING_MODULE, LM_HEAD_MODULE};
use fp4forge_format::checkpoint::TensorInfo;
use fp4forge_format::config::Field;
use fp4forge_format::{Dtype, ModelConfig};
use serde::Serialize;
use serde_json::Value;

use crate::BuilderError;

/// The flag, as errors name it.
pub const FLAG: &str = "--untie-lm-head";

/// Where an untied `lm_head` comes from: the tied model's embedding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UntieLmHead {
    /// The embedding tensor whose values become `lm_head` (`model.embed_tokens.weight`).
    pub embedding: String,
    /// The new module (`lm_head`): `lm_head.weight_packed`, `.weight_scale`,
    /// `.weight_global_scale`.
    pub module: String,
}

fn refuse(reason: impl Into<String>) -> BuilderError {
    BuilderError::Untie {
        reason: reason.into(),
    }
}

/// Whether the checkpoint stores an `lm_head` module (high precision or packed).
fn stored_lm_head(tensors: &[TensorInfo]) -> Option<&TensorInfo> {
    tensors.iter().find(|t| {
        t.name
            .strip_prefix(LM_HEAD_MODULE)
            .and_then(|rest| rest.strip_prefix('.'))
            .is_some_and(|leaf| leaf == "weight" || leaf == "weight_packed")
    })
}

/// Resolves `--untie-lm-head` for a checkpoint with geometry `shape` and `tensors`. Refuses,
/// naming the flag and the tensor: a model that is not tied (it stores `lm_head`, or its config
/// says `tie_word_embeddings: false`), a `model_type` whose embedding the geometry does not name,
/// a missing embedding, and an embedding that is already quantized.
pub fn resolve(shape: &ShapeSpec, tensors: &[TensorInfo]) -> Result<UntieLmHead, BuilderError> {
    if let Some(head) = stored_lm_head(tensors) {
        return Err(refuse(if head.name.ends_with(".weight_packed") {
            format!(
                "the model is not tied: it already stores a quantized lm_head ({})",
                head.name
            )
        } else {
            format!(
                "the model is not tied: it already stores {} (quantize it with --targets {LM_HEAD_MODULE} or --targets Linear)",
                head.name
            )
        }));
    }
    if shape.tied == Tied::No {
        return Err(refuse(format!(
            "the model is not tied: {} says tie_word_embeddings: false (and stores no {LM_HEAD_MODULE}.weight)",
            shape.file.display()
        )));
    }
    let embedding = shape
        .embedding()
        .map_err(|e| refuse(format!("the geometry names no input embedding: {e}")))?;
    let Some(info) = tensors.iter().find(|t| t.name == embedding.name) else {
        let packed = format!("{EMBEDDING_MODULE}.weight_packed");
        return Err(if tensors.iter().any(|t| t.name == packed) {
            refuse(format!(
                "the embedding is already quantized ({packed}); lm_head needs its high-precision values"
            ))
        } else {
            refuse(format!(
                "the checkpoint has no {} (the embedding the geometry names)",
                embedding.name
            ))
        });
    };
    if !matches!(info.dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32) {
        return Err(refuse(format!(
            "the embedding {} is already quantized (dtype {}); lm_head needs bf16, f16 or f32 values",
            info.name, info.dtype
        )));
    }
    if info.shape.len() != 2 {
        return Err(refuse(format!(
            "the embedding {} is stored {:?}, not 2-D [vocab, hidden]",
            info.name, info.shape
        )));
    }
    Ok(UntieLmHead {
        embedding: info.name.clone(),
        module: LM_HEAD_MODULE.to_string(),
    })
}

/// Rewrites `config` as untied: `tie_word_embeddings: false` at the top level, and in a nested
/// `text_config` where that holds the flag. Nothing else changes.
pub fn untie_config(config: &mut ModelConfig) {
    config.tie_word_embeddings = Field::Set(false);
    if let Some(Value::Object(text)) = config.extra.get_mut("text_config") {
        if text.contains_key("tie_word_embeddings") {
            text.insert("tie_word_embeddings".into(), Value::Bool(false));
        }
    }
}

/// Whether `config` says untied (`tie_word_embeddings: false` at the top level, and in a nested
/// `text_config` wherever that states the flag).
pub fn config_is_untied(config: &ModelConfig) -> bool {
    let nested_ok = match config.extra.get("text_config") {
        Some(Value::Object(text)) => text
            .get("tie_word_embeddings")
            .is_none_or(|v| v == &Value::Bool(false)),
        _ => true,
    };
    config.tie_word_embeddings.value() == Some(false) && nested_ok
}

/// `config` (as JSON) with the tie flags removed, to compare two configs apart from them.
pub fn without_tie_flags(mut config: Value) -> Value {
    if let Value::Object(map) = &mut config {
        map.remove("tie_word_embeddings");
        if let Some(Value::Object(text)) = map.get_mut("text_config") {
            text.remove("tie_word_embeddings");
        }
    }
    config
}
