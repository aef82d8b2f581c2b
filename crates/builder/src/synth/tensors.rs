//! The tensors of a Laguna checkpoint, derived from its geometry: names, dtypes and shapes exactly
//! as the on-disk layout of the real release (laguna.md §3.1), and, for the vendor stock NVFP4
//! layout, the compressed-tensors tensors of every routed expert (laguna.md §3.2).

use fp4forge_format::{Dtype, TensorSpec};

use super::geometry::LagunaGeometry;

/// How the values of a synthetic tensor are drawn: `mean + std · N(0, 1)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Init {
    /// Centre of the distribution (1.0 for RMSNorm weights, else 0).
    pub mean: f32,
    /// Standard deviation (1/√fan_in for Linear weights).
    pub std: f32,
}

impl Init {
    /// A Linear weight `[out, fan_in]`: N(0, 1/fan_in), which keeps activations O(1).
    pub fn linear(fan_in: usize) -> Self {
        Self {
            mean: 0.0,
            std: 1.0 / (fan_in.max(1) as f32).sqrt(),
        }
    }

    /// The input embedding: N(0, 0.02²), as `initializer_range` 0.02.
    pub const EMBEDDING: Self = Self {
        mean: 0.0,
        std: 0.02,
    };

    /// An RMSNorm weight: 1 + N(0, 0.1²), near 1 but not all ones.
    pub const NORM: Self = Self {
        mean: 1.0,
        std: 0.1,
    };

    /// The router's `e_score_correction_bias`: N(0, 0.1²), small and non-zero.
    pub const ROUTER_BIAS: Self = Self {
        mean: 0.0,
        std: 0.1,
    };
}

/// One tensor as generated, before any quantization: bf16 (F32 for the router bias).
#[derive(Debug, Clone, PartialEq)]
pub struct SourceTensor {
    /// Checkpoint name, e.g. `model.layers.1.mlp.experts.0.gate_proj.weight`.
    pub name: String,
    /// `BF16`, or `F32` for `e_score_correction_bias`.
    pub dtype: Dtype,
    /// `[out, in]` for Linear weights, `[n]` for norms and the router bias.
    pub shape: Vec<usize>,
    /// The value distribution.
    pub init: Init,
}

impl SourceTensor {
    fn new(name: String, dtype: Dtype, shape: Vec<usize>, init: Init) -> Self {
        Self {
            name,
            dtype,
            shape,
            init,
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// One piece of work of the generator: what it produces and writes in one go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unit {
    /// Source tensor `.0`, written as generated.
    Plain(usize),
    /// A routed expert quantized to NVFP4 W4A4: source tensors of its gate, up and down
    /// projections (gate/up share a global scale), in layer `layer`.
    Expert {
        layer: usize,
        gate: usize,
        up: usize,
        down: usize,
    },
}

/// The module prefix of routed expert `expert` of layer `layer`.
fn expert_prefix(layer: usize, expert: usize) -> String {
    format!("model.layers.{layer}.mlp.experts.{expert}")
}

/// Every tensor of the bf16 checkpoint, in model order: `model.embed_tokens.weight`, then each
/// layer (norms, attention q/k/v/o/g and q/k norms, then the dense MLP or the router, its
/// correction bias, the routed experts and the shared expert), then `model.norm.weight` and
/// `lm_head.weight` (absent when tied).
pub fn source_tensors(geometry: &LagunaGeometry) -> Vec<SourceTensor> {
    let g = geometry;
    let h = g.hidden_size;
    let bf16 = |name: String, shape: Vec<usize>, init: Init| {
        SourceTensor::new(name, Dtype::BF16, shape, init)
    };
    let linear = |name: String, out: usize, fan_in: usize| {
        SourceTensor::new(name, Dtype::BF16, vec![out, fan_in], Init::linear(fan_in))
    };
    let mut out = vec![bf16(
        "model.embed_tokens.weight".into(),
        vec![g.vocab_size, h],
        Init::EMBEDDING,
    )];
    for (i, layer) in g.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        let q = layer.q_heads * g.head_dim;
        let kv = g.kv_heads * g.head_dim;
        out.push(bf16(
            format!("{p}.input_layernorm.weight"),
            vec![h],
            Init::NORM,
        ));
        out.push(linear(format!("{p}.self_attn.q_proj.weight"), q, h));
        out.push(linear(format!("{p}.self_attn.k_proj.weight"), kv, h));
        out.push(linear(format!("{p}.self_attn.v_proj.weight"), kv, h));
        out.push(linear(format!("{p}.self_attn.o_proj.weight"), h, q));
        if let Some(rows) = layer.gate_rows {
            out.push(linear(format!("{p}.self_attn.g_proj.weight"), rows, h));
        }
        out.push(bf16(
            format!("{p}.self_attn.q_norm.weight"),
            vec![g.head_dim],
            Init::NORM,
        ));
        out.push(bf16(
            format!("{p}.self_attn.k_norm.weight"),
            vec![g.head_dim],
            Init::NORM,
        ));
        out.push(bf16(
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            Init::NORM,
        ));
        match layer.dense_intermediate {
            Some(inter) => swiglu(&mut out, &format!("{p}.mlp"), h, inter),
            None => {
                out.push(linear(format!("{p}.mlp.gate.weight"), g.num_experts, h));
                out.push(SourceTensor::new(
                    format!("{p}.mlp.experts.e_score_correction_bias"),
                    Dtype::F32,
                    vec![g.num_experts],
                    Init::ROUTER_BIAS,
                ));
                for e in 0..g.num_experts {
                    swiglu(&mut out, &expert_prefix(i, e), h, g.moe_intermediate);
                }
                if let Some(inter) = g.shared_intermediate {
                    swiglu(&mut out, &format!("{p}.mlp.shared_expert"), h, inter);
                }
            }
        }
    }
    out.push(bf16("model.norm.weight".into(), vec![h], Init::NORM));
    if !g.tie_word_embeddings {
        out.push(linear("lm_head.weight".into(), g.vocab_size, h));
    }
    out
}

/// `P.gate_proj`, `P.up_proj` `[inter, hidden]` and `P.down_proj` `[hidden, inter]`.
fn swiglu(out: &mut Vec<SourceTensor>, prefix: &str, hidden: usize, inter: usize) {
    for proj in ["gate_proj", "up_proj"] {
        out.push(SourceTensor::new(
            format!("{prefix}.{proj}.weight"),
            Dtype::BF16,
            vec![inter, hidden],
            Init::linear(hidden),
        ));
    }
    out.push(SourceTensor::new(
        format!("{prefix}.down_proj.weight"),
        Dtype::BF16,
        vec![hidden, inter],
        Init::linear(inter),
    ));
}

/// The four compressed-tensors tensors that replace `P.weight` `[rows, cols]` in a W4A4 NVFP4
/// module: `weight_packed` U8 `[rows, cols/2]`, `weight_scale` F8_E4M3 `[rows, cols/16]`,
/// `weight_global_scale` F32 `[1]`, `input_global_scale` F32 `[1]`.
pub fn nvfp4_w4a4_specs(prefix: &str, rows: usize, cols: usize) -> [TensorSpec; 4] {
    [
        TensorSpec::new(
            format!("{prefix}.weight_packed"),
            Dtype::U8,
            [rows, cols / 2],
        ),
        TensorSpec::new(
            format!("{prefix}.weight_scale"),
            Dtype::F8_E4M3,
            [rows, cols / 16],
        ),
        TensorSpec::new(format!("{prefix}.weight_global_scale"), Dtype::F32, [1]),
        TensorSpec::new(format!("{prefix}.input_global_scale"), Dtype::F32, [1]),
    ]
}

/// The Linear modules of the model in model order (per layer q/k/v/o/g_proj, then the dense
/// `mlp.{gate,up,down}_proj` or the router `mlp.gate`, the routed experts' projections when
/// `with_experts`, and `mlp.shared_expert.{gate,up,down}_proj`; finally `lm_head`).
pub fn linear_modules(geometry: &LagunaGeometry, with_experts: bool) -> Vec<String> {
    let mut out = Vec::new();
    for (i, layer) in geometry.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        for proj in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            out.push(format!("{p}.self_attn.{proj}"));
        }
        if layer.gate_rows.is_some() {
            out.push(format!("{p}.self_attn.g_proj"));
        }
        let swiglu = |out: &mut Vec<String>, prefix: &str| {
            for proj in ["gate_proj", "up_proj", "down_proj"] {
                out.push(format!("{prefix}.{proj}"));
            }
        };
        if layer.dense_intermediate.is_some() {
            swiglu(&mut out, &format!("{p}.mlp"));
        } else {
            out.push(format!("{p}.mlp.gate"));
            if with_experts {
                for e in 0..geometry.num_experts {
                    swiglu(&mut out, &expert_prefix(i, e));
                }
            }
            if geometry.shared_intermediate.is_some() {
                swiglu(&mut out, &format!("{p}.mlp.shared_expert"));
            }
        }
    }
    if !geometry.tie_word_embeddings {
        out.push("lm_head".into());
    }
    out
}

/// The checkpoint to write: what is generated (`sources`), what is declared on disk (`specs`, in
/// data order) and the work units that turn the one into the other.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub sources: Vec<SourceTensor>,
    pub specs: Vec<TensorSpec>,
    pub units: Vec<Unit>,
}

impl Layout {
    /// The bf16 layout (`stock == false`), or the vendor stock layout: routed experts as NVFP4
    /// W4A4, everything else as in the bf16 layout.
    pub fn new(geometry: &LagunaGeometry, stock: bool) -> Self {
        let sources = source_tensors(geometry);
        let mut specs = Vec::with_capacity(sources.len() * if stock { 4 } else { 1 });
        let mut units = Vec::with_capacity(sources.len());
        let mut i = 0;
        while i < sources.len() {
            let s = &sources[i];
            if stock {
                if let Some(layer) = routed_expert_layer(&s.name) {
                    // Experts are emitted as gate, up, down (see `swiglu`).
                    for src in &sources[i..i + 3] {
                        let prefix = src.name.strip_suffix(".weight").unwrap_or(&src.name);
                        specs.extend(nvfp4_w4a4_specs(prefix, src.shape[0], src.shape[1]));
                    }
                    units.push(Unit::Expert {
                        layer,
                        gate: i,
                        up: i + 1,
                        down: i + 2,
                    });
                    i += 3;
                    continue;
                }
            }
            specs.push(TensorSpec::new(s.name.clone(), s.dtype, s.shape.clone()));
            units.push(Unit::Plain(i));
            i += 1;
        }
        Self {
            sources,
            specs,
            units,
        }
    }
}

/// The layer of a routed expert projection weight `model.layers.L.mlp.experts.E.*_proj.weight`.
fn routed_expert_layer(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let rest = rest.strip_prefix("mlp.experts.")?;
    let (expert, proj) = rest.split_once('.')?;
    expert.parse::<usize>().ok()?;
    matches!(
        proj,
        "gate_proj.weight" | "up_proj.weight" | "down_proj.weight"
    )
    .then(|| layer.parse().ok())
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routed_expert_names_are_recognised() {
        assert_eq!(
            routed_expert_layer("model.layers.7.mlp.experts.12.down_proj.weight"),
            Some(7)
        );
        assert_eq!(
            routed_expert_layer("model.layers.7.mlp.experts.e_score_correction_bias"),
            None
        );
        assert_eq!(
            routed_expert_layer("model.layers.7.mlp.shared_expert.up_proj.weight"),
            None
        );
        assert_eq!(
            routed_expert_layer("model.layers.0.mlp.up_proj.weight"),
            None
        );
    }
}
