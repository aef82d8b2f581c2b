//! Round-to-nearest-even narrowing of `f32` to the 16-bit float types, as torch does it.
//!
//! The reference evaluates every bf16/fp16 tensor operation in `f32` and rounds the result back to
//! the tensor's dtype; these helpers are that rounding, returning the rounded value widened to `f32`.

use half::{bf16, f16};

/// `f32` rounded to the nearest bf16 (ties to even), widened back to `f32`. Overflow gives ±inf.
#[inline]
pub fn round_bf16(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// `f32` rounded to the nearest fp16 (ties to even, subnormals kept), widened back to `f32`.
/// Overflow gives ±inf.
#[inline]
pub fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// bf16 bits → `f32` (exact).
#[inline]
pub fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// `f32` → bf16 bits, round to nearest even (NaN stays NaN).
#[inline]
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    bf16::from_f32(x).to_bits()
}

/// fp16 bits → `f32` (exact).
#[inline]
pub fn f16_bits_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_ties_go_to_even() {
        // 1 + 2^-8 lies exactly between bf16 1.0 and 1.0078125: even mantissa (1.0) wins.
        assert_eq!(round_bf16(1.0 + 2f32.powi(-8)), 1.0);
        // 1 + 3*2^-8 lies between 1.0078125 (odd) and 1.015625 (even).
        assert_eq!(round_bf16(1.0 + 3.0 * 2f32.powi(-8)), 1.015625);
        assert!(round_bf16(f32::MAX).is_infinite());
    }

    #[test]
    fn f16_keeps_subnormals_and_overflows() {
        assert_eq!(round_f16(2f32.powi(-24)), 2f32.powi(-24));
        assert!(round_f16(70000.0).is_infinite());
    }
}
