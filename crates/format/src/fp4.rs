//! FP4 E2M1: a 4-bit code `sign << 3 | index`, index into {0, 0.5, 1, 1.5, 2, 3, 4, 6}.

/// Largest E2M1 magnitude.
pub const E2M1_MAX: f32 = 6.0;

/// Decode table, indexed by the 4-bit code (0x8 is -0).
pub const E2M1_TO_F32: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Round a finite `f32` to its E2M1 code exactly as compressed-tensors' `cast_to_fp4` threshold
/// chain does: saturate at ±6, round half to even on the E2M1 grid, and set the sign bit iff
/// `v < 0` (so a negative value rounding to zero is 0x8, while `-0.0` is 0x0).
#[inline(always)]
pub fn f32_to_e2m1(v: f32) -> u8 {
    let a = v.abs();
    // Branch-free sum of the reference's masked comparisons (≤ and < alternate: ties to even).
    let index = u8::from(a > 0.25)
        + u8::from(a >= 0.75)
        + u8::from(a > 1.25)
        + u8::from(a >= 1.75)
        + u8::from(a > 2.5)
        + u8::from(a >= 3.5)
        + u8::from(a > 5.0);
    (u8::from(v < 0.0) << 3) | index
}

/// Decode one E2M1 code (only the low 4 bits are used).
#[inline]
pub fn e2m1_to_f32(code: u8) -> f32 {
    E2M1_TO_F32[(code & 0xF) as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_round_half_to_even() {
        let cases = [
            (0.25, 0x0),
            (0.2500001, 0x1),
            (0.75, 0x2),
            (1.25, 0x2),
            (1.75, 0x4),
            (2.5, 0x4),
            (3.5, 0x6),
            (5.0, 0x6),
            (5.0001, 0x7),
            (100.0, 0x7),
            (-0.1, 0x8),
            (-0.0, 0x0),
            (-6.0, 0xF),
        ];
        for (v, code) in cases {
            assert_eq!(f32_to_e2m1(v), code, "value {v}");
        }
    }

    #[test]
    fn grid_values_are_fixed_points() {
        for code in 0..16u8 {
            let v = e2m1_to_f32(code);
            let expect = if code == 0x8 { 0x0 } else { code };
            assert_eq!(f32_to_e2m1(v), expect);
        }
    }
}
