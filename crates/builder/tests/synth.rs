//! `synth`: synthetic Laguna checkpoints — layout against transformers' own files, determinism,
//! the stock NVFP4 variant against `quantize`, byte totals of the real geometries.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use fp4forge_builder::build::{NoProgress, Progress};
use fp4forge_builder::synth::{
    stock_quantization_config, LagunaGeometry, Preset, SynthBuilder, SynthPlan,
};
use fp4forge_builder::BuilderError;
use fp4forge_format::{quantize, quantize_fused, Checkpoint, Dtype, SourceDtype, WeightView};
use serde_json::{Map, Value};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

fn read_config(path: &Path) -> Map<String, Value> {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// name → (dtype, shape) of every tensor of a checkpoint directory.
fn layout_of(dir: &Path) -> BTreeMap<String, (Dtype, Vec<usize>)> {
    let ckpt = Checkpoint::open(dir).unwrap();
    ckpt.tensors()
        .map(|t| (t.name().to_owned(), (t.info.dtype, t.info.shape.clone())))
        .collect()
}

/// name → (dtype, shape) of a plan.
fn layout_of_plan(plan: &SynthPlan) -> BTreeMap<String, (Dtype, Vec<usize>)> {
    plan.tensors()
        .iter()
        .map(|s| (s.name.clone(), (s.dtype, s.shape.clone())))
        .collect()
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

/// Every file of a directory, by name.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

fn synth(builder: &SynthBuilder, plan: &SynthPlan, dst: &Path) {
    builder.write(plan, dst, &NoProgress).unwrap();
}

fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

#[test]
fn tiny_preset_is_small_readable_and_complete() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("tiny");
    let builder = SynthBuilder::new();
    let plan = builder.plan_preset(Preset::Tiny).unwrap();
    synth(&builder, &plan, &dst);

    assert!(dir_bytes(&dst) < 10_000_000, "{} bytes", dir_bytes(&dst));
    let names: Vec<String> = std::fs::read_dir(&dst)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let mut names = names;
    names.sort();
    assert_eq!(
        names,
        ["config.json", "generation_config.json", "model.safetensors"]
    );
    // No staging directory left next to it.
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);

    let ckpt = Checkpoint::open(&dst).unwrap();
    let config = ckpt.config().unwrap();
    assert_eq!(config.model_type.get().unwrap(), "laguna");
    assert_eq!(
        serde_json::to_value(&config).unwrap(),
        Value::Object(Preset::Tiny.config())
    );
    assert_eq!(layout_of(&dst), layout_of_plan(&plan));

    // Independently of the plan: the names and shapes the config implies.
    let cfg = Preset::Tiny.config();
    let n = |k: &str| cfg[k].as_u64().unwrap() as usize;
    let (h, hd, kv, experts) = (
        n("hidden_size"),
        n("head_dim"),
        n("num_key_value_heads"),
        n("num_experts"),
    );
    let layout = layout_of(&dst);
    let mut expected = BTreeMap::new();
    let mut put = |name: String, dtype: Dtype, shape: Vec<usize>| {
        expected.insert(name, (dtype, shape));
    };
    put(
        "model.embed_tokens.weight".into(),
        Dtype::BF16,
        vec![n("vocab_size"), h],
    );
    put(
        "lm_head.weight".into(),
        Dtype::BF16,
        vec![n("vocab_size"), h],
    );
    put("model.norm.weight".into(), Dtype::BF16, vec![h]);
    let heads = cfg["num_attention_heads_per_layer"].as_array().unwrap();
    for (l, heads) in heads.iter().enumerate() {
        let q = heads.as_u64().unwrap() as usize * hd;
        let p = format!("model.layers.{l}");
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            put(format!("{p}.{norm}.weight"), Dtype::BF16, vec![h]);
        }
        let a = format!("{p}.self_attn");
        put(format!("{a}.q_proj.weight"), Dtype::BF16, vec![q, h]);
        put(format!("{a}.k_proj.weight"), Dtype::BF16, vec![kv * hd, h]);
        put(format!("{a}.v_proj.weight"), Dtype::BF16, vec![kv * hd, h]);
        put(format!("{a}.o_proj.weight"), Dtype::BF16, vec![h, q]);
        put(format!("{a}.g_proj.weight"), Dtype::BF16, vec![q / hd, h]);
        put(format!("{a}.q_norm.weight"), Dtype::BF16, vec![hd]);
        put(format!("{a}.k_norm.weight"), Dtype::BF16, vec![hd]);
        let mut mlp = |prefix: String, inter: usize| {
            put(
                format!("{prefix}.gate_proj.weight"),
                Dtype::BF16,
                vec![inter, h],
            );
            put(
                format!("{prefix}.up_proj.weight"),
                Dtype::BF16,
                vec![inter, h],
            );
            put(
                format!("{prefix}.down_proj.weight"),
                Dtype::BF16,
                vec![h, inter],
            );
        };
        if l == 0 {
            mlp(format!("{p}.mlp"), n("intermediate_size"));
        } else {
            for e in 0..experts {
                mlp(format!("{p}.mlp.experts.{e}"), n("moe_intermediate_size"));
            }
            mlp(
                format!("{p}.mlp.shared_expert"),
                n("shared_expert_intermediate_size"),
            );
            put(
                format!("{p}.mlp.gate.weight"),
                Dtype::BF16,
                vec![experts, h],
            );
            put(
                format!("{p}.mlp.experts.e_score_correction_bias"),
                Dtype::F32,
                vec![experts],
            );
        }
    }
    assert_eq!(layout, expected);

    // Values look like weights: norms near 1, linears centred with std 1/sqrt(in).
    let bf16 = |name: &str| -> Vec<f32> {
        ckpt.bytes(name)
            .unwrap()
            .chunks_exact(2)
            .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
            .collect()
    };
    let norm = bf16("model.layers.1.input_layernorm.weight");
    let mean = norm.iter().sum::<f32>() / norm.len() as f32;
    assert!((mean - 1.0).abs() < 0.05, "norm mean {mean}");
    let w = bf16("model.layers.1.mlp.experts.3.down_proj.weight");
    let std = (w.iter().map(|x| x * x).sum::<f32>() / w.len() as f32).sqrt();
    let want = 1.0 / (n("moe_intermediate_size") as f32).sqrt();
    assert!((std / want - 1.0).abs() < 0.1, "std {std} want {want}");
}

#[test]
fn layout_matches_transformers_own_files_for_the_same_config() {
    // The fixtures were written by transformers' save_pretrained (bf16) and llmcompressor
    // (stock W4A4 experts): same config, so exactly the same tensors must come out.
    for (fixture_dir, stock) in [("tiny-laguna/bf16", false), ("tiny-laguna/stock", true)] {
        let config = read_config(&fixture(fixture_dir).join("config.json"));
        let builder = SynthBuilder::new().stock_nvfp4(stock);
        let plan = builder.plan(&config, fixture_dir).unwrap();
        assert_eq!(
            layout_of_plan(&plan),
            layout_of(&fixture(fixture_dir)),
            "{fixture_dir}"
        );
        if stock {
            // The quantization_config is what llmcompressor wrote, key for key.
            assert_eq!(
                plan.config()["quantization_config"],
                config["quantization_config"]
            );
            assert_eq!(
                serde_json::to_value(plan.config()).unwrap(),
                Value::Object(config.clone())
            );
        } else {
            assert!(!plan.config().contains_key("quantization_config"));
        }
    }
}

#[test]
fn stock_quantization_config_matches_llmcompressor() {
    let config = read_config(&fixture("tiny-laguna/stock/config.json"));
    let geometry = LagunaGeometry::from_config(&config, "stock").unwrap();
    let ours = serde_json::to_string_pretty(&stock_quantization_config(&geometry)).unwrap();
    let theirs = serde_json::to_string_pretty(&config["quantization_config"]).unwrap();
    // Same keys in the same (sorted) order, same values.
    assert_eq!(ours, theirs);
}

#[test]
fn output_is_deterministic_across_runs_and_thread_counts() {
    let tmp = tempfile::tempdir().unwrap();
    for stock in [false, true] {
        let builder = SynthBuilder::new().seed(42).stock_nvfp4(stock);
        let plan = builder.plan_preset(Preset::Tiny).unwrap();
        let dirs: Vec<PathBuf> = [1usize, 3, 3]
            .iter()
            .enumerate()
            .map(|(i, &threads)| {
                let dst = tmp.path().join(format!("{stock}-{i}"));
                in_pool(threads, || synth(&builder, &plan, &dst));
                dst
            })
            .collect();
        let first = files(&dirs[0]);
        for d in &dirs[1..] {
            assert!(files(d) == first, "{} differs", d.display());
        }
        let other_seed = tmp.path().join(format!("{stock}-seed"));
        let b = SynthBuilder::new().seed(43).stock_nvfp4(stock);
        synth(&b, &b.plan_preset(Preset::Tiny).unwrap(), &other_seed);
        let other = files(&other_seed);
        assert_eq!(other["config.json"], first["config.json"]);
        assert_ne!(other["model.safetensors"], first["model.safetensors"]);
    }
}

#[test]
fn stock_variant_is_the_quantization_of_the_bf16_variant() {
    let tmp = tempfile::tempdir().unwrap();
    let (bf16_dir, stock_dir) = (tmp.path().join("bf16"), tmp.path().join("stock"));
    for (dst, stock) in [(&bf16_dir, false), (&stock_dir, true)] {
        let b = SynthBuilder::new().seed(7).stock_nvfp4(stock);
        synth(&b, &b.plan_preset(Preset::Tiny).unwrap(), dst);
    }
    let bf16 = Checkpoint::open(&bf16_dir).unwrap();
    let stock = Checkpoint::open(&stock_dir).unwrap();
    let geometry = LagunaGeometry::from_config(&Preset::Tiny.config(), "tiny").unwrap();

    let f32_of = |name: &str| -> f32 {
        let b = stock.bytes(name).unwrap();
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    };
    let mut experts = 0;
    for t in bf16.tensors() {
        let name = t.name();
        let is_expert = name.contains(".mlp.experts.") && name.ends_with("_proj.weight");
        if !is_expert {
            // Everything else is byte for byte the bf16 tensor.
            assert_eq!(stock.bytes(name).unwrap(), t.bytes(), "{name}");
            continue;
        }
        if !name.ends_with("gate_proj.weight") {
            continue;
        }
        experts += 1;
        let prefix = name.strip_suffix(".gate_proj.weight").unwrap();
        let names = ["gate_proj", "up_proj", "down_proj"].map(|p| format!("{prefix}.{p}.weight"));
        let [gate, up, down] = [0, 1, 2].map(|i| {
            let e = bf16.get(&names[i]).unwrap();
            let (rows, cols) = (e.info.shape[0], e.info.shape[1]);
            WeightView::new(&names[i], SourceDtype::Bf16, rows, cols, e.bytes()).unwrap()
        });
        let fused = quantize_fused(&[gate, up]).unwrap();
        let down = quantize(&down).unwrap();
        for (proj, q) in [
            ("gate_proj", &fused[0]),
            ("up_proj", &fused[1]),
            ("down_proj", &down),
        ] {
            let p = format!("{prefix}.{proj}");
            assert_eq!(
                stock.bytes(&format!("{p}.weight_packed")).unwrap(),
                &q.packed[..],
                "{p}"
            );
            assert_eq!(
                stock.bytes(&format!("{p}.weight_scale")).unwrap(),
                &q.scales[..],
                "{p}"
            );
            assert_eq!(
                f32_of(&format!("{p}.weight_global_scale")),
                q.global_scale,
                "{p}"
            );
            assert!(!stock.contains(&format!("{p}.weight")));
        }
        // W4A4 activation scales: gate and up share the layer's; down has its own.
        let act = |proj: &str| f32_of(&format!("{prefix}.{proj}.input_global_scale"));
        assert_eq!(act("gate_proj"), act("up_proj"));
        let layer_first = prefix.rsplit_once('.').unwrap().0.to_owned() + ".0";
        assert_eq!(
            act("gate_proj"),
            f32_of(&format!("{layer_first}.gate_proj.input_global_scale"))
        );
        for proj in ["gate_proj", "down_proj"] {
            let g = act(proj);
            assert!(g.is_finite() && g > 100.0, "{prefix}.{proj}: {g}");
        }
    }
    let moe_layers = (0..geometry.layers.len())
        .filter(|&l| geometry.is_moe(l))
        .count();
    assert_eq!(experts, moe_layers * geometry.num_experts);
    assert_eq!(stock.len(), bf16.len() + experts * 3 * 3);
    let config = stock.config().unwrap();
    assert!(config.quantization_config.is_set());
}

#[test]
fn progress_adds_up_and_cancellation_leaves_nothing() {
    struct Count(AtomicU64, AtomicU64, bool);
    impl Progress for Count {
        fn start(&self, total: u64) {
            self.0.store(total, Ordering::SeqCst);
        }
        fn advance(&self, bytes: u64) {
            self.1.fetch_add(bytes, Ordering::SeqCst);
        }
        fn cancelled(&self) -> bool {
            self.2
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let builder = SynthBuilder::new().stock_nvfp4(true);
    let plan = builder.plan_preset(Preset::Tiny).unwrap();
    let count = Count(AtomicU64::new(0), AtomicU64::new(0), false);
    let report = builder.write(&plan, &tmp.path().join("a"), &count).unwrap();
    assert_eq!(count.0.load(Ordering::SeqCst), plan.total_bytes());
    assert_eq!(count.1.load(Ordering::SeqCst), plan.total_bytes());
    assert_eq!(report.total_bytes, plan.total_bytes());
    assert_eq!(report.tensors, plan.tensors().len());

    let cancel = Count(AtomicU64::new(0), AtomicU64::new(0), true);
    let err = builder
        .write(&plan, &tmp.path().join("b"), &cancel)
        .unwrap_err();
    assert!(matches!(err, BuilderError::Cancelled), "{err}");
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["a"], "no destination and no staging directory left");
}

#[test]
fn existing_destination_needs_force() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    std::fs::create_dir(&dst).unwrap();
    std::fs::write(dst.join("stale.txt"), b"old").unwrap();
    let builder = SynthBuilder::new();
    let plan = builder.plan_preset(Preset::Tiny).unwrap();
    let err = builder.write(&plan, &dst, &NoProgress).unwrap_err();
    assert!(matches!(err, BuilderError::Output { .. }), "{err}");
    assert!(err.to_string().contains("--force"), "{err}");
    assert!(dst.join("stale.txt").exists());

    let forced = SynthBuilder::new().force(true);
    forced.write(&plan, &dst, &NoProgress).unwrap();
    assert!(!dst.join("stale.txt").exists());
    assert!(dst.join("model.safetensors").exists());
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
}

#[test]
fn small_shards_get_an_index_and_read_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("sharded");
    let builder = SynthBuilder::new().max_shard_bytes(200_000);
    let plan = builder.plan_preset(Preset::Tiny).unwrap();
    let report = builder.write(&plan, &dst, &NoProgress).unwrap();
    assert!(report.shards.len() > 2, "{:?}", report.shards);
    assert!(dst.join("model.safetensors.index.json").exists());
    assert_eq!(layout_of(&dst), layout_of_plan(&plan));

    // Same bytes per tensor as the single-file checkpoint.
    let single = tmp.path().join("single");
    synth(&SynthBuilder::new(), &plan, &single);
    let (a, b) = (
        Checkpoint::open(&dst).unwrap(),
        Checkpoint::open(&single).unwrap(),
    );
    for t in b.tensors() {
        assert_eq!(a.bytes(t.name()).unwrap(), t.bytes(), "{}", t.name());
    }
}

#[test]
fn s_preset_config_is_the_real_laguna_s_2_1_config() {
    let mut real = read_config(&fixture("laguna-s-2.1/config.json"));
    real.shift_remove("quantization_config");
    let ours = Preset::S.config();
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        real.keys().collect::<Vec<_>>(),
        "same keys in the same order"
    );
    assert_eq!(Value::Object(ours), Value::Object(real));
}

#[test]
fn s_and_xs_totals_match_the_real_checkpoints() {
    let s = SynthBuilder::new().plan_preset(Preset::S).unwrap();
    assert_eq!(s.parameter_count(), 117_561_977_600);
    let s_stock = SynthBuilder::new()
        .stock_nvfp4(true)
        .plan_preset(Preset::S)
        .unwrap();
    // poolside/Laguna-S-2.1-NVFP4: 145 153 tensors, 71 898 733 760 B. It also ships the fp8 KV
    // cache scales `self_attn.{k,v}_scale` (BF16 [1], 48 layers × 2 = 96 tensors, 192 B), which
    // a synthetic checkpoint has no calibration for; everything else matches exactly.
    assert_eq!(s_stock.tensors().len(), 145_153 - 96);
    assert_eq!(s_stock.total_bytes(), 71_898_733_760 - 192);
    // One expert: 4 718 592 packed + 589 824 scales + 24 B of globals (laguna.md §3.2).
    let expert: u64 = s_stock
        .tensors()
        .iter()
        .filter(|t| t.name.starts_with("model.layers.5.mlp.experts.17."))
        .map(|t| t.byte_len().unwrap())
        .sum();
    assert_eq!(expert, 5_308_440);
    assert_eq!(
        s.total_bytes(),
        2 * s.parameter_count() + 2 * 47 * 256, // the F32 router bias takes 4 bytes, not 2
    );

    let xs = SynthBuilder::new().plan_preset(Preset::Xs).unwrap();
    assert_eq!(xs.parameter_count(), 33_442_617_088); // card: 33 B
    let cfg = xs.config();
    assert_eq!(cfg["num_hidden_layers"], 40);
    assert_eq!(cfg["max_position_embeddings"], 262_144);
    assert_eq!(cfg["rope_parameters"]["full_attention"]["beta_fast"], 64.0);
    let xs_stock = SynthBuilder::new()
        .stock_nvfp4(true)
        .plan_preset(Preset::Xs)
        .unwrap();
    // 39 MoE layers × 256 experts × 2 638 872 B of NVFP4, plus 2.04 B bf16 parameters.
    assert_eq!(xs_stock.total_bytes(), 21_738_005_504);
}

#[test]
fn plan_refuses_what_it_cannot_build() {
    let mut cfg = Preset::Tiny.config();
    cfg.insert("model_type".into(), "llama".into());
    let err = SynthBuilder::new().plan(&cfg, "x.json").unwrap_err();
    assert!(err.to_string().contains("model_type"), "{err}");

    let mut cfg = Preset::Tiny.config();
    cfg.insert("moe_intermediate_size".into(), 40.into());
    assert!(SynthBuilder::new().plan(&cfg, "x.json").is_ok());
    let err = SynthBuilder::new()
        .stock_nvfp4(true)
        .plan(&cfg, "x.json")
        .unwrap_err();
    assert!(err.to_string().contains("moe_intermediate_size"), "{err}");

    let mut cfg = Preset::Tiny.config();
    cfg.insert("layer_types".into(), serde_json::json!(["full_attention"]));
    let err = SynthBuilder::new().plan(&cfg, "x.json").unwrap_err();
    assert!(err.to_string().contains("layer_types"), "{err}");
}

#[test]
fn tiny_geometry_covers_every_layer_kind() {
    let g = LagunaGeometry::from_config(&Preset::Tiny.config(), "tiny").unwrap();
    let kinds: Vec<(bool, bool)> = g
        .layers
        .iter()
        .map(|l| (l.full_attention, l.dense_intermediate.is_some()))
        .collect();
    assert!(kinds.contains(&(true, true)), "full dense");
    assert!(kinds.contains(&(false, false)), "sliding MoE");
    assert!(kinds.contains(&(true, false)), "full MoE");
    assert!(g.layers[0].dense_intermediate.is_some());
}
