//! AVX2 kernel for NVFP4 → bf16 dequantization: 16 elements per block in two 8-lane vectors.
//! Bit-identical to the portable path: same f32 product `e2m1 · (fp8 / g)`, same round to
//! nearest even (all values are finite).

use std::arch::x86_64::*;

use crate::fp8::e4m3_to_f32;
use crate::nvfp4::BLOCK;

/// Dequantize whole blocks: `out.len() == 16 * scales.len()`, `packed.len() == 8 * scales.len()`.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn dequantize_bf16_blocks(out: &mut [u16], packed: &[u8], scales: &[u8], g: f32) {
    let magnitudes = _mm256_setr_ps(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
    let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    let nibble = _mm256_set1_epi32(0xF);
    let eight = _mm256_set1_epi32(0x8);
    let round_bias = _mm256_set1_epi32(0x7FFF);
    let one = _mm256_set1_epi32(1);
    let blocks = scales.len().min(packed.len() / 8).min(out.len() / BLOCK);
    for b in 0..blocks {
        let s_eff = _mm256_set1_ps(e4m3_to_f32(scales[b]) / g);
        let bytes = &packed[8 * b..8 * b + 8];
        let mut halves = [_mm256_setzero_si256(); 2];
        for (h, word) in halves.iter_mut().zip(bytes.chunks_exact(4)) {
            let w = i32::from_le_bytes([word[0], word[1], word[2], word[3]]);
            // Element 2k is the low nibble of byte k: codes in element order.
            let codes = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w), shifts), nibble);
            let magnitude = _mm256_permutevar8x32_ps(magnitudes, codes);
            let sign = _mm256_slli_epi32(_mm256_and_si256(codes, eight), 28);
            let value = _mm256_or_ps(magnitude, _mm256_castsi256_ps(sign));
            let bits = _mm256_castps_si256(_mm256_mul_ps(value, s_eff));
            let lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), one);
            let rounded = _mm256_add_epi32(_mm256_add_epi32(bits, round_bias), lsb);
            *h = _mm256_srli_epi32(rounded, 16);
        }
        // packus interleaves 128-bit lanes: [a0..3, b0..3, a4..7, b4..7] → reorder the quads.
        let packed16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(halves[0], halves[1]), 0xD8);
        _mm256_storeu_si256(out.as_mut_ptr().add(BLOCK * b) as *mut __m256i, packed16);
    }
}

/// Widen 16 bf16 values (32 bytes at `src`) to two 8-lane f32 vectors.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_bf16_block(src: *const u8) -> [__m256; 2] {
    let raw = _mm256_loadu_si256(src as *const __m256i);
    let widen =
        |half: __m128i| _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
    [
        widen(_mm256_castsi256_si128(raw)),
        widen(_mm256_extracti128_si256(raw, 1)),
    ]
}

/// Largest magnitude of a bf16 row whose length is a multiple of 32 bytes, and whether every
/// element is finite.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn bf16_row_amax(row: &[u8]) -> (f32, bool) {
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let inf = _mm256_set1_ps(f32::INFINITY);
    let mut amax = _mm256_setzero_ps();
    // NaN compares unordered and inf equals inf: both fail `< inf`.
    let mut finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for b in 0..row.len() / 32 {
        for x in load_bf16_block(row.as_ptr().add(32 * b)) {
            let a = _mm256_and_ps(x, abs_mask);
            finite = _mm256_and_ps(finite, _mm256_cmp_ps(a, inf, _CMP_LT_OQ));
            amax = _mm256_max_ps(amax, a);
        }
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), amax);
    let all_finite = _mm256_movemask_ps(finite) == 0xFF;
    (lanes.iter().fold(0f32, |m, &v| m.max(v)), all_finite)
}

/// Quantize one bf16 row (`row.len() == 2 * 16 * scales.len()`) into packed codes and fp8 block
/// scale codes, given `s_eff[code] = fp8(code) / g` for every scale code. Bit-identical to the
/// portable path: block scales come from the same scalar function, and every element goes
/// through the same IEEE f32 division, clamp and threshold chain, 8 lanes at a time.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn quantize_bf16_row(
    row: &[u8],
    g: f32,
    s_eff: &[f32; 256],
    packed: &mut [u8],
    scales: &mut [u8],
) {
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let six = _mm256_set1_ps(6.0);
    let neg_six = _mm256_set1_ps(-6.0);
    let zero = _mm256_setzero_ps();
    let eight = _mm256_set1_epi32(8);
    let thresholds = [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0].map(|t| _mm256_set1_ps(t));
    // Gather byte 0 and byte 8 of each 128-bit lane (the packed byte of each 64-bit pair).
    let gather = _mm256_setr_epi8(
        0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, //
        0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    );
    let blocks = scales.len().min(packed.len() / 8).min(row.len() / 32);
    // Pass 1: block scales (short independent chains, overlapped by the CPU).
    for (b, scale) in scales.iter_mut().enumerate().take(blocks) {
        let x = load_bf16_block(row.as_ptr().add(32 * b));
        let m = _mm256_max_ps(_mm256_and_ps(x[0], abs_mask), _mm256_and_ps(x[1], abs_mask));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
        *scale = crate::nvfp4::block_scale_code(_mm_cvtss_f32(m), g, crate::SourceDtype::Bf16);
    }
    // Pass 2: elements.
    for b in 0..blocks {
        let x = load_bf16_block(row.as_ptr().add(32 * b));
        let divisor = _mm256_set1_ps(s_eff[scales[b] as usize]);
        let mut out = [0u32; 2];
        for (o, xv) in out.iter_mut().zip(x) {
            let v = _mm256_min_ps(_mm256_max_ps(_mm256_div_ps(xv, divisor), neg_six), six);
            let a = _mm256_and_ps(v, abs_mask);
            // Each true comparison is -1 in its lane: subtracting the masks counts them.
            let mut index = _mm256_setzero_si256();
            for (i, t) in thresholds.iter().enumerate() {
                let hit = if i % 2 == 0 {
                    _mm256_cmp_ps(a, *t, _CMP_GT_OQ)
                } else {
                    _mm256_cmp_ps(a, *t, _CMP_GE_OQ)
                };
                index = _mm256_sub_epi32(index, _mm256_castps_si256(hit));
            }
            let negative = _mm256_castps_si256(_mm256_cmp_ps(v, zero, _CMP_LT_OQ));
            let codes = _mm256_or_si256(index, _mm256_and_si256(negative, eight));
            // Pair lanes (2k, 2k+1) as one u64: low byte = code[2k] | code[2k+1] << 4.
            let pairs = _mm256_or_si256(codes, _mm256_srli_epi64(codes, 28));
            let bytes = _mm256_shuffle_epi8(pairs, gather);
            let lo = _mm256_extract_epi16(bytes, 0) as u16 as u32;
            let hi = _mm256_extract_epi16(bytes, 8) as u16 as u32;
            *o = lo | (hi << 16);
        }
        packed[8 * b..8 * b + 4].copy_from_slice(&out[0].to_le_bytes());
        packed[8 * b + 4..8 * b + 8].copy_from_slice(&out[1].to_le_bytes());
    }
}
