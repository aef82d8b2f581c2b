//! `inspect` reproduces the published Laguna-S-2.1 byte accounting (shared/spec/laguna.md §4, §5)
//! from the shipped config fixtures.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use fp4forge_builder::inspect::{
    Basis, Comparison, Component, HardwareProfile, Inspector, KvDtype, Precision, QuantConfig,
    Report,
};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .join("config.json")
}

fn config(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(name)).unwrap()).unwrap()
}

/// The stock report, built once (a debug build takes a while over 145 153 tensors).
fn stock() -> Report {
    static R: OnceLock<Report> = OnceLock::new();
    R.get_or_init(|| {
        Inspector::new()
            .inspect_path(&fixture("laguna-s-2.1"))
            .unwrap()
    })
    .clone()
}

/// The lean report, built once.
fn lean() -> Report {
    static R: OnceLock<Report> = OnceLock::new();
    R.get_or_init(|| {
        Inspector::new()
            .inspect_path(&fixture("laguna-s-2.1-lean"))
            .unwrap()
    })
    .clone()
}

/// |got − want| ≤ tol · want.
fn close(got: f64, want: f64, tol: f64) {
    assert!(
        (got - want).abs() <= tol * want.abs(),
        "got {got}, want {want} ± {}",
        tol * want.abs()
    );
}

fn rows(r: &Report, c: Component) -> Vec<(Precision, u64, u64, f64)> {
    r.components
        .iter()
        .filter(|x| x.component == c)
        .map(|x| (x.precision.clone(), x.tensors, x.bytes, x.bytes_per_token))
        .collect()
}

#[test]
fn stock_parameters_and_footprint_are_exact() {
    let r = stock();
    assert_eq!(r.basis, Basis::Config);
    assert_eq!(r.totals.params, 117_561_977_600);
    // §3.2: 15 shards, 145 153 tensors, payload 71 898 733 760 B.
    assert_eq!(r.totals.tensors, 145_153);
    assert_eq!(r.totals.bytes, 71_898_733_760);
    assert_eq!(r.totals.attention_params, 2_803_138_560);
    // §4: active 8 140 974 848 (excl. embedding table), 8 449 256 192 incl.
    assert_eq!(r.totals.active_params, 8_140_974_848.0);
    assert_eq!(r.totals.active_params_with_embedding, 8_449_256_192.0);

    // Routed experts: 12 032 experts × 3 projections × 4 tensors (W4A4), 5 308 440 B per expert.
    let experts = rows(&r, Component::RoutedExperts);
    assert_eq!(experts.len(), 1);
    let (prec, tensors, bytes, _) = &experts[0];
    assert_eq!(*prec, Precision::Nvfp4);
    assert_eq!(*tensors, 12_032 * 3 * 4);
    assert_eq!(*bytes, 12_032 * 5_308_440);
    // Everything else stays BF16, except the F32 router bias.
    for row in &r.components {
        if row.component != Component::RoutedExperts {
            let want = if row.component == Component::Router && row.params == 12_032 {
                Precision::F32
            } else {
                Precision::Bf16
            };
            assert_eq!(row.precision, want, "{:?}", row.component);
        }
    }
}

#[test]
fn stock_bytes_per_token() {
    let t = stock().totals;
    // Exact: 7 411 027 136 B of fixed weights + 47 × 10 × 5 308 440 B of experts.
    close(t.bytes_per_token, 9_905_993_936.0, 1e-12);
    close(t.bytes_per_token, 9.906e9, 1e-3);
    close(t.routed_expert_bytes_per_token, 2_494_966_800.0, 1e-12);
    close(t.routed_expert_bytes_per_token, 2.4950e9, 1e-3);
    assert_eq!(t.attention_bytes, 5_606_277_120);
    close(t.attention_bytes_per_token, 5.6063e9, 1e-3);
    close(t.attention_share, 0.566, 1e-3);
}

#[test]
fn lean_quantizes_q_k_v_o_only() {
    let (s, l) = (stock(), lean());
    assert_eq!(l.totals.params, s.totals.params);
    // 192 BF16 weights become packed + scale + global scale (no input scale: A16).
    assert_eq!(l.totals.tensors, s.totals.tensors + 192 * 2);
    for c in [
        Component::AttnQ,
        Component::AttnK,
        Component::AttnV,
        Component::AttnO,
    ] {
        let r = rows(&l, c);
        assert_eq!(r.len(), 1, "{c:?}");
        assert_eq!(r[0].0, Precision::Nvfp4A16, "{c:?}");
        assert_eq!(r[0].1, 48 * 3, "{c:?}");
    }
    assert_eq!(rows(&l, Component::AttnGate)[0].0, Precision::Bf16);
    assert_eq!(
        rows(&l, Component::RoutedExperts),
        rows(&s, Component::RoutedExperts)
    );

    // q/k/v/o: 2 793 406 464 params at 4.5 bits + 192 × 4 B of global scales.
    let attn_qkvo_after: u64 = [
        Component::AttnQ,
        Component::AttnK,
        Component::AttnV,
        Component::AttnO,
    ]
    .iter()
    .map(|&c| rows(&l, c)[0].2)
    .sum();
    assert_eq!(attn_qkvo_after, 2_793_406_464 * 9 / 16 + 192 * 4);

    // The issue's "~5.89 GB/token after quantizing q/k/v/o, ~4.0 GB smaller".
    close(l.totals.bytes_per_token, 5_890_472_912.0, 1e-12);
    close(l.totals.bytes_per_token, 5.89e9, 1e-3);
    let saving = s.totals.bytes - l.totals.bytes;
    assert_eq!(saving, 4_015_521_024);
    close(
        s.totals.bytes_per_token - l.totals.bytes_per_token,
        saving as f64,
        1e-12,
    );
}

#[test]
fn lean_with_gate_matches_laguna_md() {
    // §4 "attention-quantized build" quantizes q, k, v, o and g: 5.877 GB/token, saving 4.030 GB.
    let mut cfg = config("laguna-s-2.1-lean");
    let qc = &mut cfg["quantization_config"];
    qc["config_groups"]["group_0"]["targets"] =
        serde_json::json!([r"re:.*self_attn\.(q|k|v|o|g)_proj$"]);
    let ignore: Vec<Value> = qc["ignore"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| !p.as_str().unwrap().contains("g_proj"))
        .cloned()
        .collect();
    qc["ignore"] = Value::Array(ignore);
    let l = Inspector::new().inspect_config(&cfg, "lean+g").unwrap();
    let s = stock();
    close(l.totals.bytes_per_token, 5.877e9, 1e-3);
    close((s.totals.bytes - l.totals.bytes) as f64, 4.030e9, 1e-3);
    close(l.totals.bytes as f64, 67.87e9, 1e-3);
    // Byte ratio with 4K fp8 KV: 10.044 / 6.015 = 1.670 (the card's 1.67x on GB10).
    let cmp = Comparison::new(s, l);
    let at4k = cmp.speedup.iter().find(|x| x.context == 4096).unwrap();
    close(at4k.before_bytes_per_token, 10.044e9, 1e-3);
    close(at4k.after_bytes_per_token, 6.015e9, 1e-3);
    close(at4k.speedup, 1.670, 1e-3);
}

#[test]
fn linear_class_with_ignore_list_equals_expert_regex() {
    // §3.2's ignore list is exactly what makes `targets: ["Linear"]` select only the experts.
    let mut cfg = config("laguna-s-2.1");
    cfg["quantization_config"]["config_groups"]["group_0"]["targets"] =
        serde_json::json!(["Linear"]);
    let by_class = Inspector::new().inspect_config(&cfg, "linear").unwrap();
    let by_regex = stock();
    assert_eq!(by_class.components, by_regex.components);
    assert_eq!(by_class.totals, by_regex.totals);

    let q = QuantConfig::from_config(&cfg, "linear").unwrap().unwrap();
    let group = |m: &str| q.group_for(m, true).map(|g| g.name.as_str());
    assert_eq!(
        group("model.layers.5.mlp.experts.17.down_proj"),
        Some("group_0")
    );
    assert_eq!(group("model.layers.5.mlp.gate"), None);
    assert_eq!(group("model.layers.5.mlp.gate_proj"), Some("group_0"));
    assert_eq!(group("model.layers.0.mlp.gate_proj"), None);
    assert_eq!(group("model.layers.5.mlp.shared_expert.up_proj"), None);
    assert_eq!(group("model.layers.5.self_attn.q_proj"), None);
    assert_eq!(group("lm_head"), None);
}

#[test]
fn name_targets_beat_class_targets() {
    // Lean groups reordered behind a catch-all Linear group: q/k/v/o still resolve to the
    // attention group (vLLM matches names before classes).
    let mut cfg = config("laguna-s-2.1-lean");
    let groups = cfg["quantization_config"]["config_groups"].clone();
    let mut catch_all = groups["group_1"].clone();
    catch_all["targets"] = serde_json::json!(["Linear"]);
    cfg["quantization_config"]["config_groups"] = serde_json::json!({
        "group_0": catch_all,
        "group_1": groups["group_0"],
    });
    let q = QuantConfig::from_config(&cfg, "x").unwrap().unwrap();
    let g = q
        .group_for("model.layers.3.self_attn.k_proj", true)
        .unwrap();
    assert_eq!(g.name, "group_1");
    assert!(!g.activations);
    assert_eq!(
        q.group_for("model.layers.3.mlp.experts.0.up_proj", true)
            .unwrap()
            .name,
        "group_0"
    );
}

#[test]
fn kv_cache() {
    let r = stock();
    let kv = &r.kv_cache;
    assert_eq!(kv.dtype, KvDtype::Fp8);
    let full = kv.groups.iter().find(|g| g.kind == "full").unwrap();
    let sliding = kv.groups.iter().find(|g| g.kind == "sliding").unwrap();
    assert_eq!((full.layers, sliding.layers), (12, 36));
    // 2 × 8 heads × 128 × 1 B = 2 048 B per token per layer in fp8.
    assert_eq!(full.per_layer_bytes_bf16, Some(4096));
    assert_eq!(full.bytes_per_token_fp8, 24_576);
    assert_eq!(full.cap_bytes_fp8, None);
    assert_eq!(sliding.window, Some(512));
    assert_eq!(sliding.cap_bytes_fp8, Some(37_748_736));
    assert_eq!(sliding.cap_bytes_bf16, Some(2 * 37_748_736));
    let at: Vec<(u64, u64)> = kv
        .contexts
        .iter()
        .map(|c| (c.context, c.bytes_fp8))
        .collect();
    assert_eq!(
        at,
        vec![
            (4096, 138_412_032),
            (32_768, 843_055_104),
            (131_072, 3_258_974_208),
            (262_144, 6_480_199_680),
            (1_048_576, 25_807_552_512),
        ]
    );
    assert!(kv.contexts.iter().all(|c| c.bytes_bf16 == 2 * c.bytes_fp8));
}

#[test]
fn contexts_are_capped_at_max_position_embeddings() {
    let mut cfg = config("laguna-s-2.1");
    cfg["max_position_embeddings"] = 262_144.into();
    let r = Inspector::new().inspect_config(&cfg, "262k").unwrap();
    let ctx: Vec<u64> = r.kv_cache.contexts.iter().map(|c| c.context).collect();
    assert_eq!(ctx, vec![4096, 32_768, 131_072, 262_144]);
    let mut cfg = config("laguna-s-2.1");
    cfg["max_position_embeddings"] = 100_000.into();
    let r = Inspector::new().inspect_config(&cfg, "100k").unwrap();
    let ctx: Vec<u64> = r.kv_cache.contexts.iter().map(|c| c.context).collect();
    assert_eq!(ctx, vec![4096, 32_768, 100_000]);
}

#[test]
fn roofline() {
    let r = Inspector::new()
        .hardware(vec![
            HardwareProfile::parse("gb10").unwrap(),
            HardwareProfile::parse("mine=1000").unwrap(),
        ])
        .inspect_path(&fixture("laguna-s-2.1"))
        .unwrap();
    assert_eq!(r.roofline.len(), 2);
    let gb10 = &r.roofline[0];
    assert_eq!(gb10.hardware.bandwidth_gbps, 273.0);
    assert_eq!(gb10.ceilings[0].context, 0);
    close(gb10.ceilings[0].tok_s, 273e9 / 9_905_993_936.0, 1e-12);
    let at4k = gb10.ceilings.iter().find(|c| c.context == 4096).unwrap();
    close(at4k.bytes_per_token, 10.044e9, 1e-3);
    close(at4k.tok_s, 27.18, 1e-3);
    close(
        r.roofline[1].ceilings[0].tok_s,
        1e12 / 9_905_993_936.0,
        1e-12,
    );
    let builtins: Vec<(String, f64)> = stock()
        .roofline
        .into_iter()
        .map(|r| (r.hardware.name, r.hardware.bandwidth_gbps))
        .collect();
    assert_eq!(
        builtins,
        vec![
            ("GB10".to_string(), 273.0),
            ("RTX-Pro-6000".to_string(), 1790.0),
            ("H200".to_string(), 4800.0),
            ("B200".to_string(), 8000.0),
        ]
    );
}

#[test]
fn comparison() {
    let cmp = Comparison::new(stock(), lean());
    assert_eq!(cmp.footprint_delta_bytes, -4_015_521_024);
    close(
        cmp.bytes_per_token_ratio,
        5_890_472_912.0 / 9_905_993_936.0,
        1e-12,
    );
    let weights = &cmp.speedup[0];
    assert_eq!(weights.context, 0);
    close(weights.speedup, 9_905_993_936.0 / 5_890_472_912.0, 1e-12);
    let q = cmp
        .components
        .iter()
        .find(|c| c.component == Component::AttnQ)
        .unwrap();
    assert_eq!(q.before_precision, "bf16");
    assert_eq!(q.after_precision, "nvfp4a16");
    let text = cmp.to_string();
    assert!(text.contains("9.906 GB -> 5.890 GB"), "{text}");
    assert!(text.contains("71.899 GB -> 67.883 GB (-4.016 GB"), "{text}");
}

#[test]
fn report_text_and_json() {
    let r = stock();
    let text = r.to_string();
    for want in [
        "117,561,977,600",
        "145,153",
        "71.899 GB",
        "9.906 GB",
        "56.6%",
        "37.749 MB",
        "nvfp4 (w4a4)",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    let json: Value = serde_json::to_value(&r).unwrap();
    assert_eq!(json["totals"]["params"], 117_561_977_600u64);
    assert_eq!(json["basis"], "config");
    let experts = json["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["component"] == "routed_experts")
        .unwrap();
    assert_eq!(experts["precision"], "nvfp4 (w4a4)");
    assert_eq!(json["kv_cache"]["dtype"], "fp8");
    let cmp = serde_json::to_value(Comparison::new(stock(), lean())).unwrap();
    assert_eq!(cmp["footprint_delta_bytes"], -4_015_521_024i64);
}
