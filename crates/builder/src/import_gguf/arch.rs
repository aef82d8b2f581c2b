//! The model geometry a GGUF declares (`{arch}.*` metadata), checked against its tensors, and
//! the `config.json` / `generation_config.json` transformers needs for it.

use std::path::Path;

use fp4forge_arch::{ArchSpec, ConfigJson, MlpSpec, Tied};
use fp4forge_format::gguf::{GgufHeader, MetadataValue};
use serde_json::{json, Value};

use crate::BuilderError;

/// The GGUF architectures this importer converts, with their transformers class.
pub const SUPPORTED_ARCHITECTURES: [(&str, &str); 2] =
    [("llama", "LlamaForCausalLM"), ("qwen2", "Qwen2ForCausalLM")];

/// GGUF model family: decides the config class and whether Q/K rows are permuted in the GGUF.
/// Finer than [`fp4forge_arch::Family`] (both are its Llama family, with two spellings), which
/// is why it stays here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    /// `llama` (Llama, SmolLM2, Mistral): Q/K rows permuted by llama.cpp's converter.
    Llama,
    /// `qwen2`: NeoX RoPE, stored unpermuted; q/k/v biases.
    Qwen2,
}

impl Family {
    /// The `fp4forge_arch` family whose config schema the written `config.json` follows (both
    /// GGUF families become Llama-family configs: Llama's or Qwen2's spelling).
    fn arch_family(self) -> fp4forge_arch::Family {
        match self {
            Family::Llama | Family::Qwen2 => fp4forge_arch::Family::Llama,
        }
    }
}

/// Everything config.json needs, read from the GGUF metadata.
#[derive(Debug, Clone)]
pub(crate) struct Geometry {
    pub family: Family,
    pub arch: String,
    pub n_layers: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub rms_eps: f64,
    pub rope_theta: f64,
    pub context: u64,
    pub vocab: usize,
    pub tied: bool,
    pub attention_bias: bool,
    pub bos: Option<u64>,
    pub eos: Option<u64>,
    pub pad: Option<u64>,
    pub eot: Option<u64>,
}

pub(crate) fn import_error(file: &Path, reason: impl Into<String>) -> BuilderError {
    BuilderError::Import {
        file: file.to_path_buf(),
        reason: reason.into(),
    }
}

/// An `f32` metadata value as the shortest decimal that reads back as the same `f32` (so
/// `1e-5f32` is written `1e-5`, not `9.999999747378752e-6`); other numbers as they are.
fn decimal(h: &GgufHeader, key: &str) -> Result<Option<f64>, BuilderError> {
    Ok(match h.get(key) {
        Some(MetadataValue::F32(v)) => v.to_string().parse::<f64>().ok(),
        _ => h.f64_opt(key)?,
    })
}

fn usize_of(file: &Path, key: &str, v: u64) -> Result<usize, BuilderError> {
    usize::try_from(v)
        .ok()
        .filter(|&n| n > 0 && n < (1 << 40))
        .ok_or_else(|| import_error(file, format!("metadata `{key}` = {v} is out of range")))
}

impl Geometry {
    /// Reads and checks the geometry; `vocab_from_tokens` is the tokenizer's size, if it has one.
    pub(crate) fn read(
        h: &GgufHeader,
        vocab_from_tokens: Option<usize>,
    ) -> Result<Self, BuilderError> {
        let file = h.path().to_path_buf();
        let arch = h.str("general.architecture")?.to_owned();
        let family = match arch.as_str() {
            "llama" => Family::Llama,
            "qwen2" => Family::Qwen2,
            other => {
                let list: Vec<_> = SUPPORTED_ARCHITECTURES.iter().map(|(a, _)| *a).collect();
                return Err(import_error(
                    &file,
                    format!(
                        "architecture `{other}` is not supported (supported: {})",
                        list.join(", ")
                    ),
                ));
            }
        };
        let key = |k: &str| format!("{arch}.{k}");
        let req = |k: &str| -> Result<usize, BuilderError> {
            let k = key(k);
            usize_of(&file, &k, h.u64(&k)?)
        };
        let opt = |k: &str| -> Result<Option<usize>, BuilderError> {
            let k = key(k);
            h.u64_opt(&k)?.map(|v| usize_of(&file, &k, v)).transpose()
        };
        if let Some(n) = h.u64_opt(&key("expert_count"))? {
            if n > 0 {
                return Err(import_error(
                    &file,
                    format!(
                        "`{}` = {n}: Mixture-of-Experts GGUFs are not supported",
                        key("expert_count")
                    ),
                ));
            }
        }
        if let Some(kind) = h.str_opt(&key("rope.scaling.type"))? {
            if kind != "none" {
                return Err(import_error(
                    &file,
                    format!(
                        "`{}` = {kind:?}: RoPE scaling is not supported",
                        key("rope.scaling.type")
                    ),
                ));
            }
        }
        let n_layers = req("block_count")?;
        let hidden = req("embedding_length")?;
        let intermediate = req("feed_forward_length")?;
        let n_head = req("attention.head_count")?;
        let n_head_kv = opt("attention.head_count_kv")?.unwrap_or(n_head);
        let head_dim = match opt("attention.key_length")? {
            Some(d) => d,
            None if hidden % n_head == 0 => hidden / n_head,
            None => {
                return Err(import_error(
                    &file,
                    format!(
                    "hidden size {hidden} is not a multiple of {n_head} heads and `{}` is absent",
                    key("attention.key_length")
                ),
                ))
            }
        };
        if let Some(v) = opt("attention.value_length")? {
            if v != head_dim {
                return Err(import_error(
                    &file,
                    format!("value head size {v} differs from key head size {head_dim}"),
                ));
            }
        }
        if n_head % n_head_kv != 0 {
            return Err(import_error(
                &file,
                format!("{n_head} query heads are not a multiple of {n_head_kv} key/value heads"),
            ));
        }
        if head_dim % 2 != 0 {
            return Err(import_error(&file, format!("odd head size {head_dim}")));
        }
        if let Some(rot) = opt("rope.dimension_count")? {
            if rot != head_dim {
                return Err(import_error(
                    &file,
                    format!("partial rotary embedding ({rot} of {head_dim} dimensions) is not supported"),
                ));
            }
        }
        let rms_key = key("attention.layer_norm_rms_epsilon");
        let rms_eps = decimal(h, &rms_key)?
            .ok_or_else(|| import_error(&file, format!("metadata `{rms_key}`: missing")))?;
        let rope_theta = decimal(h, &key("rope.freq_base"))?.unwrap_or(10000.0);
        let context = h.u64(&key("context_length"))?;
        let vocab = match (opt("vocab_size")?, vocab_from_tokens) {
            (Some(v), _) => v,
            (None, Some(v)) => v,
            (None, None) => {
                let rows = h
                    .tensor("token_embd.weight")
                    .and_then(|t| t.dims.get(1).copied());
                usize_of(&file, "token_embd.weight rows", rows.unwrap_or(0))?
            }
        };
        Ok(Self {
            family,
            n_layers,
            hidden,
            intermediate,
            n_head,
            n_head_kv,
            head_dim,
            rms_eps,
            rope_theta,
            context,
            vocab,
            tied: h.tensor("output.weight").is_none(),
            attention_bias: h.tensor("blk.0.attn_q.bias").is_some(),
            bos: h.u64_opt("tokenizer.ggml.bos_token_id")?,
            eos: h.u64_opt("tokenizer.ggml.eos_token_id")?,
            pad: h.u64_opt("tokenizer.ggml.padding_token_id")?,
            eot: h.u64_opt("tokenizer.ggml.eot_token_id")?,
            arch,
        })
    }

    /// The transformers class.
    pub(crate) fn class(&self) -> &'static str {
        match self.family {
            Family::Llama => "LlamaForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
        }
    }

    /// The HF shape (outermost first) that tensor `leaf`/`kind` must have.
    pub(crate) fn expected_shape(&self, leaf: &str, kind: &str) -> Option<Vec<usize>> {
        let (q, kv) = (self.n_head * self.head_dim, self.n_head_kv * self.head_dim);
        let w = match leaf {
            "embed_tokens" | "lm_head" => vec![self.vocab, self.hidden],
            "norm" | "input_layernorm" | "post_attention_layernorm" => vec![self.hidden],
            "q_proj" => vec![q, self.hidden],
            "k_proj" | "v_proj" => vec![kv, self.hidden],
            "o_proj" => vec![self.hidden, q],
            "gate_proj" | "up_proj" => vec![self.intermediate, self.hidden],
            "down_proj" => vec![self.hidden, self.intermediate],
            _ => return None,
        };
        Some(if kind == "bias" { vec![w[0]] } else { w })
    }

    /// The number of heads whose RoPE rows llama.cpp permuted in tensor `leaf`, if any.
    pub(crate) fn permuted_heads(&self, leaf: &str) -> Option<usize> {
        match (self.family, leaf) {
            (Family::Llama, "q_proj") => Some(self.n_head),
            (Family::Llama, "k_proj") => Some(self.n_head_kv),
            _ => None,
        }
    }

    /// `config.json`.
    pub(crate) fn config_json(&self) -> Value {
        let mut c = json!({
            "architectures": [self.class()],
            "model_type": self.arch,
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "bos_token_id": self.bos,
            "eos_token_id": self.eos,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden,
            "initializer_range": 0.02,
            "intermediate_size": self.intermediate,
            "max_position_embeddings": self.context,
            "mlp_bias": false,
            "num_attention_heads": self.n_head,
            "num_hidden_layers": self.n_layers,
            "num_key_value_heads": self.n_head_kv,
            "pretraining_tp": 1,
            "rms_norm_eps": self.rms_eps,
            "rope_scaling": null,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tied,
            "torch_dtype": "bfloat16",
            "use_cache": true,
            "vocab_size": self.vocab,
        });
        if let Some(pad) = self.pad {
            c["pad_token_id"] = json!(pad);
        }
        if self.family == Family::Qwen2 {
            let o = c.as_object_mut().expect("object");
            for k in ["attention_bias", "mlp_bias", "pretraining_tp", "head_dim"] {
                o.shift_remove(k);
            }
            o.insert("use_sliding_window".into(), json!(false));
            o.insert("sliding_window".into(), json!(self.context));
            o.insert("max_window_layers".into(), json!(self.n_layers));
        }
        c
    }

    /// Reads [`Self::config_json`] back with `fp4forge_arch` (the engine's one reader of
    /// geometry) and checks that it describes this GGUF's model: the config written is one the
    /// engine runs, with the shapes the tensors have. `file` names the GGUF in errors.
    pub(crate) fn check_with_arch(&self, file: &Path) -> Result<(), BuilderError> {
        let Value::Object(map) = self.config_json() else {
            return Err(import_error(file, "config.json is not an object"));
        };
        let cfg = ConfigJson::from_map(Path::new("config.json"), map);
        let spec = ArchSpec::from_config(&cfg)
            .map_err(|e| import_error(file, format!("the config.json it implies: {e}")))?;
        let layers_agree = spec.layers.len() == self.n_layers
            && spec.layers.iter().all(|l| {
                let a = &l.attention;
                (a.q_heads, a.kv_heads, a.head_dim) == (self.n_head, self.n_head_kv, self.head_dim)
                    && a.window.is_none()
                    && l.mlp
                        == MlpSpec::Dense {
                            intermediate: self.intermediate,
                        }
            });
        let tied = match spec.tie_word_embeddings {
            Tied::Yes => true,
            Tied::No => false,
            Tied::IfNoLmHead => self.tied,
        };
        if spec.family != self.family.arch_family()
            || (spec.hidden_size, spec.vocab_size) != (self.hidden, self.vocab)
            || tied != self.tied
            || !layers_agree
        {
            return Err(import_error(
                file,
                format!("the config.json it implies reads back as a different model: {spec:?}"),
            ));
        }
        Ok(())
    }

    /// `generation_config.json`: bos, eos (plus end-of-turn when the GGUF names a distinct one),
    /// pad.
    pub(crate) fn generation_config_json(&self) -> Value {
        let eos = match (self.eos, self.eot) {
            (Some(e), Some(t)) if e != t => json!([e, t]),
            (Some(e), _) => json!(e),
            (None, Some(t)) => json!(t),
            (None, None) => Value::Null,
        };
        let mut g = json!({ "bos_token_id": self.bos, "eos_token_id": eos });
        if let Some(pad) = self.pad {
            g["pad_token_id"] = json!(pad);
        }
        g
    }
}
