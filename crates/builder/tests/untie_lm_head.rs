//! `quantize --untie-lm-head` on a tiny tied Llama (SmolLM2's layout, small sizes): the new
//! `lm_head` equals, byte for byte, what quantizing a materialised `lm_head.weight` (a copy of
//! the embedding) as a targeted Linear gives, i.e. the path `build_reference.rs` proves against
//! llmcompressor; the embedding is unchanged; the config says untied and targets `lm_head`;
//! `verify` accepts the output and refuses tampering; every refusal names the flag.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use fp4forge_builder::build::{NoProgress, QuantizeBuilder};
use fp4forge_builder::plan::DEFAULT_TARGETS;
use fp4forge_builder::verify::verify;
use fp4forge_format::{
    quantize_fused, Checkpoint, Dtype, ShardWriterBuilder, SourceDtype, TensorSpec, WeightView,
};
use serde_json::{json, Value};

const HIDDEN: usize = 64;
const VOCAB: usize = 96;
const LAYERS: usize = 2;

/// SmolLM2-135M's config at toy sizes (tied).
fn config() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": true,
        "torch_dtype": "bfloat16",
        "vocab_size": VOCAB
    })
}

/// Seeded bf16 values of magnitude ~0.1 (a per-tensor seed; xorshift).
fn values(seed: u64, n: usize, dtype: Dtype) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(n * dtype.size());
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let v = ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2;
        match dtype {
            Dtype::BF16 => out.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
            _ => out.push((x >> 56) as u8),
        }
    }
    out
}

/// The tensors of the tiny model: `(name, dtype, shape)`, embedding first.
fn layout(untied: bool) -> Vec<(String, Dtype, Vec<usize>)> {
    let mut t = vec![(
        "model.embed_tokens.weight".to_string(),
        Dtype::BF16,
        vec![VOCAB, HIDDEN],
    )];
    for i in 0..LAYERS {
        let p = format!("model.layers.{i}");
        for (name, shape) in [
            ("input_layernorm", vec![HIDDEN]),
            ("post_attention_layernorm", vec![HIDDEN]),
            ("self_attn.q_proj", vec![64, HIDDEN]),
            ("self_attn.k_proj", vec![32, HIDDEN]),
            ("self_attn.v_proj", vec![32, HIDDEN]),
            ("self_attn.o_proj", vec![HIDDEN, 64]),
            ("mlp.gate_proj", vec![128, HIDDEN]),
            ("mlp.up_proj", vec![128, HIDDEN]),
            ("mlp.down_proj", vec![HIDDEN, 128]),
        ] {
            t.push((format!("{p}.{name}.weight"), Dtype::BF16, shape));
        }
    }
    t.push(("model.norm.weight".into(), Dtype::BF16, vec![HIDDEN]));
    if untied {
        t.push(("lm_head.weight".into(), Dtype::BF16, vec![VOCAB, HIDDEN]));
    }
    t
}

/// Writes a checkpoint of `tensors` (values seeded by name; `lm_head.weight` is the
/// embedding's bytes) with `config`.
fn write_model(dir: &Path, config: &Value, tensors: &[(String, Dtype, Vec<usize>)]) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    let specs: Vec<TensorSpec> = tensors
        .iter()
        .map(|(n, d, s)| TensorSpec::new(n.clone(), *d, s.clone()))
        .collect();
    let writer = ShardWriterBuilder::new().create(dir, specs).unwrap();
    for (name, dtype, shape) in tensors {
        let n: usize = shape.iter().product();
        let seed_name = if name == "lm_head.weight" {
            "model.embed_tokens.weight"
        } else {
            name.as_str()
        };
        let seed = seed_name
            .bytes()
            .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
        writer.write(name, &values(seed, n, *dtype)).unwrap();
    }
    writer.finish().unwrap();
    fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(config).unwrap(),
    )
    .unwrap();
    dir.to_path_buf()
}

fn tied_model(dir: &Path) -> PathBuf {
    write_model(dir, &config(), &layout(false))
}

fn untied_model(dir: &Path) -> PathBuf {
    let mut cfg = config();
    cfg["tie_word_embeddings"] = json!(false);
    write_model(dir, &cfg, &layout(true))
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

/// Every tensor of `a` equals `b`'s: same names, dtypes, shapes and bytes.
fn assert_same_tensors(a: &Path, b: &Path) {
    let (a, b) = (Checkpoint::open(a).unwrap(), Checkpoint::open(b).unwrap());
    let names = |c: &Checkpoint| -> BTreeSet<String> {
        c.tensors().map(|e| e.name().to_string()).collect()
    };
    assert_eq!(names(&a), names(&b));
    for name in names(&a) {
        let (x, y) = (a.get(&name).unwrap(), b.get(&name).unwrap());
        assert_eq!(x.info.dtype, y.info.dtype, "{name}");
        assert_eq!(x.info.shape, y.info.shape, "{name}");
        assert!(x.bytes() == y.bytes(), "{name}: bytes differ");
    }
}

fn assert_verifies(src: &Path, dst: &Path) {
    let report = verify(src, dst).unwrap();
    assert!(report.passed(), "{report:#?}");
}

#[test]
fn untied_lm_head_equals_quantizing_a_materialised_lm_head() {
    let tmp = tempfile::tempdir().unwrap();
    let tied = tied_model(&tmp.path().join("tied"));
    let untied = untied_model(&tmp.path().join("untied"));

    // (a) tied + --untie-lm-head, default targets (attention).
    let out = tmp.path().join("out");
    let report = QuantizeBuilder::new(&tied, &out)
        .untie_lm_head(true)
        .run(&NoProgress)
        .unwrap();
    let u = report.summary.untied_lm_head.as_ref().unwrap();
    assert_eq!(
        (u.module.as_str(), u.source.as_str()),
        ("lm_head", "model.embed_tokens.weight")
    );
    assert_eq!(u.shape, [VOCAB, HIDDEN]);
    assert_eq!(u.bytes_before, (VOCAB * HIDDEN * 2) as u64);
    assert_eq!(
        u.bytes_after,
        (VOCAB * HIDDEN / 2 + VOCAB * HIDDEN / 16 + 4) as u64
    );
    assert_eq!(report.summary.modules_quantized, LAYERS * 4 + 1);

    // (b) the same bytes as an untied copy with `lm_head.weight` materialised and targeted.
    let reference = tmp.path().join("reference");
    let mut targets = strings(&DEFAULT_TARGETS);
    targets.push("lm_head".into());
    QuantizeBuilder::new(&untied, &reference)
        .targets(targets)
        .run(&NoProgress)
        .unwrap();
    assert_same_tensors(&out, &reference);
    // ... and quantize_fused of the embedding as a standalone Linear (its own global scale).
    let src = Checkpoint::open(&tied).unwrap();
    let embedding = src.get("model.embed_tokens.weight").unwrap().bytes();
    let view = WeightView::new(
        "lm_head.weight",
        SourceDtype::Bf16,
        VOCAB,
        HIDDEN,
        embedding,
    )
    .unwrap();
    let q = quantize_fused(&[view]).unwrap().remove(0);
    let built = Checkpoint::open(&out).unwrap();
    let tensor = |leaf: &str| built.get(&format!("lm_head.{leaf}")).unwrap();
    assert_eq!(tensor("weight_packed").info.dtype, Dtype::U8);
    assert_eq!(tensor("weight_packed").info.shape, [VOCAB, HIDDEN / 2]);
    assert_eq!(tensor("weight_scale").info.dtype, Dtype::F8_E4M3);
    assert_eq!(tensor("weight_scale").info.shape, [VOCAB, HIDDEN / 16]);
    assert_eq!(tensor("weight_global_scale").info.dtype, Dtype::F32);
    assert_eq!(tensor("weight_global_scale").info.shape, [1]);
    assert!(tensor("weight_packed").bytes() == q.packed.as_slice());
    assert!(tensor("weight_scale").bytes() == q.scales.as_slice());
    assert_eq!(
        tensor("weight_global_scale").bytes(),
        q.global_scale.to_le_bytes()
    );
    assert!(!built.contains("lm_head.weight"));
    assert!(!built.contains("lm_head.input_global_scale"));

    // (c) the embedding is unchanged.
    assert!(built.get("model.embed_tokens.weight").unwrap().bytes() == embedding);

    // (d) config: untied, lm_head in the new group's targets and not in ignore; otherwise the
    // quantization_config is the materialised copy's.
    let cfg = read_json(&out.join("config.json"));
    let reference_cfg = read_json(&reference.join("config.json"));
    assert_eq!(cfg["tie_word_embeddings"], json!(false));
    assert_eq!(
        cfg["quantization_config"],
        reference_cfg["quantization_config"]
    );
    let q = &cfg["quantization_config"];
    assert_eq!(
        q["config_groups"]["group_0"]["targets"],
        json!([DEFAULT_TARGETS[0], "lm_head"])
    );
    assert!(q["config_groups"]["group_0"]["input_activations"].is_null());
    let ignore: Vec<&str> = q["ignore"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(!ignore.contains(&"lm_head"), "{ignore:?}");
    assert!(
        ignore.contains(&"model.layers.0.mlp.gate_proj"),
        "{ignore:?}"
    );
    // Everything else in config.json is as it was.
    let (mut a, mut b) = (cfg.clone(), config());
    for c in [&mut a, &mut b] {
        let m = c.as_object_mut().unwrap();
        m.remove("quantization_config");
        m.remove("tie_word_embeddings");
    }
    assert_eq!(a, b);

    // verify accepts both builds.
    assert_verifies(&tied, &out);
    assert_verifies(&untied, &reference);
}

#[test]
fn targets_linear_quantizes_everything_and_names_lm_head() {
    let tmp = tempfile::tempdir().unwrap();
    let tied = tied_model(&tmp.path().join("tied"));
    let out = tmp.path().join("out");
    QuantizeBuilder::new(&tied, &out)
        .targets(strings(&["Linear"]))
        .untie_lm_head(true)
        .run(&NoProgress)
        .unwrap();
    let q = &read_json(&out.join("config.json"))["quantization_config"];
    // vLLM's ParallelLMHead is no `Linear` class: lm_head is named.
    assert_eq!(
        q["config_groups"]["group_0"]["targets"],
        json!(["Linear", "lm_head"])
    );
    assert_eq!(q["ignore"], json!([]));
    assert_verifies(&tied, &out);
}

#[test]
fn sharded_output_indexes_the_new_tensors() {
    let tmp = tempfile::tempdir().unwrap();
    let tied = tied_model(&tmp.path().join("tied"));
    let out = tmp.path().join("out");
    let report = QuantizeBuilder::new(&tied, &out)
        .untie_lm_head(true)
        .max_shard_bytes(Some(16_000))
        .run(&NoProgress)
        .unwrap();
    assert!(report.shards.len() > 1, "{:?}", report.shards);
    let index = read_json(&out.join("model.safetensors.index.json"));
    for leaf in ["weight_packed", "weight_scale", "weight_global_scale"] {
        let shard = index["weight_map"][format!("lm_head.{leaf}")]
            .as_str()
            .unwrap_or_else(|| panic!("lm_head.{leaf} not in weight_map"));
        assert!(report.shards.iter().any(|s| s == shard), "{shard}");
    }
    assert_verifies(&tied, &out);
}

#[test]
fn nested_text_config_flag_is_untied_too() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config();
    cfg.as_object_mut().unwrap().remove("tie_word_embeddings");
    cfg["text_config"] = json!({"tie_word_embeddings": true, "vocab_size": VOCAB});
    let src = write_model(&tmp.path().join("src"), &cfg, &layout(false));
    let out = tmp.path().join("out");
    QuantizeBuilder::new(&src, &out)
        .untie_lm_head(true)
        .run(&NoProgress)
        .unwrap();
    let written = read_json(&out.join("config.json"));
    assert_eq!(written["tie_word_embeddings"], json!(false));
    assert_eq!(written["text_config"]["tie_word_embeddings"], json!(false));
    assert_eq!(written["text_config"]["vocab_size"], json!(VOCAB));
    assert_verifies(&src, &out);
}

#[test]
fn dry_run_plans_the_lm_head_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let tied = tied_model(&tmp.path().join("tied"));
    let out = tmp.path().join("out");
    let (_, plan) = QuantizeBuilder::new(&tied, &out)
        .untie_lm_head(true)
        .plan()
        .unwrap();
    assert!(!out.exists());
    let u = plan.summary.untied_lm_head.as_ref().unwrap();
    assert_eq!(u.source, "model.embed_tokens.weight");
    assert!(plan
        .outputs
        .iter()
        .any(|s| s.name == "lm_head.weight_packed"));
    assert_eq!(
        plan.summary.by_leaf.last(),
        Some(&("lm_head".to_string(), 1))
    );
    // The new tensors are the only growth besides the quantized attention.
    let without = QuantizeBuilder::new(&tied, &out).plan().unwrap().1;
    assert_eq!(
        plan.summary.bytes_after - without.summary.bytes_after,
        u.bytes_after
    );
    assert_eq!(plan.summary.bytes_before, without.summary.bytes_before);
}

fn refusal(src: &Path, builder: impl FnOnce(QuantizeBuilder) -> QuantizeBuilder) -> String {
    let out = src.with_file_name("refused-out");
    let err = builder(QuantizeBuilder::new(src, &out).untie_lm_head(true))
        .run(&NoProgress)
        .unwrap_err()
        .to_string();
    assert!(!out.exists());
    assert!(err.contains("--untie-lm-head"), "{err}");
    err
}

#[test]
fn refusals_name_the_flag_and_the_tensor() {
    let tmp = tempfile::tempdir().unwrap();

    // Not tied: it already stores lm_head.
    let untied = untied_model(&tmp.path().join("untied"));
    let err = refusal(&untied, |b| b);
    assert!(
        err.contains("lm_head.weight") && err.contains("--targets lm_head"),
        "{err}"
    );

    // --ignore patterns that exclude lm_head (by name, by regex, by class).
    let tied = tied_model(&tmp.path().join("tied"));
    // (Without the flag, --targets lm_head on a tied model points to it.)
    let err = QuantizeBuilder::new(&tied, tmp.path().join("x"))
        .targets(strings(&["lm_head"]))
        .run(&NoProgress)
        .unwrap_err()
        .to_string();
    assert!(err.contains("--untie-lm-head"), "{err}");
    for pattern in ["lm_head", "re:.*head$", "Linear"] {
        let err = refusal(&tied, |b| b.ignore(strings(&[pattern])));
        assert!(err.contains(&format!("--ignore {pattern}")), "{err}");
    }

    // The config says untied but nothing is stored.
    let mut cfg = config();
    cfg["tie_word_embeddings"] = json!(false);
    let src = write_model(&tmp.path().join("says-untied"), &cfg, &layout(false));
    let err = refusal(&src, |b| b);
    assert!(err.contains("tie_word_embeddings: false"), "{err}");

    // No embedding where the geometry names it.
    let mut tensors = layout(false);
    tensors[0].0 = "model.tok_embeddings.weight".into();
    let src = write_model(&tmp.path().join("no-embedding"), &config(), &tensors);
    let err = refusal(&src, |b| b);
    assert!(err.contains("model.embed_tokens.weight"), "{err}");

    // A model_type whose tensor names no family knows.
    let mut cfg = config();
    cfg["model_type"] = json!("mystery");
    let src = write_model(&tmp.path().join("unknown-family"), &cfg, &layout(false));
    let err = refusal(&src, |b| b);
    assert!(err.contains("model_type"), "{err}");

    // An embedding that is already quantized (fp8).
    let mut tensors = layout(false);
    tensors[0].1 = Dtype::F8_E4M3;
    let src = write_model(&tmp.path().join("fp8-embedding"), &config(), &tensors);
    let err = refusal(&src, |b| b);
    assert!(
        err.contains("model.embed_tokens.weight") && err.contains("already quantized"),
        "{err}"
    );
}

#[test]
fn verify_refuses_a_tampered_untied_lm_head_or_a_tied_config() {
    let tmp = tempfile::tempdir().unwrap();
    let tied = tied_model(&tmp.path().join("tied"));
    let out = tmp.path().join("out");
    QuantizeBuilder::new(&tied, &out)
        .untie_lm_head(true)
        .run(&NoProgress)
        .unwrap();

    // The config still saying tied.
    let config_path = out.join("config.json");
    let good = fs::read(&config_path).unwrap();
    let mut cfg = read_json(&config_path);
    cfg["tie_word_embeddings"] = json!(true);
    fs::write(&config_path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    let report = verify(&tied, &out).unwrap();
    assert!(!report.passed());
    assert!(format!("{report:?}").contains("tie_word_embeddings"));
    fs::write(&config_path, good).unwrap();

    // One flipped nibble of lm_head.
    let shard = out.join("model.safetensors");
    let mut bytes = fs::read(&shard).unwrap();
    let offset = {
        let ck = Checkpoint::open(&out).unwrap();
        let packed = ck.get("lm_head.weight_packed").unwrap().bytes().to_vec();
        bytes
            .windows(packed.len())
            .position(|w| w == packed)
            .unwrap()
    };
    bytes[offset] ^= 0x01;
    fs::write(&shard, bytes).unwrap();
    let report = verify(&tied, &out).unwrap();
    assert!(!report.passed());
    assert!(
        format!("{report:?}").contains("lm_head.weight_packed differs"),
        "{report:#?}"
    );
}
