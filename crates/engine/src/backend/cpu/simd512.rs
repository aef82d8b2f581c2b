//! AVX-512F kernels for NVFP4 (used when the CPU has AVX-512F, detected at run time): sixteen
//! 4-bit codes are widened to 32-bit lanes and mapped through a 16-entry signed f32 table with one
//! `vpermps`, so an E2M1 block costs a widen, a permute and two FMAs.
//!
//! # Safety
//! Every function requires AVX-512F, AVX2 and FMA at run time (see [`super::kernels::Isa`]).
//! Bounds: the loops stop at the shortest input; loads are unaligned.

use std::arch::x86_64::*;

/// `e2m1(code)` for the 16 codes, sign included.
#[inline(always)]
unsafe fn e2m1_table() -> __m512 {
    _mm512_setr_ps(
        0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
    )
}

/// The 64 codes of 32 packed bytes as four 16-code blocks, in element order.
#[inline(always)]
unsafe fn codes64(p: *const u8) -> [__m128i; 4] {
    let bytes = _mm256_loadu_si256(p as *const __m256i);
    let mask = _mm256_set1_epi8(0x0F);
    let lo = _mm256_and_si256(bytes, mask);
    let hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask);
    // Within each 128-bit lane: unpacklo interleaves bytes 0..7 (one block), unpackhi bytes 8..15.
    let a = _mm256_unpacklo_epi8(lo, hi); // blocks 0 | 2
    let b = _mm256_unpackhi_epi8(lo, hi); // blocks 1 | 3
    [
        _mm256_castsi256_si128(a),
        _mm256_castsi256_si128(b),
        _mm256_extracti128_si256(a, 1),
        _mm256_extracti128_si256(b, 1),
    ]
}

/// The 16 codes of 8 packed bytes, in element order.
#[inline(always)]
unsafe fn codes16(p: *const u8) -> __m128i {
    let bytes = _mm_loadl_epi64(p as *const __m128i);
    let mask = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(bytes, mask);
    let hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
    _mm_unpacklo_epi8(lo, hi)
}

/// Sixteen codes → sixteen `e2m1` values.
#[inline(always)]
unsafe fn decode16(table: __m512, codes: __m128i) -> __m512 {
    _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(codes), table)
}

/// Dot products of one NVFP4 row with `T` vectors; `lut[code] = fp8(code) / g`. The row's codes
/// are decoded once for all vectors, and each vector's products are formed and summed in the same
/// order whatever `T` is (four accumulators, one per block of an iteration: independent FMA
/// chains), so every result is bit for bit the one it gets with `T = 1`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn nvfp4_row_dot_tokens<const T: usize>(
    packed: &[u8],
    scales: &[u8],
    lut: &[f32; 256],
    xs: [&[f32]; T],
) -> [f32; T] {
    let blocks = xs
        .iter()
        .map(|x| x.len() / 16)
        .min()
        .unwrap_or(0)
        .min(packed.len() / 8)
        .min(scales.len());
    let table = e2m1_table();
    let px = xs.map(|x| x.as_ptr());
    let (pp, ps) = (packed.as_ptr(), scales.as_ptr());
    let mut acc = [[_mm512_setzero_ps(); 4]; T];
    let scale = |b: usize| _mm512_set1_ps(lut[*ps.add(b) as usize]);
    let mut b = 0;
    while b + 4 <= blocks {
        _mm_prefetch::<_MM_HINT_T0>(
            pp.wrapping_add(8 * b + super::simd::NVFP4_PREFETCH_BYTES) as *const i8
        );
        let c = codes64(pp.add(8 * b));
        let w = c.map(|cj| decode16(table, cj));
        for j in 0..4 {
            let s = scale(b + j);
            for k in 0..T {
                let p = _mm512_mul_ps(w[j], _mm512_loadu_ps(px[k].add(16 * (b + j))));
                acc[k][j] = _mm512_fmadd_ps(p, s, acc[k][j]);
            }
        }
        b += 4;
    }
    while b < blocks {
        let w = decode16(table, codes16(pp.add(8 * b)));
        let s = scale(b);
        for k in 0..T {
            let p = _mm512_mul_ps(w, _mm512_loadu_ps(px[k].add(16 * b)));
            acc[k][0] = _mm512_fmadd_ps(p, s, acc[k][0]);
        }
        b += 1;
    }
    acc.map(|a| {
        let s = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
        _mm512_reduce_add_ps(s)
    })
}

/// One NVFP4 row decoded to f32, exactly `e2m1(code) · (fp8 / g)`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn nvfp4_decode(packed: &[u8], scales: &[u8], lut: &[f32; 256], out: &mut [f32]) {
    let blocks = (packed.len() / 8).min(scales.len()).min(out.len() / 16);
    let table = e2m1_table();
    let po = out.as_mut_ptr();
    for b in 0..blocks {
        let s = _mm512_set1_ps(lut[scales[b] as usize]);
        let w = decode16(table, codes16(packed.as_ptr().add(8 * b)));
        _mm512_storeu_ps(po.add(16 * b), _mm512_mul_ps(w, s));
    }
}
