//! The unquantized tensor set a [`ShapeSpec`] implies, with HF checkpoint names and shapes (the
//! BF16 release's on-disk layout: per-expert 2-D weights, the family's preferred spelling of each
//! module from its [`TensorAliases`](crate::TensorAliases)).

use crate::shape::{MlpShape, ShapeSpec};
use crate::{ArchError, Result};

/// The input embedding's module name, as every family spells it on disk.
pub const EMBEDDING_MODULE: &str = "model.embed_tokens";

/// The output matrix's module name when it is stored (an untied model).
pub const LM_HEAD_MODULE: &str = "lm_head";

/// One tensor of an unquantized checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorShape {
    /// Full name (`model.layers.0.self_attn.q_proj.weight`).
    pub name: String,
    /// safetensors dtype: the model's, or `F32` for the router's selection bias.
    pub dtype: String,
    /// Shape, outermost first.
    pub shape: Vec<u64>,
}

impl ShapeSpec {
    /// The input embedding `[vocab, hidden]`: the matrix a tied `lm_head` is. Fails like
    /// [`ShapeSpec::tensors`] when no family knows the `model_type`'s tensor names.
    pub fn embedding(&self) -> Result<TensorShape> {
        self.vocab_by_hidden(EMBEDDING_MODULE)
    }

    /// The untied output matrix `lm_head.weight` `[vocab, hidden]` (stored exactly when the model
    /// is untied). Fails like [`ShapeSpec::tensors`] for an unknown `model_type`.
    pub fn lm_head(&self) -> Result<TensorShape> {
        self.vocab_by_hidden(LM_HEAD_MODULE)
    }

    /// `{module}.weight` `[vocab, hidden]` in the checkpoint's dtype, for a known family.
    fn vocab_by_hidden(&self, module: &str) -> Result<TensorShape> {
        self.require_family()?;
        Ok(TensorShape {
            name: format!("{module}.weight"),
            dtype: self.dtype.clone(),
            shape: vec![self.vocab_size, self.hidden_size],
        })
    }

    /// Refuses (naming `model_type`) a shape whose tensor names no family knows.
    fn require_family(&self) -> Result<()> {
        if self.family.is_none() {
            return Err(ArchError::Field {
                file: self.file.clone(),
                field: "model_type".into(),
                reason: format!(
                    "{:?}: its tensor set cannot be derived from the config (known: {}); \
                     inspect the checkpoint directory instead",
                    self.model_type,
                    crate::family::shape_model_types().join(", ")
                ),
            });
        }
        Ok(())
    }

    /// Every tensor of the unquantized checkpoint, in model order. Fails (naming `model_type`)
    /// when no family knows the `model_type`'s tensor names.
    pub fn tensors(&self) -> Result<Vec<TensorShape>> {
        let embedding = self.embedding()?;
        let dt = self.dtype.as_str();
        let h = self.hidden_size;
        let d = self.head_dim;
        let mut out = Vec::new();
        let mut push = |name: String, dtype: &str, shape: Vec<u64>| {
            out.push(TensorShape {
                name,
                dtype: dtype.to_owned(),
                shape,
            });
        };
        push(embedding.name, dt, embedding.shape);
        let first = |names: &[&'static str], what: &str| {
            names.first().copied().ok_or_else(|| ArchError::Field {
                file: self.file.clone(),
                field: "model_type".into(),
                reason: format!("{:?} names no {what}", self.model_type),
            })
        };
        for (i, layer) in self.layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            push(format!("{p}.input_layernorm.weight"), dt, vec![h]);
            push(format!("{p}.post_attention_layernorm.weight"), dt, vec![h]);
            let a = format!("{p}.self_attn");
            let (q, kv) = (layer.q_heads * d, layer.kv_heads * d);
            for (name, rows) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
                push(format!("{a}.{name}.weight"), dt, vec![rows, h]);
                if layer.qkv_bias {
                    push(format!("{a}.{name}.bias"), dt, vec![rows]);
                }
            }
            push(format!("{a}.o_proj.weight"), dt, vec![h, q]);
            if layer.o_bias {
                push(format!("{a}.o_proj.bias"), dt, vec![h]);
            }
            if let Some(g) = layer.gate_width {
                push(format!("{a}.g_proj.weight"), dt, vec![g, h]);
            }
            if layer.qk_norm {
                push(format!("{a}.q_norm.weight"), dt, vec![d]);
                push(format!("{a}.k_norm.weight"), dt, vec![d]);
            }
            let m = format!("{p}.mlp");
            let swiglu =
                |push: &mut dyn FnMut(String, &str, Vec<u64>), prefix: &str, inter: u64| {
                    push(format!("{prefix}.gate_proj.weight"), dt, vec![inter, h]);
                    push(format!("{prefix}.up_proj.weight"), dt, vec![inter, h]);
                    push(format!("{prefix}.down_proj.weight"), dt, vec![h, inter]);
                };
            match &layer.mlp {
                MlpShape::Dense { intermediate } => swiglu(&mut push, &m, *intermediate),
                MlpShape::Moe(moe) => {
                    push(format!("{m}.gate.weight"), dt, vec![moe.experts, h]);
                    if moe.router_bias {
                        let bias = first(&self.aliases.selection_bias, "router selection bias")?;
                        push(format!("{p}.{bias}"), "F32", vec![moe.experts]);
                    }
                    for e in 0..moe.experts {
                        swiglu(&mut push, &format!("{m}.experts.{e}"), moe.intermediate);
                    }
                    if let Some(s) = moe.shared_intermediate {
                        let shared = first(&self.aliases.shared_expert, "shared expert")?;
                        swiglu(&mut push, &format!("{p}.{shared}"), s);
                        if moe.shared_gate {
                            let gate = first(&self.aliases.shared_expert_gate, "shared gate")?;
                            push(format!("{p}.{gate}.weight"), dt, vec![1, h]);
                        }
                    }
                }
            }
        }
        push("model.norm.weight".into(), dt, vec![h]);
        if !self.tie_word_embeddings {
            let head = self.lm_head()?;
            push(head.name, dt, head.shape);
        }
        Ok(out)
    }
}
