//! Emulated NVFP4 activation quantization (W4A4 modules, `ModelOptions::emulate_w4a4`): what a
//! Blackwell FP4 GEMM does to its input before multiplying, reproduced in f32 so the CPU's
//! numbers match.
//!
//! Per row, per 16 consecutive inputs (compressed-tensors `tensor_group`, dynamic `local`):
//! `scale = e4m3(clamp(input_global_scale · amax / 6, ±448))` (0 → 0.125), `s = scale /
//! input_global_scale`, and each value becomes `e2m1(clamp(x / s, ±6)) · s` with round half to
//! even on the E2M1 grid. The numerics are the format crate's own ([`block_scale_code`],
//! [`f32_to_e2m1`]).

use fp4forge_format::fp4::{f32_to_e2m1, E2M1_TO_F32};
use fp4forge_format::fp8::E4M3_TO_F32;
use fp4forge_format::nvfp4::block_scale_code;
use fp4forge_format::SourceDtype;

/// `x` (rows of `cols` values, `cols` a multiple of 16) quantized to NVFP4 and back.
pub fn fake_quantize(x: &[f32], cols: usize, input_global_scale: f32) -> Vec<f32> {
    let g = input_global_scale;
    let mut out = vec![0f32; x.len()];
    debug_assert!(cols.is_multiple_of(16));
    for (ob, xb) in out.chunks_exact_mut(16).zip(x.chunks_exact(16)) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let code = block_scale_code(amax, g, SourceDtype::F32);
        let s = E4M3_TO_F32[code as usize] / g;
        for (o, &v) in ob.iter_mut().zip(xb) {
            let q = (v / s).clamp(-6.0, 6.0);
            *o = E2M1_TO_F32[f32_to_e2m1(q) as usize] * s;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_values_survive_and_others_round() {
        // amax 6 with g = 448: scale = e4m3(448 · 1) = 448, s = 1: the E2M1 grid itself.
        let mut x: Vec<f32> = vec![0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        x.extend([-0.5, -6.0, 0.2, 0.3, 2.5, 3.6, 5.1, -0.74]);
        let q = fake_quantize(&x, 16, 448.0);
        assert_eq!(&q[..10], &x[..10]);
        assert_eq!(&q[10..], &[0.0, 0.5, 2.0, 4.0, 6.0, -0.5]);
    }
}
