//! `GET /v1/models`: [`ModelList`] of [`ModelEntry`]s.

use serde::{Deserialize, Serialize};

/// One served model.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelEntry {
    /// The model name to put in requests.
    pub id: String,
    /// `model`.
    #[serde(default)]
    pub object: String,
    /// Unix seconds (when the server started).
    #[serde(default)]
    pub created: u64,
    /// Who serves it.
    #[serde(default)]
    pub owned_by: String,
    /// vLLM: where the weights come from.
    #[serde(default)]
    pub root: Option<String>,
    /// vLLM: the base model of an adapter.
    #[serde(default)]
    pub parent: Option<String>,
    /// The context length, where the server says (vLLM's `max_model_len`).
    #[serde(default)]
    pub max_model_len: Option<u64>,
}

/// The body of `GET /v1/models`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelList {
    /// `list`.
    #[serde(default)]
    pub object: String,
    /// The served models.
    pub data: Vec<ModelEntry>,
}
