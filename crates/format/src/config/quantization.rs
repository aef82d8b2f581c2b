//! compressed-tensors `quantization_config` (spec §3): config, schemes and their arguments.

use indexmap::IndexMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use super::field::json_object;
use super::Field;

/// The compressed-tensors version whose output the presets reproduce.
pub const CT_VERSION: &str = "0.20.1";

/// The compression format of NVFP4 in compressed-tensors.
pub const NVFP4_PACK_QUANTIZED: &str = "nvfp4-pack-quantized";

/// `QuantizationArgs.dynamic`: `false`, `true` or `"local"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DynamicMode {
    /// `false`: scales are computed ahead of time and stored.
    Static,
    /// `true`: scales are computed at run time.
    Dynamic,
    /// `"local"`: per-group scales at run time, a stored global scale (NVFP4 activations).
    Local,
}

impl Serialize for DynamicMode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            DynamicMode::Static => s.serialize_bool(false),
            DynamicMode::Dynamic => s.serialize_bool(true),
            DynamicMode::Local => s.serialize_str("local"),
        }
    }
}

impl<'de> Deserialize<'de> for DynamicMode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::Bool(false) => Ok(DynamicMode::Static),
            Value::Bool(true) => Ok(DynamicMode::Dynamic),
            Value::String(s) if s == "local" => Ok(DynamicMode::Local),
            other => Err(serde::de::Error::custom(format!(
                "expected false, true or \"local\", found {other}"
            ))),
        }
    }
}

json_object! {
    /// compressed-tensors `QuantizationArgs`: how one tensor (weights or activations) is quantized.
    pub struct QuantizationArgs {
        /// Activation-ordering mode (`null`, a bool or a string).
        actorder: Value = "actorder",
        /// Block shape for the `block` strategy.
        block_structure: Value = "block_structure",
        /// Static, dynamic or local scales.
        dynamic: DynamicMode = "dynamic",
        /// Elements per scale group (16 for NVFP4).
        group_size: i64 = "group_size",
        /// Bits per element (4 for NVFP4).
        num_bits: u32 = "num_bits",
        /// Observer name, e.g. `"memoryless_minmax"`.
        observer: String = "observer",
        /// Observer options.
        observer_kwargs: Map<String, Value> = "observer_kwargs",
        /// Scale dtype, e.g. `"torch.float8_e4m3fn"`.
        scale_dtype: String = "scale_dtype",
        /// Scale granularity, `"tensor_group"` for NVFP4.
        strategy: String = "strategy",
        /// Whether the quantization is symmetric (no zero point).
        symmetric: bool = "symmetric",
        /// Number type, `"float"` or `"int"`.
        r#type: String = "type",
        /// Zero-point dtype.
        zp_dtype: String = "zp_dtype",
    }
}

json_object! {
    /// compressed-tensors `QuantizationScheme`: one config group.
    pub struct QuantizationScheme {
        /// Per-group compression format, e.g. `"nvfp4-pack-quantized"`.
        format: String = "format",
        /// Input-activation quantization (`null` for weight-only schemes).
        input_activations: QuantizationArgs = "input_activations",
        /// Output-activation quantization.
        output_activations: QuantizationArgs = "output_activations",
        /// Module names, `re:` regexes or class names this group applies to.
        targets: Vec<String> = "targets",
        /// Weight quantization.
        weights: QuantizationArgs = "weights",
    }
}

json_object! {
    /// compressed-tensors `quantization_config`, as found in `config.json`.
    pub struct QuantizationConfig {
        /// Config groups by name (`group_0`, ...), in file order.
        config_groups: IndexMap<String, QuantizationScheme> = "config_groups",
        /// Global compression format (`"mixed-precision"` when groups differ).
        format: String = "format",
        /// Modules left unquantized: exact names or `re:` regexes.
        ignore: Vec<String> = "ignore",
        /// KV-cache quantization, `null` when the cache is not quantized.
        kv_cache_scheme: Value = "kv_cache_scheme",
        /// `"compressed-tensors"` for this format.
        quant_method: String = "quant_method",
        /// `"compressed"` for a saved compressed checkpoint.
        quantization_status: String = "quantization_status",
        /// Version of compressed-tensors that wrote the config.
        version: String = "version",
    }
}

impl QuantizationArgs {
    /// The NVFP4 weights block as llmcompressor 0.14 / compressed-tensors 0.20.1 write it
    /// (spec §3.2): dynamic false, group_size 16, num_bits 4, observer `memoryless_minmax`,
    /// scale_dtype `torch.float8_e4m3fn`, strategy `tensor_group`, symmetric, type `float`.
    pub fn nvfp4_weights() -> Self {
        Self {
            dynamic: DynamicMode::Static.into(),
            group_size: 16.into(),
            num_bits: 4.into(),
            observer: "memoryless_minmax".to_owned().into(),
            scale_dtype: "torch.float8_e4m3fn".to_owned().into(),
            strategy: "tensor_group".to_owned().into(),
            symmetric: true.into(),
            r#type: "float".to_owned().into(),
            ..Self::default()
        }
    }

    /// Whether vLLM would take these args as NVFP4 (`_is_nvfp4_format`): strategy
    /// `tensor_group`, type `float`, 4 bits, group size 16, symmetric.
    pub fn is_nvfp4(&self) -> bool {
        self.strategy.get().map(String::as_str) == Some("tensor_group")
            && self.r#type.get().map(String::as_str) == Some("float")
            && self.num_bits.value() == Some(4)
            && self.group_size.value() == Some(16)
            && self.symmetric.value() == Some(true)
    }
}

impl QuantizationScheme {
    /// An NVFP4A16 (weight-only) group for `targets`: [`QuantizationArgs::nvfp4_weights`],
    /// format `nvfp4-pack-quantized`, input and output activations `null`.
    pub fn nvfp4a16(targets: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            format: NVFP4_PACK_QUANTIZED.to_owned().into(),
            input_activations: Field::Null,
            output_activations: Field::Null,
            targets: targets
                .into_iter()
                .map(Into::into)
                .collect::<Vec<_>>()
                .into(),
            weights: QuantizationArgs::nvfp4_weights().into(),
            ..Self::default()
        }
    }
}

impl QuantizationConfig {
    /// A compressed-tensors config with the given groups and ignore list, carrying every
    /// top-level key compressed-tensors 0.20.1 writes (spec §3.2): format (the groups' common
    /// format, else `mixed-precision`), `global_compression_ratio: null`, `kv_cache_scheme: null`,
    /// `moe_sparsity_config: null`, `quant_method`, `quantization_status: "compressed"`,
    /// `sparsity_config: {}`, `transform_config: {}`, `version`.
    pub fn compressed_tensors(
        config_groups: IndexMap<String, QuantizationScheme>,
        ignore: Vec<String>,
    ) -> Self {
        let mut formats = config_groups.values().map(|g| g.format.get());
        let first = formats.next().flatten().cloned();
        let format = match first {
            Some(f) if formats.all(|g| g == Some(&f)) => f,
            _ => "mixed-precision".to_owned(),
        };
        let mut extra = Map::new();
        extra.insert("global_compression_ratio".into(), Value::Null);
        extra.insert("moe_sparsity_config".into(), Value::Null);
        extra.insert("sparsity_config".into(), Value::Object(Map::new()));
        extra.insert("transform_config".into(), Value::Object(Map::new()));
        Self {
            config_groups: config_groups.into(),
            format: format.into(),
            ignore: ignore.into(),
            kv_cache_scheme: Field::Null,
            quant_method: "compressed-tensors".to_owned().into(),
            quantization_status: "compressed".to_owned().into(),
            version: CT_VERSION.to_owned().into(),
            extra,
            ..Self::default()
        }
    }

    /// The groups, in file order (empty when absent or `null`).
    pub fn groups(&self) -> impl Iterator<Item = (&str, &QuantizationScheme)> + '_ {
        self.config_groups
            .get()
            .into_iter()
            .flat_map(|g| g.iter().map(|(k, v)| (k.as_str(), v)))
    }

    /// The ignore list (empty when absent or `null`).
    pub fn ignore_list(&self) -> &[String] {
        self.ignore.get().map_or(&[], Vec::as_slice)
    }
}
