//! AVX2 + FMA (+ F16C) kernels. Each function is compiled for those features only and called
//! only after runtime detection ([`super::kernels::Isa`]); the crate is never built with
//! `target-cpu=native`.
//!
//! The weight-times-vector kernels decode weights into f32 lanes in whatever order is cheapest
//! and read `x` in that same order, permuted once per matmul by [`super::kernels`] (shared by all
//! rows): bf16 rows are split into even and odd elements with a shift and a mask (no shuffle);
//! NVFP4 codes of 16 packed bytes (two 16-element blocks) are split into low and high nibbles
//! (one per 128-bit lane), looked up as the high and low bytes of `bf16(e2m1(code))` with two
//! `vpshufb` (a 16-entry table in one register each), interleaved into bf16 and widened like
//! bf16 rows. Every E2M1 value is exact in bf16, so each product `e2m1 · x` is the one the
//! scalar kernel forms; only the f32 summation order differs.
//!
//! # Safety
//! Every function here is `unsafe` because it requires AVX2, FMA (and F16C where noted) at run
//! time. Slice bounds are checked by the callers' assertions and the loops' own limits; loads are
//! unaligned.

use std::arch::x86_64::*;

/// Sum of the 8 lanes.
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
    _mm_cvtss_f32(s)
}

/// `Σ a[i]·b[i]` over `min(len)` elements.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (j, a) in acc.iter_mut().enumerate() {
            let o = i + 8 * j;
            *a = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(o)), _mm256_loadu_ps(pb.add(o)), *a);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(
            _mm256_loadu_ps(pa.add(i)),
            _mm256_loadu_ps(pb.add(i)),
            acc[0],
        );
        i += 8;
    }
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut total = hsum(s);
    while i < n {
        total += a[i] * b[i];
        i += 1;
    }
    total
}

/// Four dot products of rows `r[0..4]` with the same `x` (shares the loads of `x`).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot4(r: [&[f32]; 4], x: &[f32]) -> [f32; 4] {
    let n = r.iter().map(|s| s.len()).min().unwrap_or(0).min(x.len());
    let px = x.as_ptr();
    let p = r.map(|s| s.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 8 <= n {
        let xv = _mm256_loadu_ps(px.add(i));
        for k in 0..4 {
            acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(p[k].add(i)), xv, acc[k]);
        }
        i += 8;
    }
    let mut out = [0f32; 4];
    for k in 0..4 {
        out[k] = hsum(acc[k]);
        for j in i..n {
            out[k] += r[k][j] * x[j];
        }
    }
    out
}

/// The `4 × T` dot products of rows `w[0..4]` with rows `x[0..T]` (all of one length): the
/// prefill GEMM's register tile (each weight load feeds `T` FMAs, each `x` load four).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot4xt<const T: usize>(w: [&[f32]; 4], x: [&[f32]; T]) -> [[f32; 4]; T] {
    let n = w
        .iter()
        .map(|s| s.len())
        .chain(x.iter().map(|s| s.len()))
        .min()
        .unwrap_or(0);
    let pw = w.map(|s| s.as_ptr());
    let px = x.map(|s| s.as_ptr());
    let mut acc = [[_mm256_setzero_ps(); 4]; T];
    let mut i = 0;
    while i + 8 <= n {
        let xv = px.map(|p| _mm256_loadu_ps(p.add(i)));
        for k in 0..4 {
            let wv = _mm256_loadu_ps(pw[k].add(i));
            for t in 0..T {
                acc[t][k] = _mm256_fmadd_ps(wv, xv[t], acc[t][k]);
            }
        }
        i += 8;
    }
    let mut out = [[0f32; 4]; T];
    for t in 0..T {
        for k in 0..4 {
            out[t][k] = hsum(acc[t][k]);
            for j in i..n {
                out[t][k] += w[k][j] * x[t][j];
            }
        }
    }
    out
}

/// Eight bf16 values at `p` widened to f32.
#[inline(always)]
unsafe fn load_bf16(p: *const u8) -> __m256 {
    let h = _mm_loadu_si128(p as *const __m128i);
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
}

/// Dot products of `R` bf16 rows (little-endian bytes, `2·n` each) with `x` (`n` values): each
/// full group of 16 in [`BF16_LANE_ORDER`], the tail (`n mod 16`) in plain order.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn bf16_rows_dot<const R: usize>(rows: [&[u8]; R], x: &[f32]) -> [f32; R] {
    let n = rows
        .iter()
        .map(|r| r.len() / 2)
        .min()
        .unwrap_or(0)
        .min(x.len());
    let px = x.as_ptr();
    let p = rows.map(|r| r.as_ptr());
    // Four accumulators per row (32 values per iteration): independent FMA chains.
    let mut acc0 = [_mm256_setzero_ps(); R];
    let mut acc1 = [_mm256_setzero_ps(); R];
    let mut acc2 = [_mm256_setzero_ps(); R];
    let mut acc3 = [_mm256_setzero_ps(); R];
    let mut i = 0;
    while i + 32 <= n {
        let x0 = _mm256_loadu_ps(px.add(i));
        let x1 = _mm256_loadu_ps(px.add(i + 8));
        let x2 = _mm256_loadu_ps(px.add(i + 16));
        let x3 = _mm256_loadu_ps(px.add(i + 24));
        for k in 0..R {
            let (e0, o0) = bf16_halves(_mm256_loadu_si256(p[k].add(2 * i) as *const __m256i));
            let (e1, o1) = bf16_halves(_mm256_loadu_si256(p[k].add(2 * i + 32) as *const __m256i));
            acc0[k] = _mm256_fmadd_ps(e0, x0, acc0[k]);
            acc1[k] = _mm256_fmadd_ps(o0, x1, acc1[k]);
            acc2[k] = _mm256_fmadd_ps(e1, x2, acc2[k]);
            acc3[k] = _mm256_fmadd_ps(o1, x3, acc3[k]);
        }
        i += 32;
    }
    while i + 16 <= n {
        let x0 = _mm256_loadu_ps(px.add(i));
        let x1 = _mm256_loadu_ps(px.add(i + 8));
        for k in 0..R {
            let (even, odd) = bf16_halves(_mm256_loadu_si256(p[k].add(2 * i) as *const __m256i));
            acc0[k] = _mm256_fmadd_ps(even, x0, acc0[k]);
            acc1[k] = _mm256_fmadd_ps(odd, x1, acc1[k]);
        }
        i += 16;
    }
    let mut out = [0f32; R];
    for k in 0..R {
        let a = _mm256_add_ps(
            _mm256_add_ps(acc0[k], acc1[k]),
            _mm256_add_ps(acc2[k], acc3[k]),
        );
        out[k] = hsum(a);
        for j in i..n {
            let b = u16::from_le_bytes([rows[k][2 * j], rows[k][2 * j + 1]]);
            out[k] += f32::from_bits(u32::from(b) << 16) * x[j];
        }
    }
    out
}

/// Dot products of `R` fp16 rows with `x` (F16C conversion).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f16_rows_dot<const R: usize>(rows: [&[u8]; R], x: &[f32]) -> [f32; R] {
    let n = rows
        .iter()
        .map(|r| r.len() / 2)
        .min()
        .unwrap_or(0)
        .min(x.len());
    let px = x.as_ptr();
    let p = rows.map(|r| r.as_ptr());
    let mut acc = [_mm256_setzero_ps(); R];
    let mut i = 0;
    while i + 8 <= n {
        let xv = _mm256_loadu_ps(px.add(i));
        for k in 0..R {
            let h = _mm_loadu_si128(p[k].add(2 * i) as *const __m128i);
            acc[k] = _mm256_fmadd_ps(_mm256_cvtph_ps(h), xv, acc[k]);
        }
        i += 8;
    }
    let mut out = [0f32; R];
    for k in 0..R {
        out[k] = hsum(acc[k]);
        for j in i..n {
            let b = u16::from_le_bytes([rows[k][2 * j], rows[k][2 * j + 1]]);
            out[k] += half::f16::from_bits(b).to_f32() * x[j];
        }
    }
    out
}

/// bf16 bytes → f32 (`out.len()` values).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn bf16_decode(bytes: &[u8], out: &mut [f32]) {
    let n = out.len().min(bytes.len() / 2);
    let mut i = 0;
    while i + 8 <= n {
        _mm256_storeu_ps(
            out.as_mut_ptr().add(i),
            load_bf16(bytes.as_ptr().add(2 * i)),
        );
        i += 8;
    }
    for j in i..n {
        out[j] =
            f32::from_bits(u32::from(u16::from_le_bytes([bytes[2 * j], bytes[2 * j + 1]])) << 16);
    }
}

/// fp16 bytes → f32.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f16_decode(bytes: &[u8], out: &mut [f32]) {
    let n = out.len().min(bytes.len() / 2);
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm_loadu_si128(bytes.as_ptr().add(2 * i) as *const __m128i);
        _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        i += 8;
    }
    for j in i..n {
        out[j] =
            half::f16::from_bits(u16::from_le_bytes([bytes[2 * j], bytes[2 * j + 1]])).to_f32();
    }
}

/// `2 · e2m1(code)` as int8, indexed by code.
#[inline(always)]
unsafe fn e2m1_x2_table() -> __m128i {
    _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
}

/// Sixteen int8 values → two 8-lane f32 vectors.
#[inline(always)]
unsafe fn widen16(v: __m128i) -> (__m256, __m256) {
    (
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)),
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))),
    )
}

/// Where element `i` of a 16-element NVFP4 block lands in the AVX2 kernel's lane order (see
/// [`nvfp4_row_dot_tokens`]): lanes 0..8 of the first vector, then 8..16 of the second.
pub(crate) const NVFP4_LANE_ORDER: [usize; 16] =
    [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];

/// Where element `i` of 16 bf16 values lands in [`bf16_rows_dot`]'s lane order: even elements,
/// then odd ones.
pub(crate) const BF16_LANE_ORDER: [usize; 16] =
    [0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15];

/// The high (`hi`) and low (`lo`) bytes of `bf16(e2m1(code))` by code, in both 128-bit lanes.
#[inline(always)]
unsafe fn e2m1_bf16_tables() -> (__m256i, __m256i) {
    let hi = _mm_setr_epi8(
        0x00, 0x3F, 0x3F, 0x3F, 0x40, 0x40, 0x40, 0x40, //
        -128, -65, -65, -65, -64, -64, -64, -64, // 0x80, 0xBF, 0xC0 as i8
    );
    let lo = _mm_setr_epi8(
        0x00, 0x00, -128, -64, 0x00, 0x40, -128, -64, //
        0x00, 0x00, -128, -64, 0x00, 0x40, -128, -64, // 0x80, 0xC0 as i8
    );
    (
        _mm256_broadcastsi128_si256(hi),
        _mm256_broadcastsi128_si256(lo),
    )
}

/// Codes of `bytes` (in both 128-bit lanes): low nibbles in lane 0, high nibbles in lane 1.
#[inline(always)]
unsafe fn split_nibbles(bytes: __m256i) -> __m256i {
    let shifts = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    _mm256_and_si256(_mm256_srlv_epi32(bytes, shifts), _mm256_set1_epi8(0x0F))
}

/// bf16 values (16-bit lanes) → f32 of the even and of the odd 16-bit lanes.
#[inline(always)]
unsafe fn bf16_halves(v: __m256i) -> (__m256, __m256) {
    (
        _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)),
        _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(-65536))),
    )
}

/// Dot products of one NVFP4 row with `T` vectors. The row: `packed` (`n/2` bytes), `scales`
/// (`n/16` fp8 codes); `lut[code] = fp8(code) / g`. Each vector (`n` values, a multiple of 16) is
/// in [`NVFP4_LANE_ORDER`] within each block. The row's codes are decoded once for all vectors,
/// and each vector's products are formed and summed in the same order whatever `T` is, so every
/// result is bit for bit the one it gets with `T = 1`.
#[target_feature(enable = "avx2,fma")]
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
    let (hi_t, lo_t) = e2m1_bf16_tables();
    let px = xs.map(|x| x.as_ptr());
    let (pp, ps) = (packed.as_ptr(), scales.as_ptr());
    let mut acc = [_mm256_setzero_ps(); T];
    let mut acc_odd = [_mm256_setzero_ps(); T];
    let mut b = 0;
    while b + 2 <= blocks {
        _mm_prefetch::<_MM_HINT_T0>(pp.wrapping_add(8 * b + NVFP4_PREFETCH_BYTES) as *const i8);
        let bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128(pp.add(8 * b) as *const __m128i));
        let codes = split_nibbles(bytes);
        let hi = _mm256_shuffle_epi8(hi_t, codes);
        let lo = _mm256_shuffle_epi8(lo_t, codes);
        let (w0, w1) = bf16_halves(_mm256_unpacklo_epi8(lo, hi)); // block b
        let (w2, w3) = bf16_halves(_mm256_unpackhi_epi8(lo, hi)); // block b + 1
        let s0 = _mm256_set1_ps(lut[*ps.add(b) as usize]);
        let s1 = _mm256_set1_ps(lut[*ps.add(b + 1) as usize]);
        for k in 0..T {
            let x0 = _mm256_loadu_ps(px[k].add(16 * b));
            let x1 = _mm256_loadu_ps(px[k].add(16 * b + 8));
            let x2 = _mm256_loadu_ps(px[k].add(16 * b + 16));
            let x3 = _mm256_loadu_ps(px[k].add(16 * b + 24));
            let p0 = _mm256_fmadd_ps(w1, x1, _mm256_mul_ps(w0, x0));
            let p1 = _mm256_fmadd_ps(w3, x3, _mm256_mul_ps(w2, x2));
            acc[k] = _mm256_fmadd_ps(p0, s0, acc[k]);
            acc_odd[k] = _mm256_fmadd_ps(p1, s1, acc_odd[k]);
        }
        b += 2;
    }
    if b < blocks {
        let bytes = _mm256_broadcastsi128_si256(_mm_loadl_epi64(pp.add(8 * b) as *const __m128i));
        let codes = split_nibbles(bytes);
        let hi = _mm256_shuffle_epi8(hi_t, codes);
        let lo = _mm256_shuffle_epi8(lo_t, codes);
        let (w0, w1) = bf16_halves(_mm256_unpacklo_epi8(lo, hi));
        let s = _mm256_set1_ps(lut[*ps.add(b) as usize]);
        for k in 0..T {
            let x0 = _mm256_loadu_ps(px[k].add(16 * b));
            let x1 = _mm256_loadu_ps(px[k].add(16 * b + 8));
            let p = _mm256_fmadd_ps(w1, x1, _mm256_mul_ps(w0, x0));
            acc[k] = _mm256_fmadd_ps(p, s, acc[k]);
        }
    }
    let mut out = [0f32; T];
    for k in 0..T {
        out[k] = hsum(_mm256_add_ps(acc[k], acc_odd[k]));
    }
    out
}

/// One NVFP4 row decoded to f32: `out[16b + i] = e2m1(code) · (fp8(scale_b) / g)` exactly.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn nvfp4_decode(
    packed: &[u8],
    scales: &[u8],
    half_lut: &[f32; 256],
    out: &mut [f32],
) {
    let blocks = (packed.len() / 8).min(scales.len()).min(out.len() / 16);
    let table = e2m1_x2_table();
    let mask = _mm_set1_epi8(0x0F);
    let po = out.as_mut_ptr();
    for b in 0..blocks {
        let bytes = _mm_loadl_epi64(packed.as_ptr().add(8 * b) as *const __m128i);
        let lo = _mm_and_si128(bytes, mask);
        let hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
        let c = _mm_shuffle_epi8(table, _mm_unpacklo_epi8(lo, hi));
        let (w0, w1) = widen16(c);
        let s = _mm256_set1_ps(half_lut[scales[b] as usize]);
        _mm256_storeu_ps(po.add(16 * b), _mm256_mul_ps(w0, s));
        _mm256_storeu_ps(po.add(16 * b + 8), _mm256_mul_ps(w1, s));
    }
}

/// `e^x` of 8 lanes (Cephes' `expf`: `x = n ln 2 + r`, a degree-7 polynomial of `r`, times
/// `2^n`); within 2 ulp of a correctly rounded `exp` over `[-87.3, 88.3]`, clamped outside it (so
/// 0 and ∞ come out as the smallest normal and ~2.4e38, and NaN as a finite value: callers that
/// need NaN carried have it in another operand).
#[inline(always)]
unsafe fn exp8(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.336_55)),
        _mm256_set1_ps(88.376_26),
    );
    // n = round(x / ln 2)
    let n = _mm256_round_ps(
        _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
    );
    // r = x - n ln 2, ln 2 in two parts (the first exact in few bits)
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut y = _mm256_set1_ps(1.987_569_1e-4);
    for c in [1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
    }
    let y = _mm256_fmadd_ps(
        y,
        _mm256_mul_ps(r, r),
        _mm256_add_ps(r, _mm256_set1_ps(1.0)),
    );
    // times 2^n (n in [-126, 128] after the clamp: 2^128 as 2^127 · 2)
    let ni = _mm256_cvtps_epi32(n);
    let half = _mm256_srai_epi32(ni, 1);
    let p1 = _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_add_epi32(half, _mm256_set1_epi32(127)),
        23,
    ));
    let p2 = _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)),
        23,
    ));
    _mm256_mul_ps(_mm256_mul_ps(y, p1), p2)
}

/// `out[i] = g[i] / (1 + e^-g[i]) · u[i]` (SiLU of the gate times up), `e^x` by [`exp8`].
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn silu_mul(g: &[f32], u: &[f32], out: &mut [f32]) {
    let n = out.len().min(g.len()).min(u.len());
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i + 8 <= n {
        let a = _mm256_loadu_ps(g.as_ptr().add(i));
        let b = _mm256_loadu_ps(u.as_ptr().add(i));
        let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), a));
        let s = _mm256_div_ps(a, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_mul_ps(s, b));
        i += 8;
    }
    for j in i..n {
        out[j] = g[j] / (1.0 + (-g[j]).exp()) * u[j];
    }
}

/// `y[i] = x[i] · alpha + y[i]`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    let n = y.len().min(x.len());
    let a = _mm256_set1_ps(alpha);
    let mut i = 0;
    while i + 8 <= n {
        let yv = _mm256_loadu_ps(y.as_ptr().add(i));
        let xv = _mm256_loadu_ps(x.as_ptr().add(i));
        _mm256_storeu_ps(y.as_mut_ptr().add(i), _mm256_fmadd_ps(xv, a, yv));
        i += 8;
    }
    for j in i..n {
        y[j] += x[j] * alpha;
    }
}

/// `out[c] += Σ_j p[j] · rows[j·stride + c]` for `c < out.len()` (`rows` holds `p.len()` rows
/// of at least `out.len()` values, `stride` apart): 64 columns at a time stay in registers while
/// every row streams past.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn weighted_sum(out: &mut [f32], p: &[f32], rows: &[f32], stride: usize) {
    let d = out.len();
    let n = p.len();
    assert!(
        n == 0 || (n - 1) * stride + d <= rows.len(),
        "weighted_sum rows"
    );
    let pr = rows.as_ptr();
    let po = out.as_mut_ptr();
    let mut c = 0;
    while c + 64 <= d {
        let mut acc = [_mm256_setzero_ps(); 8];
        for (j, &pj) in p.iter().enumerate() {
            let w = _mm256_set1_ps(pj);
            let r = pr.add(j * stride + c);
            for (u, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(w, _mm256_loadu_ps(r.add(8 * u)), *a);
            }
        }
        for (u, a) in acc.iter().enumerate() {
            let o = po.add(c + 8 * u);
            _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), *a));
        }
        c += 64;
    }
    while c + 8 <= d {
        let mut acc = _mm256_setzero_ps();
        for (j, &pj) in p.iter().enumerate() {
            acc = _mm256_fmadd_ps(
                _mm256_set1_ps(pj),
                _mm256_loadu_ps(pr.add(j * stride + c)),
                acc,
            );
        }
        let o = po.add(c);
        _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), acc));
        c += 8;
    }
    for c in c..d {
        let mut acc = 0f32;
        for (j, &pj) in p.iter().enumerate() {
            acc += pj * rows[j * stride + c];
        }
        out[c] += acc;
    }
}

/// Rows ahead of the one being read that the attention kernels prefetch (their rows are a KV
/// head's slice of each position: a strided stream).
const ROW_PREFETCH: usize = 6;

/// Prefetches the `bytes` bytes at `p` into the cache, one request per 64-byte line.
#[inline(always)]
unsafe fn prefetch_row(p: *const u8, bytes: usize) {
    let mut off = 0;
    while off < bytes {
        _mm_prefetch::<_MM_HINT_T0>(p.add(off) as *const i8);
        off += 64;
    }
}

/// `scores[g · n + j] = rows[j] · q[g]` for the `n` bf16 rows (as bits, `d` values each, `d` a
/// multiple of 8) and the `G` queries (`d` values each, in order): each row is loaded and widened
/// once for all `G` queries (a decode step's query heads of one KV head).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn bf16_rows_scores<const G: usize>(
    rows: &[&[u16]],
    q: [&[f32]; G],
    scores: &mut [f32],
) {
    let n = rows.len();
    let d = q.iter().map(|x| x.len()).min().unwrap_or(0);
    assert!(
        d % 8 == 0 && scores.len() >= G * n,
        "bf16_rows_scores shapes"
    );
    assert!(rows.iter().all(|r| r.len() >= d), "bf16_rows_scores rows");
    let pq = q.map(|x| x.as_ptr());
    for (j, row) in rows.iter().enumerate() {
        if let Some(ahead) = rows.get(j + ROW_PREFETCH) {
            prefetch_row(ahead.as_ptr() as *const u8, 2 * d);
        }
        let pr = row.as_ptr() as *const u8;
        // two accumulators per query: two independent FMA chains
        let mut acc = [[_mm256_setzero_ps(); 2]; G];
        let mut i = 0;
        while i + 16 <= d {
            let k0 = load_bf16(pr.add(2 * i));
            let k1 = load_bf16(pr.add(2 * i + 16));
            for g in 0..G {
                acc[g][0] = _mm256_fmadd_ps(k0, _mm256_loadu_ps(pq[g].add(i)), acc[g][0]);
                acc[g][1] = _mm256_fmadd_ps(k1, _mm256_loadu_ps(pq[g].add(i + 8)), acc[g][1]);
            }
            i += 16;
        }
        if i < d {
            let k0 = load_bf16(pr.add(2 * i));
            for g in 0..G {
                acc[g][0] = _mm256_fmadd_ps(k0, _mm256_loadu_ps(pq[g].add(i)), acc[g][0]);
            }
        }
        for g in 0..G {
            scores[g * n + j] = hsum(_mm256_add_ps(acc[g][0], acc[g][1]));
        }
    }
}

/// `out[g][c] += Σ_j p[g][j] · rows[j][c]` for `G` weight vectors over the same bf16 rows (as
/// bits, at least `d = out[g].len()` values each; `d` a multiple of 8): `8 U` columns of every
/// output at a time stay in registers while the rows stream past, each row widened once for all
/// `G` (a decode step's query heads of one KV head over its values). `G · U + G + 1` must fit the
/// 16 vector registers.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn bf16_rows_weighted_sums<const G: usize, const U: usize>(
    out: [&mut [f32]; G],
    p: [&[f32]; G],
    rows: &[&[u16]],
) {
    let d = out.iter().map(|o| o.len()).min().unwrap_or(0);
    assert!(
        d.is_multiple_of(8) && p.iter().all(|x| x.len() == rows.len()),
        "bf16_rows_weighted_sums shapes"
    );
    assert!(
        rows.iter().all(|r| r.len() >= d),
        "bf16_rows_weighted_sums rows"
    );
    let po = out.map(|o| o.as_mut_ptr());
    let mut c = 0;
    while c < d {
        let width = (d - c).min(8 * U) / 8;
        let mut acc = [[_mm256_setzero_ps(); U]; G];
        for (j, row) in rows.iter().enumerate() {
            if let Some(ahead) = rows.get(j + ROW_PREFETCH) {
                prefetch_row(ahead.as_ptr().add(c) as *const u8, 16 * width);
            }
            let w: [__m256; G] = std::array::from_fn(|g| _mm256_set1_ps(*p[g].get_unchecked(j)));
            let r = row.as_ptr().add(c) as *const u8;
            #[allow(clippy::needless_range_loop)] // u indexes every query's accumulators
            for u in 0..width {
                let v = load_bf16(r.add(16 * u));
                for g in 0..G {
                    acc[g][u] = _mm256_fmadd_ps(w[g], v, acc[g][u]);
                }
            }
        }
        for g in 0..G {
            for (u, a) in acc[g].iter().enumerate().take(width) {
                let o = po[g].add(c + 8 * u);
                _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), *a));
            }
        }
        c += 8 * width;
    }
}

/// `s[j] = e^(scale·s[j] − m)` with `m = max_i scale·s[i]`; returns `(m, Σ_j s[j])` (the
/// unnormalized softmax of attention scores), `e^x` by [`exp8`] (lanes past the end take no part
/// in the sum).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp_scaled(s: &mut [f32], scale: f32) -> (f32, f32) {
    let n = s.len();
    let ps = s.as_mut_ptr();
    let sc = _mm256_set1_ps(scale);
    let mut mv = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_mul_ps(_mm256_loadu_ps(ps.add(i)), sc);
        _mm256_storeu_ps(ps.add(i), v);
        mv = _mm256_max_ps(mv, v);
        i += 8;
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), mv);
    let mut max = lanes.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    for v in &mut s[i..] {
        *v *= scale;
        max = max.max(*v);
    }
    let m = _mm256_set1_ps(max);
    let mut sum = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(ps.add(i)), m));
        _mm256_storeu_ps(ps.add(i), e);
        sum = _mm256_add_ps(sum, e);
        i += 8;
    }
    let mut total = hsum(sum);
    if i < n {
        let mut tail = [0f32; 8];
        tail[..n - i].copy_from_slice(&s[i..]);
        let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(tail.as_ptr()), m));
        _mm256_storeu_ps(tail.as_mut_ptr(), e);
        for (v, &t) in s[i..].iter_mut().zip(&tail) {
            *v = t;
            total += t;
        }
    }
    (max, total)
}

/// `s[j] = e^(scale·s[j] − m) / Σ_i e^(scale·s[i] − m)` with `m = max_i scale·s[i]` (the softmax
/// of attention scores): [`exp_scaled`], then one multiply by the sum's inverse.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn softmax_scaled(s: &mut [f32], scale: f32) {
    let n = s.len();
    let ps = s.as_mut_ptr();
    let (_, total) = exp_scaled(s, scale);
    let inv = _mm256_set1_ps(1.0 / total);
    let mut i = 0;
    while i + 8 <= n {
        _mm256_storeu_ps(ps.add(i), _mm256_mul_ps(_mm256_loadu_ps(ps.add(i)), inv));
        i += 8;
    }
    let inv = 1.0 / total;
    for v in &mut s[i..] {
        *v *= inv;
    }
}

/// `|2·e2m1(code)|` (as u8) and `2·e2m1(code)` (as i8) by code, in both 128-bit lanes.
#[inline(always)]
unsafe fn e2m1_x2_int_tables() -> (__m256i, __m256i) {
    let abs = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, 1, 2, 3, 4, 6, 8, 12);
    (
        _mm256_broadcastsi128_si256(abs),
        _mm256_broadcastsi128_si256(e2m1_x2_table()),
    )
}

/// `4 · HALVES` blocks (64 or 128 weights) of one NVFP4 row against `T` int8 vectors: `pp` the
/// `32 · HALVES` packed bytes, `sw` the blocks' scales (`fp8 / g`, halved: the codes decode to
/// `2·e2m1`; lanes past the blocks are ignored), `xq[k]` the int8 values of vector `k` (per 64:
/// the even elements, then the odd ones) and `xd[k]` its block scales; adds into `acc[k]`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `h` and `k` index pointers and accumulators alike
unsafe fn nvfp4_q8_group<const T: usize, const HALVES: usize>(
    pp: *const u8,
    sw: __m256,
    xq: &[*const i8; T],
    xd: &[*const f32; T],
    acc: &mut [[__m256; 2]; T],
) {
    let (abs_t, sgn_t) = e2m1_x2_int_tables();
    let mask = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let sd: [__m256; T] = std::array::from_fn(|k| {
        let d = if HALVES == 2 {
            _mm256_loadu_ps(xd[k])
        } else {
            _mm256_insertf128_ps::<0>(_mm256_setzero_ps(), _mm_loadu_ps(xd[k]))
        };
        _mm256_mul_ps(sw, d)
    });
    for h in 0..HALVES {
        // 32 bytes = 4 blocks: the low nibbles are the even elements, the high ones the odd.
        let bytes = _mm256_loadu_si256(pp.add(32 * h) as *const __m256i);
        let even = _mm256_and_si256(bytes, mask);
        let odd = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask);
        let (ae, se) = (
            _mm256_shuffle_epi8(abs_t, even),
            _mm256_shuffle_epi8(sgn_t, even),
        );
        let (ao, so) = (
            _mm256_shuffle_epi8(abs_t, odd),
            _mm256_shuffle_epi8(sgn_t, odd),
        );
        // Block `i` of the four: i32 lanes 2i and 2i + 1.
        let a = 4 * h as i32;
        let idx = _mm256_setr_epi32(a, a, a + 1, a + 1, a + 2, a + 2, a + 3, a + 3);
        for k in 0..T {
            let xe = _mm256_loadu_si256(xq[k].add(64 * h) as *const __m256i);
            let xo = _mm256_loadu_si256(xq[k].add(64 * h + 32) as *const __m256i);
            // |w| · (x with w's sign), in i16 pairs (|·| ≤ 2·12·127), even + odd (≤ 6096),
            // then i32 per 8 elements: all exact.
            let pe = _mm256_maddubs_epi16(ae, _mm256_sign_epi8(xe, se));
            let po = _mm256_maddubs_epi16(ao, _mm256_sign_epi8(xo, so));
            let p = _mm256_madd_epi16(_mm256_add_epi16(pe, po), ones);
            let s = _mm256_permutevar8x32_ps(sd[k], idx);
            acc[k][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[k][h]);
        }
    }
}

/// How far ahead of the packed bytes in use the NVFP4 decode kernels ([`nvfp4_rows_dot_q8`],
/// [`nvfp4_row_dot_tokens`], the AVX-512 one) prefetch (into the next row at a row's end): on a
/// 2-vCPU Xeon VM (260 MiB L3), the int8 kernel's decode step (op profile) went from 11.9–20.4
/// to 8.8–16.8 ms in alternating runs (512 and 2048 bytes measured alike).
pub(crate) const NVFP4_PREFETCH_BYTES: usize = 1024;

/// Dot products of every NVFP4 row of a matrix slice (`packed` and `scales` hold whole rows of
/// `cols` columns) with `T` vectors quantized to int8 per 16-element block (`x ≈ xq · xd`; each
/// vector padded with zeros to a multiple of 8 blocks, each 64 values stored as their even
/// elements, then their odd ones): `out[r · T + k]` = row `r` · vector `k`, `half_lut[code] =
/// fp8(code) / g / 2`. Each block's integer dot product is exact; the blocks' scaled sums are
/// added in the same order whatever `T` is, so every result is bit for bit the one its row and
/// vector get alone. One call for all of a task's rows (tables and masks kept in registers).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn nvfp4_rows_dot_q8<const T: usize>(
    packed: &[u8],
    scales: &[u8],
    cols: usize,
    half_lut: &[f32; 256],
    xq: [&[i8]; T],
    xd: [&[f32]; T],
    out: &mut [f32],
) {
    for ((o, p), s) in out
        .chunks_exact_mut(T)
        .zip(packed.chunks_exact(cols / 2))
        .zip(scales.chunks_exact(cols / 16))
    {
        o.copy_from_slice(&row_dot_q8(p, s, half_lut, xq, xd));
    }
}

/// One row of [`nvfp4_rows_dot_q8`].
#[inline(always)]
unsafe fn row_dot_q8<const T: usize>(
    packed: &[u8],
    scales: &[u8],
    half_lut: &[f32; 256],
    xq: [&[i8]; T],
    xd: [&[f32]; T],
) -> [f32; T] {
    let blocks = (packed.len() / 8).min(scales.len());
    let padded = blocks.div_ceil(8) * 8;
    assert!(
        xq.iter().all(|q| q.len() >= 16 * padded) && xd.iter().all(|d| d.len() >= padded),
        "nvfp4_rows_dot_q8: vectors shorter than the row's padded blocks"
    );
    let mut acc = [[_mm256_setzero_ps(); 2]; T];
    let lut = half_lut.as_ptr();
    let mut b = 0;
    while b + 8 <= blocks {
        let codes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(scales.as_ptr().add(b) as *const __m128i));
        let sw = _mm256_i32gather_ps::<4>(lut, codes);
        let q = xq.map(|q| q.as_ptr().add(16 * b));
        let d = xd.map(|d| d.as_ptr().add(b));
        _mm_prefetch::<_MM_HINT_T0>(
            packed.as_ptr().wrapping_add(8 * b + NVFP4_PREFETCH_BYTES) as *const i8
        );
        nvfp4_q8_group::<T, 2>(packed.as_ptr().add(8 * b), sw, &q, &d, &mut acc);
        b += 8;
    }
    if b + 4 <= blocks {
        // Four blocks (rows of 64 · odd columns, e.g. 576): half a group, straight from the row.
        let four = std::ptr::read_unaligned(scales.as_ptr().add(b) as *const i32);
        let codes = _mm256_cvtepu8_epi32(_mm_cvtsi32_si128(four));
        let first4 = _mm256_castsi256_ps(_mm256_setr_epi32(-1, -1, -1, -1, 0, 0, 0, 0));
        let sw = _mm256_mask_i32gather_ps::<4>(_mm256_setzero_ps(), lut, codes, first4);
        let q = xq.map(|q| q.as_ptr().add(16 * b));
        let d = xd.map(|d| d.as_ptr().add(b));
        nvfp4_q8_group::<T, 1>(packed.as_ptr().add(8 * b), sw, &q, &d, &mut acc);
        b += 4;
    }
    if b < blocks {
        // The last 1–3 blocks, padded with zero codes (weight 0, scale 0).
        let rest = blocks - b;
        let mut pad = [0u8; 32];
        pad[..8 * rest].copy_from_slice(&packed[8 * b..8 * blocks]);
        let mut sw = [0f32; 8];
        for (s, &c) in sw.iter_mut().zip(&scales[b..blocks]) {
            *s = half_lut[c as usize];
        }
        let q = xq.map(|q| q.as_ptr().add(16 * b));
        let d = xd.map(|d| d.as_ptr().add(b));
        nvfp4_q8_group::<T, 1>(pad.as_ptr(), _mm256_loadu_ps(sw.as_ptr()), &q, &d, &mut acc);
    }
    let mut out = [0f32; T];
    for k in 0..T {
        out[k] = hsum(_mm256_add_ps(acc[k][0], acc[k][1]));
    }
    out
}

/// Each 16-value block `b` of `x` quantized to int8: `d[b] = amax / 127`, `q = round(x · 127 /
/// amax)` (round half to even; the scalar version's values exactly), written straight into the
/// kernel's layout (per 64 values the even elements, then the odd ones; `q.len()` a multiple of
/// 64). A block with a NaN or an infinity gets `d = NaN` (and zeros); an all-zero block `d = 0`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn q8_quantize(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    assert!(
        q.len().is_multiple_of(64),
        "q8_quantize: q not whole 64-value groups"
    );
    let blocks = (x.len() / 16).min(q.len() / 16).min(d.len());
    // A block's 16 values → its 8 even ones, then its 8 odd ones.
    let split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    let sign = _mm256_set1_ps(-0.0);
    let inf = _mm256_set1_ps(f32::INFINITY);
    for (b, db) in d.iter_mut().enumerate().take(blocks) {
        let v0 = _mm256_loadu_ps(x.as_ptr().add(16 * b));
        let v1 = _mm256_loadu_ps(x.as_ptr().add(16 * b + 8));
        let a0 = _mm256_andnot_ps(sign, v0);
        let a1 = _mm256_andnot_ps(sign, v1);
        let bad = _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_NLT_UQ>(a0, inf),
            _mm256_cmp_ps::<_CMP_NLT_UQ>(a1, inf),
        );
        // Block `b` is the `b % 4`-th of its 64-value group: 8 evens and 8 odds there.
        let group = q.as_mut_ptr().add(64 * (b / 4) + 8 * (b % 4));
        let (evens, odds) = (group as *mut __m128i, group.add(32) as *mut __m128i);
        if _mm256_movemask_ps(bad) != 0 {
            *db = f32::NAN;
            _mm_storel_epi64(evens, _mm_setzero_si128());
            _mm_storel_epi64(odds, _mm_setzero_si128());
            continue;
        }
        let m = _mm256_max_ps(a0, a1);
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 0x55)));
        if amax == 0.0 {
            *db = 0.0;
            _mm_storel_epi64(evens, _mm_setzero_si128());
            _mm_storel_epi64(odds, _mm_setzero_si128());
            continue;
        }
        *db = amax / 127.0;
        let inv = _mm256_set1_ps(127.0 / amax);
        let i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, inv));
        let i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, inv));
        // packs works per 128-bit lane: [i0 0..4, i1 0..4 | i0 4..8, i1 4..8] → element order.
        let p16 = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(i0, i1));
        let p8 = _mm_packs_epi16(
            _mm256_castsi256_si128(p16),
            _mm256_extracti128_si256::<1>(p16),
        );
        let p8 = _mm_shuffle_epi8(p8, split);
        _mm_storel_epi64(evens, p8);
        _mm_storel_epi64(odds, _mm_srli_si128::<8>(p8));
    }
}
