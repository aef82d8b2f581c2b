//! Hugging Face `config.json`: the fields fp4forge reads, everything else kept as written.

use std::path::Path;

use serde_json::Value;

use super::field::json_object;
use super::QuantizationConfig;
use crate::checkpoint::CheckpointError;
use crate::fsutil::write_file_atomic;

json_object! {
    /// A model's `config.json`. Only the keys fp4forge uses are typed; all others stay in
    /// `extra`, and writing back gives the same JSON (keys, `null`s, order).
    pub struct ModelConfig {
        /// Model classes, e.g. `["LagunaForCausalLM"]`.
        architectures: Vec<String> = "architectures",
        /// transformers 5 spelling of the weights' dtype, e.g. `"bfloat16"`.
        dtype: String = "dtype",
        /// Per-head width.
        head_dim: usize = "head_dim",
        /// Residual stream width.
        hidden_size: usize = "hidden_size",
        /// Dense MLP width.
        intermediate_size: usize = "intermediate_size",
        /// Attention kind per layer (`full_attention`, `sliding_attention`).
        layer_types: Vec<String> = "layer_types",
        /// Longest supported context.
        max_position_embeddings: usize = "max_position_embeddings",
        /// MLP kind per layer (`dense`, `sparse`).
        mlp_layer_types: Vec<String> = "mlp_layer_types",
        /// Layers with a dense MLP instead of experts.
        mlp_only_layers: Vec<usize> = "mlp_only_layers",
        /// Routed expert MLP width.
        moe_intermediate_size: usize = "moe_intermediate_size",
        /// transformers model type, e.g. `"laguna"`.
        model_type: String = "model_type",
        /// Query heads (default for every layer).
        num_attention_heads: usize = "num_attention_heads",
        /// Query heads of each layer, where they vary.
        num_attention_heads_per_layer: Vec<usize> = "num_attention_heads_per_layer",
        /// Routed experts per MoE layer.
        num_experts: usize = "num_experts",
        /// Experts each token is routed to.
        num_experts_per_tok: usize = "num_experts_per_tok",
        /// Decoder layers.
        num_hidden_layers: usize = "num_hidden_layers",
        /// Key/value heads.
        num_key_value_heads: usize = "num_key_value_heads",
        /// The quantization of the checkpoint, if any.
        quantization_config: QuantizationConfig = "quantization_config",
        /// RoPE settings, possibly nested per layer type.
        rope_parameters: Value = "rope_parameters",
        /// Shared expert MLP width.
        shared_expert_intermediate_size: usize = "shared_expert_intermediate_size",
        /// Sliding attention window.
        sliding_window: usize = "sliding_window",
        /// Whether lm_head shares the embedding's weights.
        tie_word_embeddings: bool = "tie_word_embeddings",
        /// transformers 4 spelling of the weights' dtype.
        torch_dtype: String = "torch_dtype",
        /// Vocabulary size.
        vocab_size: usize = "vocab_size",
    }
}

impl ModelConfig {
    /// Reads and parses the `config.json` at `path`.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, CheckpointError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| CheckpointError::io(path, e))?;
        Self::from_slice(path, &bytes)
    }

    /// Parses `config.json` bytes; `path` only names the file in errors.
    pub fn from_slice(path: &Path, bytes: &[u8]) -> Result<Self, CheckpointError> {
        serde_json::from_slice(bytes).map_err(|source| CheckpointError::Json {
            path: path.to_path_buf(),
            source,
        })
    }

    /// The config as transformers writes it: two-space indented JSON and a final newline.
    pub fn to_json_pretty(&self) -> String {
        // Maps with string keys and JSON values always serialize.
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }

    /// Writes the config to `path` atomically (see [`write_file_atomic`]).
    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), CheckpointError> {
        write_file_atomic(path, self.to_json_pretty().as_bytes())
    }

    /// The weights' dtype name: `dtype` (transformers 5), else `torch_dtype`.
    pub fn weights_dtype(&self) -> Option<&str> {
        self.dtype
            .get()
            .or(self.torch_dtype.get())
            .map(String::as_str)
    }
}
