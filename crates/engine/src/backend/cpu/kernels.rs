//! Safe entry points of the CPU kernels: runtime ISA dispatch between the AVX2 versions
//! ([`super::simd`]) and portable scalar ones, which are also the reference the SIMD versions are
//! tested against.

use std::borrow::Cow;

use fp4forge_format::fp4::E2M1_TO_F32;

/// The instruction set the kernels use, chosen once at backend construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    /// Portable Rust (auto-vectorised by the compiler for the build's baseline target).
    Scalar,
    /// AVX2 + FMA (+ F16C), detected at run time.
    Avx2,
    /// AVX-512F on top of [`Isa::Avx2`] (NVFP4 kernels), detected at run time.
    Avx512,
}

impl Isa {
    /// The best instruction set this CPU supports.
    pub(crate) fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                if std::arch::is_x86_feature_detected!("avx512f") {
                    return Isa::Avx512;
                }
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// Whether the AVX2 kernels may run. Sound because `Isa` is crate-private and `Isa::Avx2` is
    /// only ever produced by [`Isa::detect`].
    #[inline(always)]
    fn avx2(self) -> bool {
        cfg!(target_arch = "x86_64") && matches!(self, Isa::Avx2 | Isa::Avx512)
    }

    /// Whether the AVX-512 kernels may run (same soundness argument as [`Isa::avx2`]).
    #[inline(always)]
    fn avx512(self) -> bool {
        cfg!(target_arch = "x86_64") && self == Isa::Avx512
    }

    /// At most AVX2 (drops AVX-512).
    pub(crate) fn without_avx512(self) -> Self {
        match self {
            Isa::Avx512 => Isa::Avx2,
            other => other,
        }
    }
}

/// An NVFP4 weight's block scales by fp8 code: `full[c] = fp8(c) / g` and `half[c] = full[c] / 2`
/// (the AVX2 kernels decode `2·e2m1` as integers). 2 KiB per weight, whatever its size.
#[derive(Debug, Clone)]
pub(crate) struct ScaleLuts {
    pub(crate) full: [f32; 256],
    pub(crate) half: [f32; 256],
}

impl ScaleLuts {
    /// The tables of global scale `g`: `fp8 / g` as compressed-tensors computes it (one f32
    /// division), halved exactly.
    pub(crate) fn new(g: f32) -> Self {
        let full = fp4forge_format::fp8::E4M3_TO_F32.map(|v| v / g);
        Self {
            half: full.map(|v| v * 0.5),
            full,
        }
    }
}

/// `Σ a·b`.
#[inline]
pub(crate) fn dot(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: `Isa::Avx2` is only produced after runtime detection of AVX2/FMA/F16C.
        return unsafe { super::simd::dot(a, b) };
    }
    let _ = isa;
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Four dot products with a shared right-hand side.
#[inline]
pub(crate) fn dot4(isa: Isa, r: [&[f32]; 4], x: &[f32]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2/FMA detected (see `dot`).
        return unsafe { super::simd::dot4(r, x) };
    }
    r.map(|row| dot(Isa::Scalar, row, x))
}

/// The `4 × T` dot products of rows `w` with rows `x`: `out[t][k] = w[k] · x[t]`.
#[inline]
pub(crate) fn dot4xt<const T: usize>(isa: Isa, w: [&[f32]; 4], x: [&[f32]; T]) -> [[f32; 4]; T] {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2/FMA detected (see `dot`).
        return unsafe { super::simd::dot4xt(w, x) };
    }
    x.map(|xt| w.map(|wk| dot(Isa::Scalar, wk, xt)))
}

/// `silu(g) · u` elementwise (`g / (1 + e^-g) · u`); the AVX2 version's `e^x` is within 2 ulp
/// of the scalar one's.
pub(crate) fn silu_mul(isa: Isa, g: &[f32], u: &[f32]) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        let mut out = vec![0f32; g.len().min(u.len())];
        // SAFETY: AVX2/FMA detected (see `dot`).
        unsafe { super::simd::silu_mul(g, u, &mut out) };
        return out;
    }
    g.iter()
        .zip(u)
        .map(|(&a, &b)| a / (1.0 + (-a).exp()) * b)
        .collect()
}

/// `y = x · alpha + y`.
#[inline]
pub(crate) fn axpy(isa: Isa, y: &mut [f32], alpha: f32, x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2/FMA detected (see `dot`).
        return unsafe { super::simd::axpy(y, alpha, x) };
    }
    for (a, b) in y.iter_mut().zip(x) {
        *a += b * alpha;
    }
}

/// `out[c] += Σ_j p[j] · rows[j·stride + c]` for `c < out.len()`.
#[inline]
pub(crate) fn weighted_sum(isa: Isa, out: &mut [f32], p: &[f32], rows: &[f32], stride: usize) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2/FMA detected (see `dot`).
        return unsafe { super::simd::weighted_sum(out, p, rows, stride) };
    }
    for (j, &pj) in p.iter().enumerate() {
        axpy(
            Isa::Scalar,
            out,
            pj,
            &rows[j * stride..j * stride + out.len()],
        );
    }
}

/// `scores[g · n + j] = rows[j] · q[g]` for the `n` bf16 rows (as bits) and every query of `q`
/// (all of one length `d`, at most each row's): each row read once for all queries where the
/// kernel allows (AVX2, `d` a multiple of 8).
pub(crate) fn bf16_rows_scores(isa: Isa, rows: &[&[u16]], q: &[&[f32]], scores: &mut [f32]) {
    let n = rows.len();
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() && q.first().is_some_and(|x| x.len().is_multiple_of(8)) {
        // Queries four at a time (the kernel's registers: two accumulators per query).
        for (c, qs) in q.chunks(4).enumerate() {
            let out = &mut scores[4 * c * n..];
            // SAFETY: AVX2/FMA detected (see `dot`); shapes are asserted by the kernel.
            unsafe {
                match *qs {
                    [a] => super::simd::bf16_rows_scores::<1>(rows, [a], out),
                    [a, b] => super::simd::bf16_rows_scores::<2>(rows, [a, b], out),
                    [a, b, c] => super::simd::bf16_rows_scores::<3>(rows, [a, b, c], out),
                    [a, b, c, d] => super::simd::bf16_rows_scores::<4>(rows, [a, b, c, d], out),
                    _ => unreachable!("chunks of at most four"),
                }
            }
        }
        return;
    }
    let _ = isa;
    for (g, x) in q.iter().enumerate() {
        for (j, row) in rows.iter().enumerate() {
            scores[g * n + j] = row
                .iter()
                .zip(x.iter())
                .map(|(&b, &v)| f32::from_bits(u32::from(b) << 16) * v)
                .sum();
        }
    }
}

/// `out[g·d + c] += Σ_j p[g·n + j] · rows[j][c]` for the `n` bf16 rows (as bits, at least `d`
/// values each) and every weight vector of `p` (`out.len() / d` of them): each row widened once
/// for up to four vectors where the kernel allows (AVX2, `d` a multiple of 8).
pub(crate) fn bf16_rows_weighted_sum(
    isa: Isa,
    out: &mut [f32],
    d: usize,
    p: &[f32],
    rows: &[&[u16]],
) {
    let n = rows.len();
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() && d.is_multiple_of(8) && d > 0 {
        // Vectors four at a time, as many columns as the registers hold beside them.
        for (os, ps) in out.chunks_mut(4 * d).zip(p.chunks(4 * n.max(1))) {
            let count = os.len() / d;
            let mut o = os.chunks_mut(d);
            let mut w = ps.chunks(n.max(1));
            let mut next = || (o.next().unwrap_or_default(), w.next().unwrap_or_default());
            // SAFETY: AVX2/FMA detected (see `dot`); shapes are asserted by the kernel.
            unsafe {
                match count {
                    1 => {
                        let a = next();
                        super::simd::bf16_rows_weighted_sums::<1, 8>([a.0], [a.1], rows)
                    }
                    2 => {
                        let (a, b) = (next(), next());
                        super::simd::bf16_rows_weighted_sums::<2, 6>([a.0, b.0], [a.1, b.1], rows)
                    }
                    3 => {
                        let (a, b, c) = (next(), next(), next());
                        super::simd::bf16_rows_weighted_sums::<3, 4>(
                            [a.0, b.0, c.0],
                            [a.1, b.1, c.1],
                            rows,
                        )
                    }
                    _ => {
                        let (a, b, c, e) = (next(), next(), next(), next());
                        super::simd::bf16_rows_weighted_sums::<4, 2>(
                            [a.0, b.0, c.0, e.0],
                            [a.1, b.1, c.1, e.1],
                            rows,
                        )
                    }
                }
            }
        }
        return;
    }
    let _ = isa;
    for (o, w) in out.chunks_mut(d.max(1)).zip(p.chunks(n.max(1))) {
        for (&pj, row) in w.iter().zip(rows) {
            for (x, &b) in o.iter_mut().zip(row.iter()) {
                *x += pj * f32::from_bits(u32::from(b) << 16);
            }
        }
    }
}

/// `s[j] = e^(scale·s[j] − m)` in place with `m = max_j scale·s[j]`; returns `(m, Σ_j s[j])`:
/// the softmax of `scale · s` before its division by the sum (a part of a row's softmax, merged
/// with the other parts by their maxima), `e^x` vectorized where the ISA allows (within 2 ulp of
/// the scalar `exp`).
pub(crate) fn exp_scaled(isa: Isa, s: &mut [f32], scale: f32) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2/FMA detected (see `dot`).
        return unsafe { super::simd::exp_scaled(s, scale) };
    }
    let mut max = f32::NEG_INFINITY;
    for v in s.iter_mut() {
        *v *= scale;
        max = max.max(*v);
    }
    let mut sum = 0f32;
    for v in s.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    (max, sum)
}

/// The softmax of `scale · s` in place (the max subtracted first), `e^x` vectorized where the
/// ISA allows (within 2 ulp of the scalar `exp`).
pub(crate) fn softmax_scaled(isa: Isa, s: &mut [f32], scale: f32) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2/FMA detected (see `dot`).
        return unsafe { super::simd::softmax_scaled(s, scale) };
    }
    let (_, sum) = exp_scaled(isa, s, scale);
    let inv = 1.0 / sum;
    for v in s.iter_mut() {
        *v *= inv;
    }
}

#[inline(always)]
fn bf16_at(bytes: &[u8], i: usize) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])) << 16)
}

#[inline(always)]
fn f16_at(bytes: &[u8], i: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f32()
}

/// An activation row in the element order the bf16 kernel of `isa` reads (made once per matmul,
/// shared by every row of the weight): see [`bf16_input`].
pub(crate) struct Bf16Input<'a>(Cow<'a, [f32]>);

/// An activation row in the element order the NVFP4 kernel of `isa` reads: see
/// [`nvfp4_input`].
pub(crate) struct Nvfp4Input<'a>(Cow<'a, [f32]>);

/// `x` with each full group of 16 reordered by `order` (`out[16g + i] = x[16g + order[i]]`),
/// the tail as is.
#[cfg(target_arch = "x86_64")]
fn permuted(x: &[f32], order: &[usize; 16]) -> Vec<f32> {
    let mut out = x.to_vec();
    for (o, g) in out.chunks_exact_mut(16).zip(x.chunks_exact(16)) {
        for (oi, &src) in o.iter_mut().zip(order) {
            *oi = g[src];
        }
    }
    out
}

/// `x` prepared for [`bf16_rows_dot`] with `isa`.
pub(crate) fn bf16_input(isa: Isa, x: &[f32]) -> Bf16Input<'_> {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        return Bf16Input(Cow::Owned(permuted(x, &super::simd::BF16_LANE_ORDER)));
    }
    let _ = isa;
    Bf16Input(Cow::Borrowed(x))
}

/// `x` (a multiple of 16 values) prepared for [`nvfp4_row_dot_tokens`] with `isa`.
pub(crate) fn nvfp4_input(isa: Isa, x: &[f32]) -> Nvfp4Input<'_> {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() && !isa.avx512() {
        return Nvfp4Input(Cow::Owned(permuted(x, &super::simd::NVFP4_LANE_ORDER)));
    }
    let _ = isa;
    Nvfp4Input(Cow::Borrowed(x))
}

/// Dot products of `R` bf16 rows with `x` (prepared by [`bf16_input`] with the same `isa`).
#[inline]
pub(crate) fn bf16_rows_dot<const R: usize>(
    isa: Isa,
    rows: [&[u8]; R],
    x: &Bf16Input<'_>,
) -> [f32; R] {
    let x = &x.0[..];
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2/FMA detected (see `dot`).
        return unsafe { super::simd::bf16_rows_dot(rows, x) };
    }
    rows.map(|r| (0..x.len()).map(|i| bf16_at(r, i) * x[i]).sum())
}

/// Dot products of `R` fp16 rows with `x`.
#[inline]
pub(crate) fn f16_rows_dot<const R: usize>(isa: Isa, rows: [&[u8]; R], x: &[f32]) -> [f32; R] {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2/FMA/F16C detected (see `dot`).
        return unsafe { super::simd::f16_rows_dot(rows, x) };
    }
    rows.map(|r| (0..x.len()).map(|i| f16_at(r, i) * x[i]).sum())
}

/// bf16 bytes → f32.
#[inline]
pub(crate) fn bf16_decode(isa: Isa, bytes: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2/FMA detected (see `dot`).
        return unsafe { super::simd::bf16_decode(bytes, out) };
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = bf16_at(bytes, i);
    }
}

/// fp16 bytes → f32.
#[inline]
pub(crate) fn f16_decode(isa: Isa, bytes: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2/FMA/F16C detected (see `dot`).
        return unsafe { super::simd::f16_decode(bytes, out) };
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = f16_at(bytes, i);
    }
}

/// f32 little-endian bytes → f32.
#[inline]
pub(crate) fn f32_decode(bytes: &[u8], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

/// Dot products of one NVFP4 row with `T` vectors (each prepared by [`nvfp4_input`] with the same
/// `isa`; a multiple of 16 values): the row decoded once for all `T`, each result bit for bit the
/// one its vector gets alone (`T = 1`).
#[inline]
pub(crate) fn nvfp4_row_dot_tokens<const T: usize>(
    isa: Isa,
    packed: &[u8],
    scales: &[u8],
    luts: &ScaleLuts,
    xs: [&Nvfp4Input<'_>; T],
) -> [f32; T] {
    let xs = xs.map(|x| &x.0[..]);
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() {
        // SAFETY: AVX-512F (and AVX2/FMA) detected at run time (`Isa::detect`).
        return unsafe { super::simd512::nvfp4_row_dot_tokens(packed, scales, &luts.full, xs) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2/FMA detected (see `dot`).
        return unsafe { super::simd::nvfp4_row_dot_tokens(packed, scales, &luts.full, xs) };
    }
    let _ = isa;
    xs.map(|x| {
        let mut total = 0f32;
        for ((pb, &sc), xb) in packed.chunks_exact(8).zip(scales).zip(x.chunks_exact(16)) {
            let mut block = 0f32;
            for (i, &byte) in pb.iter().enumerate() {
                block += E2M1_TO_F32[(byte & 0xF) as usize] * xb[2 * i];
                block += E2M1_TO_F32[(byte >> 4) as usize] * xb[2 * i + 1];
            }
            total += block * luts.full[sc as usize];
        }
        total
    })
}

/// An activation row quantized to int8 per 16-element block for [`nvfp4_rows_dot_q8`]:
/// `x[16b + i] ≈ q · d[b]` with `d[b] = amax_b / 127` (round half to even), zero-padded to a
/// multiple of 8 blocks; each 64 values' `q` stored as the even elements, then the odd ones
/// ([`q8_slot`]: the order in which the NVFP4 kernel splits packed bytes into nibbles). A block
/// holding a NaN or an infinity gets `d = NaN`, so every dot product that reads it is NaN, as in
/// f32.
pub(crate) struct Q8Input {
    q: Vec<i8>,
    d: Vec<f32>,
}

/// `x` (a multiple of 16 values) quantized for [`nvfp4_rows_dot_q8`] (the same values with
/// every `isa`).
pub(crate) fn q8_input(isa: Isa, x: &[f32]) -> Q8Input {
    let blocks = x.len() / 16;
    let padded = blocks.div_ceil(8) * 8;
    let mut q = vec![0i8; 16 * padded];
    let mut d = vec![0f32; padded];
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2/FMA detected (see `dot`).
        unsafe { super::simd::q8_quantize(x, &mut q, &mut d) };
        return Q8Input { q, d };
    }
    let _ = isa;
    for (b, (db, xb)) in d.iter_mut().zip(x.chunks_exact(16)).enumerate() {
        if xb.iter().any(|v| !v.is_finite()) {
            *db = f32::NAN;
            continue;
        }
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        if amax == 0.0 {
            continue;
        }
        *db = amax / 127.0;
        let inv = 127.0 / amax;
        for (i, &v) in xb.iter().enumerate() {
            q[q8_slot(16 * b + i)] = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
        }
    }
    Q8Input { q, d }
}

/// Where element `i` of a row lives in a [`Q8Input`]'s `q`.
#[inline(always)]
fn q8_slot(i: usize) -> usize {
    let (group, e) = (i / 64, i % 64);
    64 * group + if e % 2 == 0 { e / 2 } else { 32 + e / 2 }
}

/// Dot products of one NVFP4 row with `T` int8-quantized vectors ([`q8_input`]; W4A8), the
/// portable way: each block's product of codes and int8 values summed exactly in integers, scaled
/// by `fp8 / g · d`; each result bit for bit the one its vector gets alone (`T = 1`).
fn row_dot_q8_scalar<const T: usize>(
    packed: &[u8],
    scales: &[u8],
    luts: &ScaleLuts,
    xs: [&Q8Input; T],
) -> [f32; T] {
    xs.map(|x| {
        let mut total = 0f32;
        for (b, ((pb, &sc), &d)) in packed.chunks_exact(8).zip(scales).zip(&x.d).enumerate() {
            let mut block = 0i32;
            for (i, &byte) in pb.iter().enumerate() {
                let e = 16 * b + 2 * i;
                block += i32::from(E2M1_X2[(byte & 0xF) as usize]) * i32::from(x.q[q8_slot(e)]);
                block += i32::from(E2M1_X2[(byte >> 4) as usize]) * i32::from(x.q[q8_slot(e + 1)]);
            }
            total += block as f32 * (luts.half[sc as usize] * d);
        }
        total
    })
}

/// Dot products of every NVFP4 row of a matrix slice (`packed`, `scales`: whole rows of `cols`
/// columns) with `T` int8-quantized vectors ([`q8_input`]; W4A8) into `out[r · T + k]`: each
/// block's product of codes and int8 values summed exactly in integers, scaled by `fp8 / g · d`;
/// each result bit for bit the one its row and vector get alone (one row, `T = 1`).
#[inline]
pub(crate) fn nvfp4_rows_dot_q8<const T: usize>(
    isa: Isa,
    packed: &[u8],
    scales: &[u8],
    cols: usize,
    luts: &ScaleLuts,
    xs: [&Q8Input; T],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2/FMA detected (see `dot`).
        return unsafe {
            super::simd::nvfp4_rows_dot_q8(
                packed,
                scales,
                cols,
                &luts.half,
                xs.map(|x| &x.q[..]),
                xs.map(|x| &x.d[..]),
                out,
            )
        };
    }
    for ((o, p), s) in out
        .chunks_exact_mut(T)
        .zip(packed.chunks_exact(cols / 2))
        .zip(scales.chunks_exact(cols / 16))
    {
        o.copy_from_slice(&row_dot_q8_scalar(p, s, luts, xs));
    }
}

/// `2 · e2m1(code)` by code (every E2M1 value doubled is an integer).
const E2M1_X2: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// One NVFP4 row decoded to f32, exactly `e2m1(code) · (fp8 / g)`.
#[inline]
pub(crate) fn nvfp4_decode(
    isa: Isa,
    packed: &[u8],
    scales: &[u8],
    luts: &ScaleLuts,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() {
        // SAFETY: AVX-512F (and AVX2/FMA) detected at run time (`Isa::detect`).
        return unsafe { super::simd512::nvfp4_decode(packed, scales, &luts.full, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2/FMA detected (see `dot`).
        return unsafe { super::simd::nvfp4_decode(packed, scales, &luts.half, out) };
    }
    for ((ob, pb), &sc) in out
        .chunks_exact_mut(16)
        .zip(packed.chunks_exact(8))
        .zip(scales)
    {
        let s = luts.full[sc as usize];
        for (pair, &byte) in ob.chunks_exact_mut(2).zip(pb) {
            pair[0] = E2M1_TO_F32[(byte & 0xF) as usize] * s;
            pair[1] = E2M1_TO_F32[(byte >> 4) as usize] * s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    /// The AVX2 SiLU (a vector `e^x`) stays within a few f32 ulp of the scalar one over the
    /// range a gate takes and beyond it, including ±0, the clamp edges and NaN (carried).
    #[test]
    fn silu_mul_simd_matches_scalar() {
        let mut g: Vec<f32> = (0..4001).map(|i| (i as f32 - 2000.0) * 0.05).collect();
        g.extend([
            0.0, -0.0, 87.0, -87.0, 88.5, -88.5, 1e-30, -1e-30, 150.0, -150.0,
        ]);
        g.push(f32::NAN);
        let u: Vec<f32> = (0..g.len()).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let want = silu_mul(Isa::Scalar, &g, &u);
        let got = silu_mul(Isa::detect(), &g, &u);
        assert_eq!(got.len(), want.len());
        for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
            if b.is_nan() {
                assert!(a.is_nan(), "silu_mul({}) = {a}, want NaN", g[i]);
                continue;
            }
            assert!(
                (a - b).abs() <= 4.0 * f32::EPSILON * b.abs() + 1e-35,
                "silu_mul({}) = {a}, want {b}",
                g[i]
            );
        }
    }

    /// One NVFP4 row against 2–4 vectors gives each vector exactly what it gets alone (the same
    /// products summed in the same order), on every kernel set this CPU runs, over blocks that
    /// exercise the main loop and the tails.
    #[test]
    fn nvfp4_row_against_several_vectors_is_the_single_kernel_bit_for_bit() {
        for isa in [Isa::detect(), Isa::detect().without_avx512(), Isa::Scalar] {
            for blocks in [1usize, 2, 3, 5, 9] {
                let n = 16 * blocks;
                let packed: Vec<u8> = (0..n / 2).map(|i| (i * 53 % 251) as u8).collect();
                let scales: Vec<u8> = (0..blocks).map(|i| (0x28 + i * 5) as u8).collect();
                let lut = ScaleLuts::new(448.0);
                let xs: Vec<Vec<f32>> = (0..4).map(|k| data(n, 40 + k)).collect();
                let xin: Vec<Nvfp4Input<'_>> = xs.iter().map(|x| nvfp4_input(isa, x)).collect();
                let alone: Vec<f32> = xin
                    .iter()
                    .map(|x| nvfp4_row_dot_tokens::<1>(isa, &packed, &scales, &lut, [x])[0])
                    .collect();
                let got4 = nvfp4_row_dot_tokens::<4>(
                    isa,
                    &packed,
                    &scales,
                    &lut,
                    [&xin[0], &xin[1], &xin[2], &xin[3]],
                );
                let got3 = nvfp4_row_dot_tokens::<3>(
                    isa,
                    &packed,
                    &scales,
                    &lut,
                    [&xin[0], &xin[1], &xin[2]],
                );
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got4), bits(&alone), "{isa:?}, {blocks} blocks");
                assert_eq!(bits(&got3), bits(&alone[..3]), "{isa:?}, {blocks} blocks");
            }
        }
    }

    /// One row's [`nvfp4_rows_dot_q8`].
    fn nvfp4_row_dot_q8<const T: usize>(
        isa: Isa,
        packed: &[u8],
        scales: &[u8],
        luts: &ScaleLuts,
        xs: [&Q8Input; T],
    ) -> [f32; T] {
        let mut out = [0f32; T];
        nvfp4_rows_dot_q8(isa, packed, scales, 2 * packed.len(), luts, xs, &mut out);
        out
    }

    /// The int8-activation NVFP4 dot (W4A8): the SIMD kernel agrees with the scalar one, 2–4
    /// vectors give each exactly what it gets alone, the result is within the int8 rounding of
    /// the f32 one, and a non-finite input makes it NaN.
    #[test]
    fn nvfp4_q8_dot_matches_scalar_and_f32() {
        for isa in [Isa::detect(), Isa::Scalar] {
            for blocks in [1usize, 7, 8, 9, 36, 96] {
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                let n = 16 * blocks;
                let packed: Vec<u8> = (0..n / 2).map(|i| (i * 53 % 251) as u8).collect();
                let scales: Vec<u8> = (0..blocks).map(|i| (0x28 + i * 5 % 40) as u8).collect();
                let lut = ScaleLuts::new(448.0);
                let xs: Vec<Vec<f32>> = (0..4).map(|k| data(n, 60 + k)).collect();
                let q: Vec<Q8Input> = xs.iter().map(|x| q8_input(isa, x)).collect();
                for x in &xs {
                    let (a, b) = (q8_input(isa, x), q8_input(Isa::Scalar, x));
                    assert_eq!((a.q, bits(&a.d)), (b.q, bits(&b.d)), "{isa:?}: int8 copies");
                }
                let alone: Vec<f32> = q
                    .iter()
                    .map(|x| nvfp4_row_dot_q8::<1>(isa, &packed, &scales, &lut, [x])[0])
                    .collect();
                let got4 = nvfp4_row_dot_q8::<4>(
                    isa,
                    &packed,
                    &scales,
                    &lut,
                    [&q[0], &q[1], &q[2], &q[3]],
                );
                assert_eq!(bits(&got4), bits(&alone), "{isa:?}, {blocks} blocks");
                // Three rows in one call: each row's results are its single-row ones.
                let rows3: Vec<u8> = packed
                    .iter()
                    .chain(&packed)
                    .chain(&packed)
                    .copied()
                    .collect();
                let sc3: Vec<u8> = scales
                    .iter()
                    .chain(&scales)
                    .chain(&scales)
                    .copied()
                    .collect();
                let mut out = vec![0f32; 3 * 2];
                nvfp4_rows_dot_q8::<2>(isa, &rows3, &sc3, n, &lut, [&q[0], &q[1]], &mut out);
                assert_eq!(bits(&out), bits(&[alone[0], alone[1]].repeat(3)), "{isa:?}");
                for (k, x) in xs.iter().enumerate() {
                    let scalar =
                        nvfp4_row_dot_q8::<1>(Isa::Scalar, &packed, &scales, &lut, [&q[k]])[0];
                    let exact = nvfp4_row_dot_tokens::<1>(
                        Isa::Scalar,
                        &packed,
                        &scales,
                        &lut,
                        [&nvfp4_input(Isa::Scalar, x)],
                    )[0];
                    // Σ|w·x| bounds both errors: f32 summation (≪ 1e-5 of it) and int8 rounding
                    // (≤ 1/254 of each block's amax per element).
                    let mut decoded = vec![0f32; n];
                    nvfp4_decode(Isa::Scalar, &packed, &scales, &lut, &mut decoded);
                    let mag: f32 = decoded.iter().zip(x).map(|(w, v)| (w * v).abs()).sum();
                    assert!(
                        (alone[k] - scalar).abs() <= 1e-5 * mag,
                        "{isa:?} {blocks}: {} vs {scalar}",
                        alone[k]
                    );
                    assert!(
                        (alone[k] - exact).abs() <= 0.02 * mag,
                        "{blocks}: {} vs f32 {exact}",
                        alone[k]
                    );
                    assert!(
                        (alone[k] - exact).abs() > 0.0 || blocks == 1,
                        "int8 rounding changed nothing"
                    );
                }
                let mut bad = xs[0].clone();
                bad[n - 1] = f32::INFINITY;
                let nan =
                    nvfp4_row_dot_q8::<1>(isa, &packed, &scales, &lut, [&q8_input(isa, &bad)])[0];
                assert!(nan.is_nan(), "{isa:?}: {nan}");
            }
        }
    }

    /// The decode attention's kernels (scores of several queries against bf16 rows, the softmax
    /// with a vector `e^x`, the weighted sum of bf16 rows) agree with the scalar ones on every
    /// kernel set this CPU runs: head widths with and without a 16-column tail, 1 to 8 queries
    /// (more than one group of four), rows past the 64-column register block.
    #[test]
    fn attention_kernels_match_scalar() {
        let bits = |v: &[f32]| -> Vec<u16> {
            v.iter()
                .map(|x| half::bf16::from_f32(*x).to_bits())
                .collect()
        };
        for isa in [Isa::detect(), Isa::detect().without_avx512(), Isa::Scalar] {
            for d in [64usize, 72, 128, 136] {
                let n = 37;
                let rows: Vec<Vec<u16>> = (0..n).map(|j| bits(&data(d, 100 + j as u32))).collect();
                let refs: Vec<&[u16]> = rows.iter().map(|r| &r[..]).collect();
                for g in [1usize, 2, 3, 5, 6, 8] {
                    let qs: Vec<Vec<f32>> = (0..g).map(|i| data(d, 7 + i as u32)).collect();
                    let qr: Vec<&[f32]> = qs.iter().map(|q| &q[..]).collect();
                    let mut got = vec![0f32; g * n];
                    let mut want = vec![0f32; g * n];
                    bf16_rows_scores(isa, &refs, &qr, &mut got);
                    bf16_rows_scores(Isa::Scalar, &refs, &qr, &mut want);
                    for (a, b) in got.iter().zip(&want) {
                        assert!((a - b).abs() < 1e-4, "{isa:?} d {d} g {g}: {a} vs {b}");
                    }
                    let (mut p1, mut p2) = (want[..n].to_vec(), want[..n].to_vec());
                    softmax_scaled(isa, &mut p1, 0.125);
                    softmax_scaled(Isa::Scalar, &mut p2, 0.125);
                    for (a, b) in p1.iter().zip(&p2) {
                        assert!((a - b).abs() <= 8.0 * f32::EPSILON * b, "{a} vs {b}");
                    }
                    // every query's weights: its scores' softmax
                    let mut p = want.clone();
                    for s in p.chunks_mut(n) {
                        softmax_scaled(Isa::Scalar, s, 0.125);
                    }
                    let (mut o1, mut o2) = (vec![0.5f32; g * d], vec![0.5f32; g * d]);
                    bf16_rows_weighted_sum(isa, &mut o1, d, &p, &refs);
                    bf16_rows_weighted_sum(Isa::Scalar, &mut o2, d, &p, &refs);
                    for (a, b) in o1.iter().zip(&o2) {
                        assert!((a - b).abs() < 1e-5, "{isa:?} d {d} g {g}: {a} vs {b}");
                    }
                }
            }
        }
    }

    #[test]
    fn simd_and_scalar_agree() {
        for isa in [Isa::detect(), Isa::detect().without_avx512()] {
            check_isa(isa);
        }
    }

    fn check_isa(isa: Isa) {
        let n = 8 * 16 + 16; // 9 blocks: the 4-block loop and the tails
        let x = data(n, 1);
        let a = data(n, 2);
        assert!((dot(isa, &a, &x) - dot(Isa::Scalar, &a, &x)).abs() < 1e-4);
        let bf: Vec<u8> = a
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_bits().to_le_bytes())
            .collect();
        let s = bf16_rows_dot::<2>(Isa::Scalar, [&bf, &bf], &bf16_input(Isa::Scalar, &x));
        let v = bf16_rows_dot::<2>(isa, [&bf, &bf], &bf16_input(isa, &x));
        assert!((s[0] - v[0]).abs() < 1e-4 && (s[1] - v[1]).abs() < 1e-4);
        let mut d1 = vec![0f32; n];
        let mut d2 = vec![0f32; n];
        bf16_decode(isa, &bf, &mut d1);
        bf16_decode(Isa::Scalar, &bf, &mut d2);
        assert_eq!(d1, d2);

        let packed: Vec<u8> = (0..n / 2).map(|i| (i * 37 % 256) as u8).collect();
        let scales: Vec<u8> = (0..n / 16).map(|i| (0x30 + i * 3) as u8).collect();
        let lut = ScaleLuts::new(448.0);
        let s = nvfp4_row_dot_tokens::<1>(
            Isa::Scalar,
            &packed,
            &scales,
            &lut,
            [&nvfp4_input(Isa::Scalar, &x)],
        );
        let v = nvfp4_row_dot_tokens::<1>(isa, &packed, &scales, &lut, [&nvfp4_input(isa, &x)]);
        assert!(
            (s[0] - v[0]).abs() < 1e-4 * s[0].abs().max(1.0),
            "{s:?} {v:?}"
        );
        // bf16 rows with a tail (not a multiple of 16), as bits too.
        let m = n - 5;
        let sb = bf16_rows_dot::<1>(
            Isa::Scalar,
            [&bf[..2 * m]],
            &bf16_input(Isa::Scalar, &x[..m]),
        );
        let vb = bf16_rows_dot::<1>(isa, [&bf[..2 * m]], &bf16_input(isa, &x[..m]));
        assert!((sb[0] - vb[0]).abs() < 1e-4, "{sb:?} {vb:?}");

        // The GEMM tile: 4 rows × 3 tokens.
        let w4: Vec<Vec<f32>> = (0..4).map(|k| data(n, 10 + k)).collect();
        let x3: Vec<Vec<f32>> = (0..3).map(|t| data(n, 20 + t)).collect();
        let w4r = [0, 1, 2, 3].map(|k| &w4[k][..]);
        let x3r = [0, 1, 2].map(|t| &x3[t][..]);
        let tile = dot4xt::<3>(isa, w4r, x3r);
        for t in 0..3 {
            for k in 0..4 {
                let want = dot(Isa::Scalar, &w4[k], &x3[t]);
                assert!((tile[t][k] - want).abs() < 1e-4, "{t} {k}");
            }
        }

        // The attention output sum over rows `stride` apart (a 72-wide output: the 64-column
        // register block, one 8-column block, no tail; then 70 wide: a scalar tail).
        let rows = data(5 * 80, 30);
        let p = [0.1f32, 0.2, 0.3, 0.15, 0.25];
        for width in [72, 70] {
            let mut o1 = vec![1f32; width];
            let mut o2 = vec![1f32; width];
            weighted_sum(isa, &mut o1, &p, &rows, 80);
            weighted_sum(Isa::Scalar, &mut o2, &p, &rows, 80);
            for (a, b) in o1.iter().zip(&o2) {
                assert!((a - b).abs() < 1e-5);
            }
        }

        nvfp4_decode(isa, &packed, &scales, &lut, &mut d1);
        nvfp4_decode(Isa::Scalar, &packed, &scales, &lut, &mut d2);
        for (a, b) in d1.iter().zip(&d2) {
            assert_eq!(a, b); // ±0 compare equal
        }
    }
}
