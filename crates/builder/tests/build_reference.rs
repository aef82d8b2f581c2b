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
