//! FP8 E4M3FN (torch `float8_e4m3fn`, safetensors `F8_E4M3`): bias 7, no infinities,
//! NaN = 0x7F/0xFF, largest finite 448 (0x7E), subnormals m·2^-9 (0x01..0x07).

/// Largest finite E4M3FN value.
pub const E4M3_MAX: f32 = 448.0;

/// Decode table: the value of every E4M3FN byte.
pub static E4M3_TO_F32: [f32; 256] = build_decode_table();

const fn build_decode_table() -> [f32; 256] {
    let mut table = [0f32; 256];
    let mut code = 0usize;
    while code < 256 {
        let exp = ((code >> 3) & 0xF) as i32;
        let mant = (code & 0x7) as u32;
        let magnitude = if exp == 0xF && mant == 0x7 {
            f32::NAN
        } else if exp == 0 {
            // m * 2^-9, exact: build the f32 bits directly (const context).
            mant as f32 / 512.0
        } else {
            // (8 + m) * 2^(exp - 10)
            let bits = (((exp - 7 + 127) as u32) << 23) | (mant << 20);
            f32::from_bits(bits)
        };
        table[code] = if code & 0x80 != 0 {
            -magnitude
        } else {
            magnitude
        };
        code += 1;
    }
    table
}

/// Decode one E4M3FN byte.
#[inline]
pub fn e4m3_to_f32(code: u8) -> f32 {
    E4M3_TO_F32[code as usize]
}

/// Encode `x` as E4M3FN exactly like torch's `tensor.to(torch.float8_e4m3fn)` (torch 2.14):
/// round to nearest even, subnormals kept, magnitudes that round past 448 (and ±inf) saturate to
/// ±448, and NaN becomes NaN (0x7F with the sign bit of `x`).
#[inline]
pub fn f32_to_e4m3(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    if x.is_nan() {
        return sign | 0x7F;
    }
    let abs_bits = bits & 0x7FFF_FFFF;
    // 464.0 = 0x43E8_0000 is the tie between 448 and 480: it and everything below rounds to at
    // most 448; anything above saturates to 448 (0x7E).
    let magnitude = if abs_bits > 0x43E8_0000 {
        0x7E
    } else if abs_bits < 0x3C80_0000 {
        // below 2^-6: subnormal range; |x| * 2^9 is exact, round half to even to an integer m.
        (f32::from_bits(abs_bits) * 512.0).round_ties_even() as u8
    } else {
        // normal: rebias the exponent and round the 23-bit mantissa to 3 bits, ties to even.
        let mant_odd = (abs_bits >> 20) & 1;
        let rebased = abs_bits - ((127 - 7) << 23) + 0x7_FFFF + mant_odd;
        (rebased >> 20) as u8
    };
    sign | magnitude
}

/// Encode `x` as E4M3FN after clamping it to ±448 (compressed-tensors' block-scale path: it
/// clamps before the cast, so this holds whatever the torch version's overflow behaviour).
/// NaN stays NaN.
#[inline]
pub fn f32_to_e4m3_saturating(x: f32) -> u8 {
    f32_to_e4m3(x.clamp(-E4M3_MAX, E4M3_MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_known_codes() {
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0x20), 0.125);
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0xFE), -448.0);
        assert!(e4m3_to_f32(0x7F).is_nan());
    }

    #[test]
    fn every_finite_code_round_trips() {
        for code in 0..=255u8 {
            let v = e4m3_to_f32(code);
            if v.is_nan() {
                continue;
            }
            let back = f32_to_e4m3(v);
            if v == 0.0 {
                assert_eq!(back & 0x7F, 0);
            } else {
                assert_eq!(back, code, "code {code:#x}");
            }
        }
    }

    #[test]
    fn ties_and_overflow() {
        assert_eq!(f32_to_e4m3(464.0), 0x7E); // tie between 448 and 480: even mantissa
        assert_eq!(f32_to_e4m3(470.0), 0x7E); // rounds past 448: saturates (torch 2.14)
        assert_eq!(f32_to_e4m3(f32::NEG_INFINITY), 0xFE);
        assert_eq!(f32_to_e4m3(f32::NAN), 0x7F);
        assert_eq!(f32_to_e4m3_saturating(1e9), 0x7E);
        assert_eq!(f32_to_e4m3(2f32.powi(-10)), 0x00); // half of the smallest subnormal: to even
        assert_eq!(f32_to_e4m3(3.0 * 2f32.powi(-10)), 0x02);
    }
}
