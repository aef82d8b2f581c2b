//! Dequantization of ggml blocks to `f32`, bit-exact with ggml's reference `dequantize_row_*`
//! and with the `gguf` Python package's `gguf.quants.dequantize` (both evaluate every product
//! and sum in `f32`, in the order written below, without fused multiply-adds).
//!
//! Block layouts (little-endian; `f16` scales; `QK_K` = 256):
//!
//! ```text
//! Q4_0  18 B / 32   d:f16 qs[16]                 x[j] = (lo(qs[j]) - 8)·d, x[j+16] = (hi(qs[j]) - 8)·d
//! Q4_1  20 B / 32   d:f16 m:f16 qs[16]           x = q·d + m   (same nibble order)
//! Q5_0  22 B / 32   d:f16 qh:u32 qs[16]          q = nibble | bit(qh, j)<<4;  x = (q - 16)·d
//! Q5_1  24 B / 32   d:f16 m:f16 qh:u32 qs[16]    x = q·d + m
//! Q8_0  34 B / 32   d:f16 qs:i8[32]              x = q·d
//! Q2_K  84 B        scales[16] qs[64] d dmin     16 groups of 16: x = (d·(sc&15))·q - dmin·(sc>>4)
//! Q3_K 110 B        hmask[32] qs[64] scales[12] d    16 groups: x = (d·(sc-32))·(q2 - (hbit ? 0 : 4))
//! Q4_K 144 B        d dmin scales[12] qs[128]    8 groups of 32, 6-bit sc/m: x = (d·sc)·q - dmin·m
//! Q5_K 176 B        d dmin scales[12] qh[32] qs[128]   as Q4_K with a fifth bit from qh
//! Q6_K 210 B        ql[128] qh[64] scales:i8[16] d     16 groups: x = (d·sc)·(q6 - 32)
//! Q8_K 292 B        d:f32 qs:i8[256] bsums:i16[16]     x = d·q
//! ```

use half::f16;

use super::{DequantError, GgmlType};

#[inline]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// Dequantizes `data` (whole blocks of `ty`) into `out`; `out.len()` is the element count.
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), DequantError> {
    let elements = out.len();
    let block = ty.block_size();
    if !elements.is_multiple_of(block) {
        return Err(DequantError::NotBlockAligned {
            ty,
            elements,
            block,
        });
    }
    let expected = elements / block * ty.type_size();
    if data.len() != expected {
        return Err(DequantError::ByteLength {
            ty,
            elements,
            expected,
            actual: data.len(),
        });
    }
    let blocks = data
        .chunks_exact(ty.type_size())
        .zip(out.chunks_exact_mut(block));
    match ty {
        GgmlType::F32 => {
            blocks.for_each(|(b, y)| y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
        GgmlType::F16 => blocks.for_each(|(b, y)| y[0] = f16_at(b, 0)),
        GgmlType::BF16 => blocks.for_each(|(b, y)| {
            y[0] = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)
        }),
        GgmlType::Q4_0 => blocks.for_each(|(b, y)| q4_0(b, y)),
        GgmlType::Q4_1 => blocks.for_each(|(b, y)| q4_1(b, y)),
        GgmlType::Q5_0 => blocks.for_each(|(b, y)| q5_0(b, y)),
        GgmlType::Q5_1 => blocks.for_each(|(b, y)| q5_1(b, y)),
        GgmlType::Q8_0 => blocks.for_each(|(b, y)| q8_0(b, y)),
        GgmlType::Q2_K => blocks.for_each(|(b, y)| q2_k(b, y)),
        GgmlType::Q3_K => blocks.for_each(|(b, y)| q3_k(b, y)),
        GgmlType::Q4_K => blocks.for_each(|(b, y)| q4_k(b, y)),
        GgmlType::Q5_K => blocks.for_each(|(b, y)| q5_k(b, y)),
        GgmlType::Q6_K => blocks.for_each(|(b, y)| q6_k(b, y)),
        GgmlType::Q8_K => blocks.for_each(|(b, y)| q8_k(b, y)),
        other => return Err(DequantError::Unsupported(other)),
    }
    Ok(())
}

/// Dequantizes `elements` elements of `ty` from `data` into a new vector.
pub fn dequantize_to_vec(
    ty: GgmlType,
    data: &[u8],
    elements: usize,
) -> Result<Vec<f32>, DequantError> {
    if !ty.is_dequantizable() {
        return Err(DequantError::Unsupported(ty));
    }
    let mut out = vec![0f32; elements];
    dequantize(ty, data, &mut out)?;
    Ok(out)
}

fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        y[j] = ((q & 0x0F) as i32 - 8) as f32 * d;
        y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (j, &q) in b[4..20].iter().enumerate() {
        y[j] = d * (q & 0x0F) as f32 + m;
        y[j + 16] = d * (q >> 4) as f32 + m;
    }
}

fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for (j, &q) in b[6..22].iter().enumerate() {
        let h0 = ((qh >> j) & 1) << 4;
        let h1 = ((qh >> (j + 16)) & 1) << 4;
        y[j] = ((u32::from(q & 0x0F) | h0) as i32 - 16) as f32 * d;
        y[j + 16] = ((u32::from(q >> 4) | h1) as i32 - 16) as f32 * d;
    }
}

fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    for (j, &q) in b[8..24].iter().enumerate() {
        let h0 = ((qh >> j) & 1) << 4;
        let h1 = ((qh >> (j + 16)) & 1) << 4;
        y[j] = d * (u32::from(q & 0x0F) | h0) as f32 + m;
        y[j + 16] = d * (u32::from(q >> 4) | h1) as f32 + m;
    }
}

fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (y, &q) in y.iter_mut().zip(&b[2..34]) {
        *y = (q as i8) as f32 * d;
    }
}

fn q2_k(b: &[u8], y: &mut [f32]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    // 16 groups of 16; group g reads qs[32·(g/8) + 16·(g%2) ..][..16] shifted by 2·((g/2)%4).
    for (g, (&sc, y)) in scales.iter().zip(y.chunks_exact_mut(16)).enumerate() {
        let dl = d * (sc & 0x0F) as f32;
        let ml = dmin * (sc >> 4) as f32;
        let q = &qs[32 * (g / 8) + 16 * (g % 2)..][..16];
        let shift = 2 * ((g / 2) % 4);
        for (y, &q) in y.iter_mut().zip(q) {
            *y = dl * ((q >> shift) & 3) as f32 - ml;
        }
    }
}

fn q3_k(b: &[u8], y: &mut [f32]) {
    let (hmask, qs, sc) = (&b[0..32], &b[32..96], &b[96..108]);
    let d = f16_at(b, 108);
    // 6-bit scales: low nibbles from sc[0..8], high 2 bits from sc[8..12].
    let mut scales = [0i32; 16];
    for (i, s) in scales.iter_mut().enumerate() {
        let lo = (sc[i % 8] >> (4 * (i / 8))) & 0x0F;
        let hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 0x03;
        *s = i32::from(lo | (hi << 4)) - 32;
    }
    // Group g (16 values): qs half h = g/8 (32 bytes each), 2-bit plane (g/2)%4, bytes 16·(g%2)..;
    // hmask bit g/2 of the same 16 byte positions.
    for (g, y) in y.chunks_exact_mut(16).enumerate() {
        let dl = d * scales[g] as f32;
        let shift = 2 * ((g / 2) % 4);
        let base = 16 * (g % 2);
        let q = &qs[32 * (g / 8) + base..][..16];
        let h = &hmask[base..base + 16];
        let bit = g / 2;
        for l in 0..16 {
            let low = i32::from((q[l] >> shift) & 3);
            let sub = if (h[l] >> bit) & 1 == 1 { 0 } else { 4 };
            y[l] = dl * (low - sub) as f32;
        }
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K/Q5_K block (`get_scale_min_k4`).
#[inline]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qs) = (&b[4..16], &b[16..144]);
    for (i, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * i, scales);
        let (sc2, m2) = scale_min_k4(2 * i + 1, scales);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0x0F) as f32 - min1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - min2;
        }
    }
}

fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
    for (i, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * i, scales);
        let (sc2, m2) = scale_min_k4(2 * i + 1, scales);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
        let (u1, u2) = (1u8 << (2 * i), 1u8 << (2 * i + 1));
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * ((q[l] & 0x0F) + h1) as f32 - min1;
            y[l + 32] = d2 * ((q[l] >> 4) + h2) as f32 - min2;
        }
    }
}

fn q6_k(b: &[u8], y: &mut [f32]) {
    let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for n in 0..2 {
        let (ql, qh, sc) = (&ql[64 * n..], &qh[32 * n..], &sc[8 * n..]);
        let y = &mut y[128 * n..128 * (n + 1)];
        for l in 0..32 {
            let is = l / 16;
            let q1 = i32::from((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) - 32;
            let q2 = i32::from((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
            let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

fn q8_k(b: &[u8], y: &mut [f32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (y, &q) in y.iter_mut().zip(&b[4..260]) {
        *y = d * (q as i8) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_bits().to_le_bytes()
    }

    fn deq(ty: GgmlType, b: &[u8]) -> Vec<f32> {
        dequantize_to_vec(ty, b, ty.block_size() * b.len() / ty.type_size()).unwrap()
    }

    #[test]
    fn plain_floats() {
        let f32s: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(deq(GgmlType::F32, &f32s), [1.5, -2.0]);
        let f16s: Vec<u8> = [h(0.5), h(-65504.0)].concat();
        assert_eq!(deq(GgmlType::F16, &f16s), [0.5, -65504.0]);
        // bf16 0x3FC0 = 1.5, 0xC000 = -2.
        assert_eq!(deq(GgmlType::BF16, &[0xC0, 0x3F, 0x00, 0xC0]), [1.5, -2.0]);
    }

    #[test]
    fn q4_0_block() {
        // d = 0.5; byte j holds element j (low nibble) and j+16 (high nibble).
        let mut b = h(0.5).to_vec();
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let y = deq(GgmlType::Q4_0, &b);
        for j in 0..16 {
            assert_eq!(y[j], (j as f32 - 8.0) * 0.5);
            assert_eq!(y[j + 16], (7.0 - j as f32) * 0.5);
        }
    }

    #[test]
    fn q4_1_block() {
        // d = 0.25, m = -1: x = q/4 - 1.
        let mut b = [h(0.25), h(-1.0)].concat();
        b.extend((0..16u8).map(|j| j | (3 << 4)));
        let y = deq(GgmlType::Q4_1, &b);
        assert_eq!(y[0], -1.0);
        assert_eq!(y[15], 2.75);
        assert!(y[16..].iter().all(|&v| v == -0.25));
    }

    #[test]
    fn q5_0_and_q5_1_blocks() {
        // qh bit j is the fifth bit of element j: set for element 1 and element 17.
        let qh: u32 = (1 << 1) | (1 << 17);
        let mut b = h(1.0).to_vec();
        b.extend(qh.to_le_bytes());
        b.extend([0x21u8; 16]); // low nibble 1 (elements 0..16), high nibble 2 (16..32)
        let y = deq(GgmlType::Q5_0, &b);
        assert_eq!(y[0], 1.0 - 16.0);
        assert_eq!(y[1], 17.0 - 16.0);
        assert_eq!(y[16], 2.0 - 16.0);
        assert_eq!(y[17], 18.0 - 16.0);

        let mut b = [h(2.0), h(0.5)].concat();
        b.extend(qh.to_le_bytes());
        b.extend([0x21u8; 16]);
        let y = deq(GgmlType::Q5_1, &b);
        assert_eq!(y[0], 2.0 * 1.0 + 0.5);
        assert_eq!(y[1], 2.0 * 17.0 + 0.5);
        assert_eq!(y[17], 2.0 * 18.0 + 0.5);
    }

    #[test]
    fn q8_0_block() {
        let mut b = h(0.125).to_vec();
        b.extend((0..32).map(|j: i32| (j * 8 - 128) as i8 as u8));
        let y = deq(GgmlType::Q8_0, &b);
        assert_eq!(y[0], -16.0);
        assert_eq!(y[31], (31.0 * 8.0 - 128.0) * 0.125);
    }

    #[test]
    fn q8_k_block() {
        let mut b = 0.5f32.to_le_bytes().to_vec();
        b.extend((0..256).map(|j: i32| (j - 128) as i8 as u8));
        b.extend([0u8; 32]);
        let y = deq(GgmlType::Q8_K, &b);
        assert_eq!(y[0], -64.0);
        assert_eq!(y[255], 63.5);
    }

    #[test]
    fn q4_k_block_scales_and_mins() {
        // Sub-block 0 (elements 0..32): sc 3, m 2 in the low 6 bits of scales[0] and scales[4].
        // Sub-block 5 (elements 160..192, high nibbles of qs[64..96]): sc = (scales[9] & 15) |
        // (scales[1] >> 6) << 4 = 1 | 2<<4 = 33, m = (scales[9] >> 4) | (scales[5] >> 6) << 4 = 4.
        let mut scales = [0u8; 12];
        scales[0] = 3;
        scales[4] = 2;
        scales[1] = 0b1000_0000;
        scales[9] = 0x41;
        let mut b = [h(1.0), h(0.5)].concat();
        b.extend(scales);
        let mut qs = [0u8; 128];
        qs[0] = 0x5;
        qs[64] = 0x70;
        b.extend(qs);
        let y = deq(GgmlType::Q4_K, &b);
        assert_eq!(y[0], 3.0 * 5.0 - 0.5 * 2.0);
        assert_eq!(y[1], -1.0);
        assert_eq!(y[160], 33.0 * 7.0 - 0.5 * 4.0);
        assert_eq!(y[161], -2.0);
    }

    #[test]
    fn q5_k_fifth_bit() {
        // All scales 1, mins 0, d = 1: x = q. qh[l] bit 2i is the fifth bit of element l of
        // sub-block 2i, bit 2i+1 of sub-block 2i+1.
        let mut scales = [0u8; 12];
        scales[..4].fill(1);
        scales[8..].fill(0x01); // sub-blocks 4..8: sc low nibble 1
        let mut b = [h(1.0), h(0.0)].concat();
        b.extend(scales);
        let mut qh = [0u8; 32];
        qh[0] = 0b0000_0001; // element 0
        qh[3] = 0b0000_1000; // element 64+32+3 = 99
        b.extend(qh);
        b.extend([0x21u8; 128]);
        let y = deq(GgmlType::Q5_K, &b);
        assert_eq!(y[0], 17.0);
        assert_eq!(y[1], 1.0);
        assert_eq!(y[32], 2.0);
        assert_eq!(y[99], 18.0);
        assert_eq!(y[255], 2.0);
    }

    #[test]
    fn q6_k_block() {
        // d = 0.5, scale of group 0 = 2, group 2 (elements 32..48) = -1.
        let mut b = vec![0u8; 210];
        b[0] = 0x0F; // ql[0] low nibble 15 -> element 0; high nibble 0 -> element 64
        b[128] = 0b00_00_01_10; // qh[0]: element 0 gets 2<<4, element 32 gets 1<<4
        b[192] = 2;
        b[194] = (-1i8) as u8;
        b[196] = 3;
        b[208..210].copy_from_slice(&h(0.5));
        let y = deq(GgmlType::Q6_K, &b);
        assert_eq!(y[0], 0.5 * 2.0 * (15.0 + 32.0 - 32.0));
        assert_eq!(y[32], -0.5 * (16.0 - 32.0)); // d · scale(-1) · (16 - 32)
        assert_eq!(y[64], 0.5 * 3.0 * -32.0);
    }

    #[test]
    fn q2_k_and_q3_k_groups() {
        // Q2_K: group 3 (elements 48..64) reads qs[16..32] >> 2; sc 0x21: d·1, min·2.
        let mut b = vec![0u8; 84];
        b[3] = 0x21;
        b[16 + 16] = 0b0000_1100;
        b[80..82].copy_from_slice(&h(2.0));
        b[82..84].copy_from_slice(&h(0.25));
        let y = deq(GgmlType::Q2_K, &b);
        assert_eq!(y[48], 2.0 * 3.0 - 0.5);
        assert_eq!(y[49], -0.5);
        assert_eq!(y[0], 0.0);

        // Q3_K: scale 0 = (sc[0] & 15 | (sc[8] & 3) << 4) - 32 = (1 | 2<<4) - 32 = 1.
        // Element 0: low bits 3, hmask bit 0 set -> 3; element 1: low 0, bit clear -> -4.
        let mut b = vec![0u8; 110];
        b[0] = 1; // hmask[0] bit 0
        b[32] = 3; // qs[0]
        b[96] = 1;
        b[104] = 2;
        b[108..110].copy_from_slice(&h(0.5));
        let y = deq(GgmlType::Q3_K, &b);
        assert_eq!(y[0], 0.5 * 3.0);
        assert_eq!(y[1], 0.5 * -4.0);
        // Group 1 (elements 16..32) has scale (0 | 0) - 32 = -32, q = 0 - 4.
        assert_eq!(y[16], 0.5 * -32.0 * -4.0);
    }

    #[test]
    fn bad_lengths_and_types_are_errors() {
        let mut out = vec![0f32; 32];
        assert!(matches!(
            dequantize(GgmlType::Q4_1, &[0; 19], &mut out),
            Err(DequantError::ByteLength { expected: 20, .. })
        ));
        let mut out = vec![0f32; 31];
        assert!(matches!(
            dequantize(GgmlType::Q4_1, &[0; 20], &mut out),
            Err(DequantError::NotBlockAligned { .. })
        ));
        let mut out = vec![0f32; 256];
        assert!(matches!(
            dequantize(GgmlType::IQ2_XXS, &[0; 66], &mut out),
            Err(DequantError::Unsupported(GgmlType::IQ2_XXS))
        ));
    }
}
