//! The CPU backend's linear kernels against the format crate's dequantization and a plain f64
//! matmul: NVFP4 (packed, dequantized in the loop), bf16, f16 and f32 weights, one token (GEMV)
//! and several (GEMM), SIMD and portable kernels, plus the W4A4 activation emulation.
//!
//! Tolerance: `|got - want| <= 1e-5 · Σ_k |w_k·x_k| + 1e-7`. The kernels compute the same products
//! in f32 in a different order (blocks of 16, eight lanes, scale applied per block), so the error
//! is bounded by a few f32 ulps of the sum of absolute terms.

mod common;

use common::values;
use fp4forge_engine::backend::cpu::CpuBackend;
use fp4forge_engine::{Backend, LinearWeight};
use fp4forge_format::{dequantize_f32, quantize, Nvfp4View, SourceDtype, WeightView};

fn bf16_bits(v: &[f32]) -> Vec<u16> {
    v.iter()
        .map(|x| half::bf16::from_f32(*x).to_bits())
        .collect()
}

/// `x [t, cols] · Wᵀ` in f64 and `Σ|w·x|` per output.
fn reference(w: &[f32], rows: usize, cols: usize, x: &[f32], t: usize) -> (Vec<f64>, Vec<f64>) {
    let mut out = vec![0f64; t * rows];
    let mut mag = vec![0f64; t * rows];
    for tok in 0..t {
        for r in 0..rows {
            for k in 0..cols {
                let p = f64::from(w[r * cols + k]) * f64::from(x[tok * cols + k]);
                out[tok * rows + r] += p;
                mag[tok * rows + r] += p.abs();
            }
        }
    }
    (out, mag)
}

fn check(backend: &CpuBackend, w: LinearWeight, dense: &[f32], label: &str) {
    let (rows, cols) = (w.rows(), w.cols());
    let lin = backend.load_linear(label, w).unwrap();
    for t in [1usize, 3, 9] {
        let x = values(t * cols, 99 + t as u64, 4.0);
        let xt = backend.upload(t, cols, &x).unwrap();
        let got = backend
            .download(&backend.linear(&xt, &lin, None).unwrap())
            .unwrap();
        let (want, mag) = reference(dense, rows, cols, &x, t);
        for i in 0..t * rows {
            let err = (f64::from(got[i]) - want[i]).abs();
            assert!(
                err <= 1e-5 * mag[i] + 1e-7,
                "{label} {} t={t} out {i}: got {} want {} (err {err}, Σ|wx| {})",
                backend.name(),
                got[i],
                want[i],
                mag[i]
            );
        }
    }
}

fn backends() -> Vec<CpuBackend> {
    vec![
        CpuBackend::new(),
        CpuBackend::new().without_avx512(),
        CpuBackend::new().scalar_only(),
    ]
}

#[test]
fn nvfp4_linear_equals_dequantize_then_matmul() {
    for (rows, cols) in [(576, 1536), (1536, 576), (37, 80), (5, 16)] {
        let w = values(rows * cols, rows as u64 * 31 + cols as u64, 0.2);
        let bits = bf16_bits(&w);
        let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let view = WeightView::new("w", SourceDtype::Bf16, rows, cols, &bytes).unwrap();
        let q = quantize(&view).unwrap();
        let dense = dequantize_f32(&Nvfp4View::of(&q));
        let weight = LinearWeight::from_nvfp4(&q, None);
        assert_eq!(weight.to_f32(), dense, "decode_row equals dequantize_f32");
        for b in backends() {
            check(&b, weight.clone(), &dense, &format!("nvfp4 {rows}x{cols}"));
        }
    }
}

#[test]
fn dense_linears_equal_matmul() {
    for (rows, cols) in [(576, 1536), (37, 83), (3, 5)] {
        let w = values(rows * cols, 7 + rows as u64, 0.2);
        let bits = bf16_bits(&w);
        let bf16_vals: Vec<f32> = bits
            .iter()
            .map(|b| half::bf16::from_bits(*b).to_f32())
            .collect();
        let f16_bits: Vec<u16> = w
            .iter()
            .map(|x| half::f16::from_f32(*x).to_bits())
            .collect();
        let f16_vals: Vec<f32> = f16_bits
            .iter()
            .map(|b| half::f16::from_bits(*b).to_f32())
            .collect();
        let f16 = LinearWeight::F16 {
            data: fp4forge_engine::Bytes::from_vec(
                f16_bits.iter().flat_map(|b| b.to_le_bytes()).collect(),
            ),
            rows,
            cols,
        };
        for b in backends() {
            check(
                &b,
                LinearWeight::from_bf16_bits(rows, cols, &bits),
                &bf16_vals,
                "bf16",
            );
            check(&b, f16.clone(), &f16_vals, "f16");
            check(&b, LinearWeight::from_f32(rows, cols, &w), &w, "f32");
        }
    }
}

#[test]
fn w4a4_emulation_quantizes_the_activations() {
    let (rows, cols) = (24, 64);
    let w = values(rows * cols, 3, 0.2);
    let bytes: Vec<u8> = bf16_bits(&w).iter().flat_map(|b| b.to_le_bytes()).collect();
    let q =
        quantize(&WeightView::new("w", SourceDtype::Bf16, rows, cols, &bytes).unwrap()).unwrap();
    let dense = dequantize_f32(&Nvfp4View::of(&q));
    let x = values(2 * cols, 5, 4.0);
    // The activations' own NVFP4 round trip, with the format crate's quantizer (f32 source).
    let igs = 2688.0 / 2.0; // amax 2
    let xbytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let xq = fp4forge_format::quantize_with_global_scale(
        &WeightView::new("x", SourceDtype::F32, 2, cols, &xbytes).unwrap(),
        igs,
    )
    .unwrap();
    let x_fake = dequantize_f32(&Nvfp4View::of(&xq));
    assert!(x_fake != x);
    let backend = CpuBackend::new();
    let lin = backend
        .load_linear("w", LinearWeight::from_nvfp4(&q, Some(igs)))
        .unwrap();
    let xt = backend.upload(2, cols, &x).unwrap();
    let got = backend
        .download(&backend.linear(&xt, &lin, None).unwrap())
        .unwrap();
    let (want, mag) = reference(&dense, rows, cols, &x_fake, 2);
    for i in 0..2 * rows {
        assert!(
            (f64::from(got[i]) - want[i]).abs() <= 1e-5 * mag[i] + 1e-7,
            "out {i}"
        );
    }
}

#[test]
fn embedding_rows_decode_exactly() {
    let (rows, cols) = (10, 32);
    let w = values(rows * cols, 1, 0.5);
    let bytes: Vec<u8> = bf16_bits(&w).iter().flat_map(|b| b.to_le_bytes()).collect();
    let q =
        quantize(&WeightView::new("e", SourceDtype::Bf16, rows, cols, &bytes).unwrap()).unwrap();
    let dense = dequantize_f32(&Nvfp4View::of(&q));
    for b in backends() {
        let table = b
            .load_linear("e", LinearWeight::from_nvfp4(&q, None))
            .unwrap();
        let got = b.download(&b.embed(&table, &[3, 0, 9]).unwrap()).unwrap();
        for (i, id) in [3usize, 0, 9].into_iter().enumerate() {
            assert_eq!(
                &got[i * cols..(i + 1) * cols],
                &dense[id * cols..(id + 1) * cols]
            );
        }
    }
}
