//! Builds of the tiny Laguna fixtures must equal, tensor for tensor and byte for byte, what
//! llmcompressor 0.14.0.1 + compressed-tensors 0.20.1 wrote for the same recipe
//! (`tools/reference/make_laguna_fixtures.py`), and must pass `verify`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use fp4forge_builder::build::{NoProgress, QuantizeBuilder};
use fp4forge_builder::verify::verify;
use fp4forge_format::Checkpoint;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tiny-laguna")
        .join(name)
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Every tensor of `ours` equals the reference's: same names, dtypes, shapes and bytes.
fn assert_same_tensors(ours: &Path, reference: &Path) {
    let a = Checkpoint::open(ours).unwrap();
    let b = Checkpoint::open(reference).unwrap();
    let names = |c: &Checkpoint| {
        c.tensors()
            .map(|e| e.name().to_string())
            .collect::<BTreeSet<_>>()
    };
    let (na, nb) = (names(&a), names(&b));
    assert_eq!(
        na.symmetric_difference(&nb).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "tensor sets differ"
    );
    let mut differing = Vec::new();
    for name in &na {
        let (x, y) = (a.get(name).unwrap(), b.get(name).unwrap());
        if x.info.dtype != y.info.dtype || x.info.shape != y.info.shape || x.bytes() != y.bytes() {
            differing.push(name.clone());
        }
    }
    assert!(
        differing.is_empty(),
        "{} tensors differ: {:?}",
        differing.len(),
        &differing[..differing.len().min(10)]
    );
}

fn build_and_check(src: &str, targets: &[&str], ignore: &[&str], reference: &str) {
    let out = tempfile::tempdir().unwrap();
    let dst = out.path().join("built");
    let report = QuantizeBuilder::new(fixture(src), &dst)
        .targets(strings(targets))
        .ignore(strings(ignore))
        .run(&NoProgress)
        .unwrap();
    assert!(report.summary.modules_quantized > 0);
    assert_same_tensors(&dst, &fixture(reference));
    let verdict = verify(&fixture(src), &dst).unwrap();
    assert!(verdict.passed(), "{verdict}");
    // The reference itself was built from the same source: our verify accepts it too.
    let verdict = verify(&fixture(src), &fixture(reference)).unwrap();
    assert!(verdict.passed(), "reference: {verdict}");
}

#[test]
fn attention_qkvo_equals_llmcompressor() {
    build_and_check("bf16", &[], &[], "ref_qkvo");
}

#[test]
fn all_linear_but_lm_head_router_gate_equals_llmcompressor() {
    build_and_check(
        "bf16",
        &["Linear"],
        &["lm_head", r"re:.*mlp\.gate$", r"re:.*self_attn\.g_proj$"],
        "ref_all_linear",
    );
}

#[test]
fn stock_layout_plus_qkvo_equals_llmcompressor() {
    build_and_check(
        "stock",
        &[r"re:.*self_attn\.(q|k|v|o)_proj$"],
        &[],
        "ref_stock_qkvo",
    );
}

/// Rewrites the tiny bf16 checkpoint with transformers' in-memory fused 3-D experts
/// (`mlp.experts.gate_up_proj [E, 2I, H]`, gate rows first; `mlp.experts.down_proj [E, H, I]`).
fn fused_expert_copy(into: &Path) -> PathBuf {
    use fp4forge_format::{ShardWriterBuilder, TensorSpec};
    let src = Checkpoint::open(fixture("bf16")).unwrap();
    let dir = into.join("fused3d");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(fixture("bf16/config.json"), dir.join("config.json")).unwrap();
    let expert =
        regex::Regex::new(r"^(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$").unwrap();
    let mut specs = Vec::new();
    let mut data: Vec<(String, Vec<u8>)> = Vec::new();
    /// (expert, gate|up|down, bytes, shape) per expert projection.
    type Part = (usize, String, Vec<u8>, Vec<usize>);
    let mut fused: std::collections::BTreeMap<String, Vec<Part>> = Default::default();
    for e in src.tensors() {
        if let Some(c) = expert.captures(e.name()) {
            fused.entry(c[1].to_string()).or_default().push((
                c[2].parse().unwrap(),
                c[3].to_string(),
                e.bytes().to_vec(),
                e.info.shape.clone(),
            ));
        } else {
            specs.push(TensorSpec::new(
                e.name(),
                e.info.dtype,
                e.info.shape.clone(),
            ));
            data.push((e.name().to_string(), e.bytes().to_vec()));
        }
    }
    for (prefix, mut parts) in fused {
        parts.sort_by_key(|p| p.0);
        let experts = parts.iter().map(|p| p.0).max().unwrap() + 1;
        let (mut gate_up, mut down) = (Vec::new(), Vec::new());
        let (mut i, mut h) = (0, 0);
        for e in 0..experts {
            for kind in ["gate", "up"] {
                let p = parts.iter().find(|p| p.0 == e && p.1 == kind).unwrap();
                (i, h) = (p.3[0], p.3[1]);
                gate_up.extend_from_slice(&p.2);
            }
            down.extend_from_slice(&parts.iter().find(|p| p.0 == e && p.1 == "down").unwrap().2);
        }
        let bf16 = fp4forge_format::Dtype::BF16;
        specs.push(TensorSpec::new(
            format!("{prefix}.gate_up_proj"),
            bf16,
            [experts, 2 * i, h],
        ));
        specs.push(TensorSpec::new(
            format!("{prefix}.down_proj"),
            bf16,
            [experts, h, i],
        ));
        data.push((format!("{prefix}.gate_up_proj"), gate_up));
        data.push((format!("{prefix}.down_proj"), down));
    }
    let writer = ShardWriterBuilder::new().create(&dir, specs).unwrap();
    for (name, bytes) in &data {
        writer.write(name, bytes).unwrap();
    }
    writer.finish().unwrap();
    dir
}

#[test]
fn fused_3d_experts_are_split_per_expert_like_llmcompressor() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fused_expert_copy(tmp.path());
    let dst = tmp.path().join("built");
    QuantizeBuilder::new(&src, &dst)
        .targets(strings(&["Linear"]))
        .ignore(strings(&[
            "lm_head",
            r"re:.*mlp\.gate$",
            r"re:.*self_attn\.g_proj$",
        ]))
        .run(&NoProgress)
        .unwrap();
    assert_same_tensors(&dst, &fixture("ref_all_linear"));
    let verdict = verify(&src, &dst).unwrap();
    assert!(verdict.passed(), "{verdict}");
}
