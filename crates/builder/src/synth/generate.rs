//! Seeded, streaming generation of tensor values, and the NVFP4 quantization of routed experts for
//! the stock layout.
//!
//! Every tensor is cut into chunks of [`CHUNK`] elements and each chunk draws from its own
//! SplitMix64 stream seeded by `(seed, tensor name, chunk index)`. A tensor's bytes therefore
//! depend on nothing else: not on the thread count, not on which other tensors exist, not on the
//! order of work. Normal deviates come from Marsaglia's polar method in `f64`, rounded once to the
//! tensor's dtype.

use fp4forge_format::float::{f32_to_bf16_bits, round_bf16};
use std::path::Path;

use fp4forge_format::{
    global_scale, quantize, quantize_fused, Dtype, NumericsError, Nvfp4Tensor, ShardWriter,
    SourceDtype, WeightView,
};
use rayon::prelude::*;

use super::tensors::{Layout, SourceTensor, Unit};
use crate::build::Progress;
use crate::BuilderError;

/// Elements per random stream.
pub(crate) const CHUNK: usize = 1 << 16;

/// Tensors of at least this many elements are generated one at a time, their chunks in parallel;
/// smaller units run in parallel with each other. Peak memory is about threads × this × 2 bytes.
pub(crate) const LARGE_UNIT_ELEMENTS: usize = 1 << 24;

/// Activation absmax range of the routed experts' gate/up input (one value per layer: every
/// token goes through every expert in llmcompressor's calibration).
const GATE_UP_ACT_AMAX: (f32, f32) = (2.0, 8.0);

/// Activation absmax range of a routed expert's down_proj input (one value per expert).
const DOWN_ACT_AMAX: (f32, f32) = (0.5, 1.5);

/// The SplitMix64 finaliser: a bijective 64-bit mix.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a over the bytes of `s`.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3)
    })
}

/// The seed of stream `chunk` of the tensor (or other named quantity) `name`.
fn stream_seed(seed: u64, name: &str, chunk: u64) -> u64 {
    mix(mix(mix(seed) ^ fnv1a(name)) ^ chunk)
}

/// SplitMix64: a small, fast generator, good enough for synthetic weights.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// Uniform in [0, 1) with 53 random bits.
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Two independent standard normal deviates (Marsaglia's polar method).
    fn normal_pair(&mut self) -> (f64, f64) {
        loop {
            let u = 2.0 * self.uniform() - 1.0;
            let v = 2.0 * self.uniform() - 1.0;
            let s = u * u + v * v;
            if s > 0.0 && s < 1.0 {
                let f = (-2.0 * s.ln() / s).sqrt();
                return (u * f, v * f);
            }
        }
    }
}

/// Bytes per element of a generated tensor (`BF16` or `F32`).
fn element_size(dtype: Dtype) -> usize {
    match dtype {
        Dtype::F32 => 4,
        _ => 2,
    }
}

/// Fills the little-endian bytes of chunk `chunk` of `src`.
fn fill_chunk(seed: u64, src: &SourceTensor, chunk: usize, bytes: &mut [u8]) {
    let mut rng = SplitMix64(stream_seed(seed, &src.name, chunk as u64));
    let (mean, std) = (f64::from(src.init.mean), f64::from(src.init.std));
    let size = element_size(src.dtype);
    let put = |slot: &mut [u8], z: f64| {
        let x = (mean + std * z) as f32;
        if size == 4 {
            slot.copy_from_slice(&x.to_le_bytes());
        } else {
            slot.copy_from_slice(&f32_to_bf16_bits(x).to_le_bytes());
        }
    };
    let mut pairs = bytes.chunks_exact_mut(2 * size);
    for pair in &mut pairs {
        let (a, b) = rng.normal_pair();
        let (lo, hi) = pair.split_at_mut(size);
        put(lo, a);
        put(hi, b);
    }
    let rest = pairs.into_remainder();
    if !rest.is_empty() {
        put(rest, rng.normal_pair().0);
    }
}

/// The bytes of source tensor `src` under `seed` (row-major, little endian).
pub(crate) fn generate(seed: u64, src: &SourceTensor) -> Vec<u8> {
    let size = element_size(src.dtype);
    let mut out = vec![0u8; src.numel() * size];
    let fill = |(c, bytes): (usize, &mut [u8])| fill_chunk(seed, src, c, bytes);
    if src.numel() >= LARGE_UNIT_ELEMENTS {
        out.par_chunks_mut(CHUNK * size).enumerate().for_each(fill);
    } else {
        out.chunks_mut(CHUNK * size).enumerate().for_each(fill);
    }
    out
}

/// A plausible W4A4 `input_global_scale`: `global_scale(amax)` (bf16 activations, so double bf16
/// rounding) of an activation absmax drawn uniformly from `range` by the stream named `key`.
fn input_global_scale(seed: u64, key: &str, range: (f32, f32)) -> f32 {
    let u = SplitMix64(stream_seed(seed, key, 0)).uniform() as f32;
    let amax = round_bf16(range.0 + (range.1 - range.0) * u);
    global_scale(amax, SourceDtype::Bf16)
}

/// The `input_global_scale` of the gate/up projections of every routed expert of `layer`.
pub(crate) fn gate_up_input_global_scale(seed: u64, layer: usize) -> f32 {
    let key = format!("model.layers.{layer}.mlp.experts.gate_up_proj:input_amax");
    input_global_scale(seed, &key, GATE_UP_ACT_AMAX)
}

/// The `input_global_scale` of the down projection of the routed expert `expert_name`
/// (`model.layers.L.mlp.experts.E`).
pub(crate) fn down_input_global_scale(seed: u64, expert_name: &str) -> f32 {
    let key = format!("{expert_name}.down_proj:input_amax");
    input_global_scale(seed, &key, DOWN_ACT_AMAX)
}

/// Generates every unit of `layout` and writes it to `writer`, reporting the bytes written after
/// each tensor to `progress` and stopping with [`BuilderError::Cancelled`] when it asks. Large
/// units go one at a time (their chunks in parallel), the rest in parallel with each other, on
/// the current rayon pool. `dst` names the output in errors.
pub(crate) fn run(
    layout: &Layout,
    seed: u64,
    writer: &ShardWriter,
    progress: &dyn Progress,
    dst: &Path,
) -> Result<(), BuilderError> {
    let elements = |u: &Unit| match *u {
        Unit::Plain(i) => layout.sources[i].numel(),
        Unit::Expert { gate, up, down, .. } => [gate, up, down]
            .iter()
            .map(|&i| layout.sources[i].numel())
            .sum(),
    };
    let (large, small): (Vec<&Unit>, Vec<&Unit>) = layout
        .units
        .iter()
        .partition(|u| elements(u) >= LARGE_UNIT_ELEMENTS);
    let step = |unit: &Unit| {
        if progress.cancelled() {
            return Err(BuilderError::Cancelled);
        }
        run_unit(layout, seed, unit, writer, progress).map_err(|e| match e {
            UnitError::Numerics(source) => BuilderError::Numerics {
                file: dst.to_path_buf(),
                source,
            },
            UnitError::Builder(e) => e,
        })
    };
    for unit in large {
        step(unit)?;
    }
    small.par_iter().try_for_each(|unit| step(unit))
}

/// A unit's failure: numerics errors get the output's name attached by [`run`].
enum UnitError {
    Numerics(NumericsError),
    Builder(BuilderError),
}

impl From<NumericsError> for UnitError {
    fn from(e: NumericsError) -> Self {
        UnitError::Numerics(e)
    }
}

impl From<fp4forge_format::CheckpointError> for UnitError {
    fn from(e: fp4forge_format::CheckpointError) -> Self {
        UnitError::Builder(e.into())
    }
}

fn run_unit(
    layout: &Layout,
    seed: u64,
    unit: &Unit,
    writer: &ShardWriter,
    progress: &dyn Progress,
) -> Result<(), UnitError> {
    let write = |name: &str, bytes: &[u8]| -> Result<(), UnitError> {
        writer.write(name, bytes)?;
        progress.advance(bytes.len() as u64);
        Ok(())
    };
    match *unit {
        Unit::Plain(i) => {
            let src = &layout.sources[i];
            write(&src.name, &generate(seed, src))
        }
        Unit::Expert {
            layer,
            gate,
            up,
            down,
        } => {
            let [gate, up, down] = [gate, up, down].map(|i| &layout.sources[i]);
            let (fused, down_q) = quantize_expert(seed, gate, up, down)?;
            let expert = gate
                .name
                .strip_suffix(".gate_proj.weight")
                .unwrap_or(&gate.name)
                .to_owned();
            let gate_up_act = gate_up_input_global_scale(seed, layer);
            let down_act = down_input_global_scale(seed, &expert);
            for (proj, q, act) in [
                ("gate_proj", &fused[0], gate_up_act),
                ("up_proj", &fused[1], gate_up_act),
                ("down_proj", &down_q, down_act),
            ] {
                let p = format!("{expert}.{proj}");
                write(&format!("{p}.weight_packed"), &q.packed)?;
                write(&format!("{p}.weight_scale"), &q.scales)?;
                write(
                    &format!("{p}.weight_global_scale"),
                    &q.global_scale.to_le_bytes(),
                )?;
                write(&format!("{p}.input_global_scale"), &act.to_le_bytes())?;
            }
            Ok(())
        }
    }
}

/// Generates an expert's bf16 weights (the same bytes the bf16 synth writes for them) and
/// quantizes them: gate/up fused (one global scale), down alone.
fn quantize_expert(
    seed: u64,
    gate: &SourceTensor,
    up: &SourceTensor,
    down: &SourceTensor,
) -> Result<(Vec<Nvfp4Tensor>, Nvfp4Tensor), NumericsError> {
    let [g, u, d] = [gate, up, down].map(|s| generate(seed, s));
    let views = [view(gate, &g)?, view(up, &u)?];
    let fused = quantize_fused(&views)?;
    let down_q = quantize(&view(down, &d)?)?;
    Ok((fused, down_q))
}

/// A bf16 view of the generated bytes of the 2-D source tensor `src`.
fn view<'a>(src: &'a SourceTensor, bytes: &'a [u8]) -> Result<WeightView<'a>, NumericsError> {
    WeightView::new(
        &src.name,
        SourceDtype::Bf16,
        src.shape[0],
        src.shape[1],
        bytes,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::tensors::Init;

    fn tensor(n: usize, dtype: Dtype) -> SourceTensor {
        SourceTensor {
            name: "model.layers.0.self_attn.q_proj.weight".into(),
            dtype,
            shape: vec![n],
            init: Init::linear(64),
        }
    }

    #[test]
    fn parallel_and_sequential_fill_agree() {
        let src = tensor(LARGE_UNIT_ELEMENTS + 12_345, Dtype::BF16);
        let parallel = generate(7, &src);
        let mut sequential = vec![0u8; parallel.len()];
        sequential
            .chunks_mut(CHUNK * 2)
            .enumerate()
            .for_each(|(c, b)| fill_chunk(7, &src, c, b));
        assert_eq!(parallel, sequential);
    }

    #[test]
    fn values_depend_on_seed_and_name_and_look_normal() {
        let a = tensor(100_001, Dtype::F32);
        let mut b = a.clone();
        b.name.push('x');
        let va = generate(0, &a);
        assert_eq!(va, generate(0, &a));
        assert_ne!(va, generate(1, &a));
        assert_ne!(va, generate(0, &b));
        let xs: Vec<f64> = va
            .chunks_exact(4)
            .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect();
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let std = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
        assert!(mean.abs() < 0.002, "mean {mean}");
        assert!((std - 0.125).abs() < 0.002, "std {std}");
    }

    #[test]
    fn input_global_scales_are_bf16_values_in_range() {
        for layer in 1..20 {
            let g = gate_up_input_global_scale(3, layer);
            assert_eq!(g, round_bf16(g));
            assert!((2688.0 / 8.1..=2688.0 / 1.9).contains(&g), "{g}");
            let d = down_input_global_scale(3, &format!("model.layers.{layer}.mlp.experts.0"));
            assert!((2688.0 / 1.6..=2688.0 / 0.45).contains(&d), "{d}");
        }
    }
}
