//! Helpers shared by the engine's integration tests: synthetic checkpoints and comparisons.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use fp4forge_builder::build::{NoProgress, QuantizeBuilder};
use fp4forge_builder::synth::{Preset, SynthBuilder};

/// Writes the tiny Laguna preset (window 16, vocab 512) to `root/name`: bf16, or the vendor
/// stock NVFP4 layout (routed experts W4A4) of the same seed.
pub fn tiny_laguna(root: &Path, name: &str, stock_nvfp4: bool) -> PathBuf {
    let dst = root.join(name);
    let builder = SynthBuilder::new().seed(7).stock_nvfp4(stock_nvfp4);
    let plan = builder.plan_preset(Preset::Tiny).expect("plan tiny preset");
    builder
        .write(&plan, &dst, &NoProgress)
        .expect("write tiny preset");
    dst
}

/// `quantize SRC DST` with the default targets (attention q/k/v/o): the lean build.
pub fn lean_build(src: &Path, dst: &Path) -> PathBuf {
    QuantizeBuilder::new(src, dst)
        .run(&NoProgress)
        .expect("quantize lean build");
    dst.to_path_buf()
}

/// `quantize SRC DST --targets Linear`: every linear layer NVFP4 (incl. lm_head and routers).
pub fn all_linear_build(src: &Path, dst: &Path) -> PathBuf {
    QuantizeBuilder::new(src, dst)
        .targets(vec!["Linear".into()])
        .run(&NoProgress)
        .expect("quantize all-linear build");
    dst.to_path_buf()
}

/// `n` pseudo-random token ids below `vocab`.
pub fn token_ids(n: usize, vocab: u32, seed: u64) -> Vec<u32> {
    xorshift(seed)
        .take(n)
        .map(|s| (s % u64::from(vocab)) as u32)
        .collect()
}

/// The seeded xorshift64 stream behind [`token_ids`] and [`values`].
fn xorshift(seed: u64) -> impl Iterator<Item = u64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    std::iter::repeat_with(move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    })
}

/// Largest absolute element difference.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Largest absolute value.
pub fn max_abs(a: &[f32]) -> f32 {
    a.iter().fold(0.0, |m, x| m.max(x.abs()))
}

/// Index of the largest value.
pub fn argmax(a: &[f32]) -> usize {
    fp4forge_engine::sampling::argmax(a) as usize
}

/// Copies the checkpoint `src` to `dst` with every NVFP4 module replaced by its f32
/// dequantization (`{module}.weight`, via the format crate) and no `quantization_config`:
/// the dense twin of a packed checkpoint.
pub fn dequantized_copy(src: &Path, dst: &Path) -> PathBuf {
    use fp4forge_format::{Checkpoint, Dtype, ShardWriterBuilder, TensorSpec};
    let ckpt = Checkpoint::open(src).expect("open");
    let mut specs = Vec::new();
    let mut jobs: Vec<(String, Vec<u8>)> = Vec::new();
    for t in ckpt.tensors() {
        let name = t.name();
        if let Some(module) = name.strip_suffix(".weight_packed") {
            let g = f32::from_le_bytes(
                ckpt.bytes(&format!("{module}.weight_global_scale"))
                    .unwrap()[..4]
                    .try_into()
                    .unwrap(),
            );
            let (rows, cols) = (t.info.shape[0], t.info.shape[1] * 2);
            let view = fp4forge_format::Nvfp4View {
                rows,
                cols,
                packed: t.bytes(),
                scales: ckpt.bytes(&format!("{module}.weight_scale")).unwrap(),
                global_scale: g,
            };
            let w = fp4forge_format::dequantize_f32(&view);
            let out = format!("{module}.weight");
            specs.push(TensorSpec::new(&out, Dtype::F32, vec![rows, cols]));
            jobs.push((out, w.iter().flat_map(|v| v.to_le_bytes()).collect()));
        } else if [
            ".weight_scale",
            ".weight_global_scale",
            ".input_global_scale",
        ]
        .iter()
        .any(|s| name.ends_with(s))
        {
            continue;
        } else {
            specs.push(TensorSpec::new(name, t.info.dtype, t.info.shape.clone()));
            jobs.push((name.to_owned(), t.bytes().to_vec()));
        }
    }
    std::fs::create_dir_all(dst).unwrap();
    let writer = ShardWriterBuilder::new()
        .create(dst, specs)
        .expect("writer");
    for (name, data) in &jobs {
        writer.write(name, data).expect("write");
    }
    writer.finish().expect("finish");
    let mut cfg: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    cfg.remove("quantization_config");
    std::fs::write(
        dst.join("config.json"),
        serde_json::to_vec_pretty(&cfg).unwrap(),
    )
    .unwrap();
    dst.to_path_buf()
}

/// `n` seeded pseudo-random values, uniform in `[-scale / 2, scale / 2)` (xorshift).
pub fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    xorshift(seed)
        .take(n)
        .map(|s| ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale)
        .collect()
}
