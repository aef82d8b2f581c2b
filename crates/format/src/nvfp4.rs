//! NVFP4 weight quantization exactly as compressed-tensors 0.20.1 + llmcompressor 0.14.0.1
//! (`memoryless_minmax` observer) compute it, and the matching dequantization.
//!
//! Per weight `[out, in]`: one `f32` global scale `g` (2688/amax, double-rounded in the weight's
//! dtype; shared by a fused group), one fp8 E4M3 block scale per 16 inputs, and a 4-bit E2M1 code
//! per element, two codes per byte with the even element in the low nibble.

use rayon::prelude::*;

use crate::error::NumericsError;
use crate::float::{bf16_bits_to_f32, f16_bits_to_f32, f32_to_bf16_bits, round_bf16, round_f16};
use crate::fp4::{f32_to_e2m1, E2M1_MAX, E2M1_TO_F32};
use crate::fp8::{e4m3_to_f32, f32_to_e4m3_saturating, E4M3_MAX};

/// Elements per NVFP4 block (one fp8 scale each).
pub const BLOCK: usize = 16;

/// fp8 code the reference substitutes for a block scale that rounds to zero (0.125, "eps").
pub const EPS_SCALE_CODE: u8 = 0x20;

/// Rows handed to one rayon task; large enough to amortise scheduling.
const ROWS_PER_TASK: usize = 8;

/// The floating-point dtype a source weight is stored in. It decides the intermediate roundings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SourceDtype {
    /// bfloat16: global and block scales are rounded to bf16 on the way.
    Bf16,
    /// IEEE half: intermediate roundings to fp16.
    F16,
    /// IEEE single: no intermediate rounding.
    F32,
}

impl SourceDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            SourceDtype::Bf16 | SourceDtype::F16 => 2,
            SourceDtype::F32 => 4,
        }
    }

    /// Round an `f32` result to this dtype (identity for `F32`), as torch does for a tensor op.
    #[inline]
    fn round(self, x: f32) -> f32 {
        match self {
            SourceDtype::Bf16 => round_bf16(x),
            SourceDtype::F16 => round_f16(x),
            SourceDtype::F32 => x,
        }
    }

    /// `torch.finfo(dtype).tiny`: the clamp floor of the tensor absmax.
    fn tiny(self) -> f32 {
        match self {
            SourceDtype::Bf16 | SourceDtype::F32 => f32::MIN_POSITIVE,
            SourceDtype::F16 => 6.103_515_6e-5, // 2^-14
        }
    }
}

/// A borrowed row-major `[rows, cols]` weight in little-endian bytes of `dtype`, with its name
/// (used in every error).
#[derive(Debug, Clone, Copy)]
pub struct WeightView<'a> {
    /// Tensor name, for error messages.
    pub name: &'a str,
    /// Element dtype of `bytes`.
    pub dtype: SourceDtype,
    /// Output dimension.
    pub rows: usize,
    /// Input dimension (must be a multiple of 16 to quantize).
    pub cols: usize,
    /// `rows * cols * dtype.size()` bytes, little endian, no alignment required.
    pub bytes: &'a [u8],
}

impl<'a> WeightView<'a> {
    /// A view after checking that `bytes` has exactly the length the shape and dtype imply.
    pub fn new(
        name: &'a str,
        dtype: SourceDtype,
        rows: usize,
        cols: usize,
        bytes: &'a [u8],
    ) -> Result<Self, NumericsError> {
        let expected = rows
            .checked_mul(cols)
            .and_then(|n| n.checked_mul(dtype.size()))
            .unwrap_or(usize::MAX);
        if bytes.len() != expected {
            return Err(NumericsError::ByteLength {
                tensor: name.to_string(),
                expected,
                actual: bytes.len(),
            });
        }
        Ok(WeightView {
            name,
            dtype,
            rows,
            cols,
            bytes,
        })
    }

    fn row_bytes(&self, row: usize) -> &'a [u8] {
        let width = self.cols * self.dtype.size();
        &self.bytes[row * width..(row + 1) * width]
    }

    fn check_block_aligned(&self) -> Result<(), NumericsError> {
        if !self.cols.is_multiple_of(BLOCK) {
            return Err(NumericsError::NotBlockAligned {
                tensor: self.name.to_string(),
                cols: self.cols,
            });
        }
        Ok(())
    }
}

/// Decode `N` consecutive elements of `dtype` from `bytes` into `out` (exact widening to f32).
#[inline(always)]
fn load<const N: usize>(dtype: SourceDtype, bytes: &[u8], out: &mut [f32; N]) {
    match dtype {
        SourceDtype::Bf16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16_bits_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        SourceDtype::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16_bits_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        SourceDtype::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
    }
}

/// Decode the single element at the start of `bytes`.
#[inline(always)]
fn load_one(dtype: SourceDtype, bytes: &[u8]) -> f32 {
    let mut one = [0f32; 1];
    load(dtype, bytes, &mut one);
    one[0]
}

/// Largest magnitude in one row, or the column of its first NaN/inf.
fn row_amax(dtype: SourceDtype, row: &[u8]) -> Result<f32, usize> {
    #[cfg(target_arch = "x86_64")]
    if dtype == SourceDtype::Bf16
        && row.len().is_multiple_of(32)
        && std::arch::is_x86_feature_detected!("avx2")
    {
        // SAFETY: the CPU supports AVX2, checked just above.
        let (amax, finite) = unsafe { crate::nvfp4_avx2::bf16_row_amax(row) };
        if finite {
            return Ok(amax);
        }
        return Err(first_non_finite(dtype, row));
    }
    let size = dtype.size();
    let (mut amax, mut finite) = (0f32, true);
    let mut block = [0f32; BLOCK];
    let mut chunks = row.chunks_exact(BLOCK * size);
    for chunk in &mut chunks {
        load(dtype, chunk, &mut block);
        for &v in &block {
            finite &= v.is_finite();
            amax = amax.max(v.abs());
        }
    }
    for c in chunks.remainder().chunks_exact(size) {
        let v = load_one(dtype, c);
        finite &= v.is_finite();
        amax = amax.max(v.abs());
    }
    if finite {
        return Ok(amax);
    }
    Err(first_non_finite(dtype, row))
}

/// Column of the first NaN/inf in a row (0 if there is none).
fn first_non_finite(dtype: SourceDtype, row: &[u8]) -> usize {
    row.chunks_exact(dtype.size())
        .position(|c| !load_one(dtype, c).is_finite())
        .unwrap_or(0)
}

/// The tensor's absmax (`max |w|`), after checking every element is finite.
pub fn tensor_amax(weight: &WeightView<'_>) -> Result<f32, NumericsError> {
    let per_row: Vec<Result<f32, usize>> = (0..weight.rows)
        .into_par_iter()
        .with_min_len(ROWS_PER_TASK)
        .map(|r| row_amax(weight.dtype, weight.row_bytes(r)))
        .collect();
    let mut amax = 0f32;
    for (row, result) in per_row.into_iter().enumerate() {
        match result {
            Ok(a) => amax = amax.max(a),
            Err(col) => {
                let size = weight.dtype.size();
                let value = load_one(weight.dtype, &weight.row_bytes(row)[col * size..]);
                return Err(NumericsError::NonFinite {
                    tensor: weight.name.to_string(),
                    index: row * weight.cols + col,
                    row,
                    col,
                    value,
                });
            }
        }
    }
    Ok(amax)
}

/// The global scale `weight_global_scale` for a tensor (or fused group) with absmax `amax`, stored
/// as the multiplier 2688/amax: `round(round(1 / max(amax, tiny)) * 2688)`, both roundings in the
/// source dtype (torch evaluates `2688 / t` as `reciprocal(t) * 2688`, so even f32 rounds twice);
/// an overflow to inf (e.g. an all-zero tensor, or a small fp16 amax) gives 1.0.
pub fn global_scale(amax: f32, dtype: SourceDtype) -> f32 {
    let clamped = amax.max(dtype.tiny());
    let reciprocal = dtype.round(1.0 / clamped);
    let g = dtype.round(reciprocal * (E4M3_MAX * E2M1_MAX));
    if g.is_finite() {
        g
    } else {
        1.0
    }
}

/// The shared global scale of a fused group (q/k/v, gate/up): the global scale of the largest
/// member absmax. All members must have the same dtype.
pub fn fused_global_scale(members: &[WeightView<'_>]) -> Result<f32, NumericsError> {
    let names = || {
        members
            .iter()
            .map(|m| m.name)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let first = members.first().ok_or_else(|| NumericsError::FusedGroup {
        members: String::new(),
        reason: "empty group".into(),
    })?;
    if members.iter().any(|m| m.dtype != first.dtype) {
        return Err(NumericsError::FusedGroup {
            members: names(),
            reason: "members have different dtypes".into(),
        });
    }
    let mut amax = 0f32;
    for m in members {
        amax = amax.max(tensor_amax(m)?);
    }
    Ok(global_scale(amax, first.dtype))
}

/// fp8 block scale code for a block with absmax `block_amax` under global scale `g`:
/// `e4m3(clamp(g * round(block_amax / 6), ±448))`, with a zero result replaced by 0x20.
#[inline(always)]
pub fn block_scale_code(block_amax: f32, g: f32, dtype: SourceDtype) -> u8 {
    let s = dtype.round(block_amax / E2M1_MAX);
    let code = f32_to_e4m3_saturating(g * s);
    if code & 0x7F == 0 {
        EPS_SCALE_CODE
    } else {
        code
    }
}

/// One quantized weight: `packed [rows, cols/2]` E2M1 codes, `scales [rows, cols/16]` fp8 E4M3
/// bytes and the `f32` global scale.
#[derive(Debug, Clone, PartialEq)]
pub struct Nvfp4Tensor {
    /// Output dimension.
    pub rows: usize,
    /// Input dimension (unpacked).
    pub cols: usize,
    /// `weight_packed`: two codes per byte, even element in the low nibble.
    pub packed: Vec<u8>,
    /// `weight_scale`: raw fp8 E4M3 bytes.
    pub scales: Vec<u8>,
    /// `weight_global_scale` (multiplier convention).
    pub global_scale: f32,
}

/// Quantize one block of 16 values into 8 packed bytes, returning its fp8 scale code.
#[inline(always)]
fn quantize_block(values: &[f32; BLOCK], g: f32, dtype: SourceDtype, out: &mut [u8]) -> u8 {
    let amax = values.iter().fold(0f32, |m, v| m.max(v.abs()));
    let code = block_scale_code(amax, g, dtype);
    // Two f32 divisions in this order, as the reference: s_eff = fp8 / g, then x / s_eff.
    let s_eff = e4m3_to_f32(code) / g;
    let mut codes = [0u8; BLOCK];
    for (c, &v) in codes.iter_mut().zip(values) {
        *c = f32_to_e2m1((v / s_eff).clamp(-E2M1_MAX, E2M1_MAX));
    }
    for (o, pair) in out.iter_mut().zip(codes.chunks_exact(2)) {
        *o = pair[0] | (pair[1] << 4);
    }
    code
}

/// Quantize one row into its packed bytes and scale codes (portable body, inlined into each
/// instruction-set specialisation below).
#[inline(always)]
fn quantize_row_body(dtype: SourceDtype, row: &[u8], g: f32, packed: &mut [u8], scales: &mut [u8]) {
    let mut block = [0f32; BLOCK];
    let step = BLOCK * dtype.size();
    for ((src, dst), scale) in row
        .chunks_exact(step)
        .zip(packed.chunks_exact_mut(BLOCK / 2))
        .zip(scales.iter_mut())
    {
        load(dtype, src, &mut block);
        *scale = quantize_block(&block, g, dtype, dst);
    }
}

/// The same body compiled with AVX2 enabled, so the divisions and compares run 8 wide. Identical
/// results: IEEE division and comparisons are exact per lane, and Rust never contracts to FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_row_avx2(
    dtype: SourceDtype,
    row: &[u8],
    g: f32,
    packed: &mut [u8],
    scales: &mut [u8],
) {
    quantize_row_body(dtype, row, g, packed, scales)
}

/// Quantize one row with the best instruction set this CPU has (chosen at run time).
/// `s_eff[code]` is `fp8(code) / g`, the reference's first division, precomputed per tensor.
fn quantize_row(
    dtype: SourceDtype,
    row: &[u8],
    g: f32,
    s_eff: &[f32; 256],
    packed: &mut [u8],
    scales: &mut [u8],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe {
            match dtype {
                SourceDtype::Bf16 => {
                    crate::nvfp4_avx2::quantize_bf16_row(row, g, s_eff, packed, scales)
                }
                _ => quantize_row_avx2(dtype, row, g, packed, scales),
            }
        };
    }
    let _ = s_eff;
    quantize_row_body(dtype, row, g, packed, scales)
}

/// Quantize `weight` with the given global scale (its own, or its fused group's) into NVFP4.
/// Fails if the input dimension is not a multiple of 16 or an element is NaN/inf.
pub fn quantize_with_global_scale(
    weight: &WeightView<'_>,
    global_scale: f32,
) -> Result<Nvfp4Tensor, NumericsError> {
    weight.check_block_aligned()?;
    // Finiteness is part of the contract even when the caller computed the scale itself.
    tensor_amax(weight)?;
    Ok(quantize_checked(weight, global_scale))
}

/// Quantize a weight already checked to be block aligned and finite.
fn quantize_checked(weight: &WeightView<'_>, global_scale: f32) -> Nvfp4Tensor {
    let (rows, cols) = (weight.rows, weight.cols);
    let mut packed = vec![0u8; rows * cols / 2];
    let mut scales = vec![0u8; rows * cols / BLOCK];
    let s_eff: [f32; 256] = std::array::from_fn(|code| e4m3_to_f32(code as u8) / global_scale);
    if cols > 0 {
        packed
            .par_chunks_mut(cols / 2)
            .zip(scales.par_chunks_mut(cols / BLOCK))
            .enumerate()
            .with_min_len(ROWS_PER_TASK)
            .for_each(|(r, (p, s))| {
                quantize_row(
                    weight.dtype,
                    weight.row_bytes(r),
                    global_scale,
                    &s_eff,
                    p,
                    s,
                )
            });
    }
    Nvfp4Tensor {
        rows,
        cols,
        packed,
        scales,
        global_scale,
    }
}

/// Quantize a standalone (unfused) weight: its own global scale, then blocks and codes.
pub fn quantize(weight: &WeightView<'_>) -> Result<Nvfp4Tensor, NumericsError> {
    weight.check_block_aligned()?;
    let g = global_scale(tensor_amax(weight)?, weight.dtype);
    Ok(quantize_checked(weight, g))
}

/// Quantize the members of a fused group (q/k/v or gate/up) with one shared global scale.
pub fn quantize_fused(members: &[WeightView<'_>]) -> Result<Vec<Nvfp4Tensor>, NumericsError> {
    for m in members {
        m.check_block_aligned()?;
    }
    let g = fused_global_scale(members)?;
    Ok(members.iter().map(|m| quantize_checked(m, g)).collect())
}

/// Split packed bytes into one E2M1 code per element (low nibble first).
pub fn unpack_codes(packed: &[u8]) -> Vec<u8> {
    packed.iter().flat_map(|b| [b & 0xF, b >> 4]).collect()
}

/// Pack E2M1 codes two per byte, even element in the low nibble. `codes.len()` must be even;
/// only the low 4 bits of each code are used.
pub fn pack_codes(codes: &[u8]) -> Vec<u8> {
    codes
        .chunks_exact(2)
        .map(|p| (p[0] & 0xF) | ((p[1] & 0xF) << 4))
        .collect()
}

/// A borrowed NVFP4 weight as stored on disk, for dequantization.
#[derive(Debug, Clone, Copy)]
pub struct Nvfp4View<'a> {
    /// Output dimension.
    pub rows: usize,
    /// Input dimension (unpacked; a multiple of 16).
    pub cols: usize,
    /// `rows * cols / 2` packed bytes.
    pub packed: &'a [u8],
    /// `rows * cols / 16` fp8 E4M3 bytes.
    pub scales: &'a [u8],
    /// The stored multiplier global scale.
    pub global_scale: f32,
}

impl Nvfp4View<'_> {
    /// Borrow an owned quantized tensor.
    pub fn of(t: &Nvfp4Tensor) -> Nvfp4View<'_> {
        Nvfp4View {
            rows: t.rows,
            cols: t.cols,
            packed: &t.packed,
            scales: &t.scales,
            global_scale: t.global_scale,
        }
    }

    fn check(&self) -> bool {
        self.cols.is_multiple_of(BLOCK)
            && self.packed.len() == self.rows * self.cols / 2
            && self.scales.len() == self.rows * self.cols / BLOCK
    }
}

/// The 16 values a block's codes decode to: `e2m1(code) * (fp8_scale / g)` in f32.
#[inline(always)]
fn block_table(scale_code: u8, g: f32) -> [f32; 16] {
    let s_eff = e4m3_to_f32(scale_code) / g;
    E2M1_TO_F32.map(|v| v * s_eff)
}

/// Dequantize to `f32`: `w = e2m1(code) * (fp8_scale / global_scale)`. Panics only if the view's
/// buffers do not match its shape (a programming error; check shapes when reading from disk).
pub fn dequantize_f32(view: &Nvfp4View<'_>) -> Vec<f32> {
    assert!(view.check(), "NVFP4 view buffers do not match its shape");
    let mut out = vec![0f32; view.rows * view.cols];
    out.par_chunks_mut(BLOCK * 256)
        .zip(view.packed.par_chunks(BLOCK / 2 * 256))
        .zip(view.scales.par_chunks(256))
        .for_each(|((o, p), s)| {
            for ((ob, pb), &sc) in o
                .chunks_exact_mut(BLOCK)
                .zip(p.chunks_exact(BLOCK / 2))
                .zip(s)
            {
                let table = block_table(sc, view.global_scale);
                for (pair, &byte) in ob.chunks_exact_mut(2).zip(pb) {
                    pair[0] = table[(byte & 0xF) as usize];
                    pair[1] = table[(byte >> 4) as usize];
                }
            }
        });
    out
}

/// Dequantize to bf16 bits (the model dtype cast of compressed-tensors' decompress: the f32
/// product rounded to nearest even). Same shape contract as [`dequantize_f32`].
pub fn dequantize_bf16(view: &Nvfp4View<'_>) -> Vec<u16> {
    let mut out = vec![0u16; view.rows * view.cols];
    dequantize_bf16_into(view, &mut out);
    out
}

/// [`dequantize_bf16`] into a caller-provided buffer of exactly `rows * cols` elements (panics
/// otherwise), so hot loops can reuse their memory.
pub fn dequantize_bf16_into(view: &Nvfp4View<'_>, out: &mut [u16]) {
    assert!(view.check(), "NVFP4 view buffers do not match its shape");
    assert_eq!(out.len(), view.rows * view.cols, "output buffer size");
    let g = view.global_scale;
    out.par_chunks_mut(BLOCK * 256)
        .zip(view.packed.par_chunks(BLOCK / 2 * 256))
        .zip(view.scales.par_chunks(256))
        .for_each(|((o, p), s)| dequantize_bf16_blocks(o, p, s, g));
}

/// Dequantize whole blocks to bf16 with the best instruction set this CPU has.
fn dequantize_bf16_blocks(out: &mut [u16], packed: &[u8], scales: &[u8], g: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { crate::nvfp4_avx2::dequantize_bf16_blocks(out, packed, scales, g) };
    }
    for ((ob, pb), &sc) in out
        .chunks_exact_mut(BLOCK)
        .zip(packed.chunks_exact(BLOCK / 2))
        .zip(scales)
    {
        let table = block_table(sc, g).map(f32_to_bf16_bits);
        for (pair, &byte) in ob.chunks_exact_mut(2).zip(pb) {
            pair[0] = table[(byte & 0xF) as usize];
            pair[1] = table[(byte >> 4) as usize];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf16_bytes(values: &[f32]) -> Vec<u8> {
        values
            .iter()
            .flat_map(|&v| f32_to_bf16_bits(v).to_le_bytes())
            .collect()
    }

    #[test]
    fn global_scale_double_rounds_in_bf16() {
        // spec §1.3: amax 0.30078125 → 8960, not 8936.7.
        assert_eq!(global_scale(0.300_781_25, SourceDtype::Bf16), 8960.0);
        assert_eq!(global_scale(2.0, SourceDtype::Bf16), 1344.0);
        assert_eq!(global_scale(7.0, SourceDtype::Bf16), 384.0);
        assert_eq!(global_scale(0.0, SourceDtype::Bf16), 1.0);
        assert_eq!(global_scale(0.0, SourceDtype::F32), 1.0);
    }

    /// spec §7 Ex1, row 0 and row 1.
    #[test]
    fn worked_example_ramp() {
        let mut values: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 0.125).collect();
        values.extend((0..32).map(|i| {
            let sign = if i % 2 == 0 { 1.0 } else { -1.0 };
            round_bf16(0.01 * sign * (i as f32 + 1.0))
        }));
        let bytes = bf16_bytes(&values);
        let w = WeightView::new("ex1", SourceDtype::Bf16, 2, 32, &bytes).unwrap();
        let q = quantize(&w).unwrap();
        assert_eq!(q.global_scale, 1344.0);
        assert_eq!(q.scales, [0x7e, 0x7d, 0x61, 0x69]);
        assert_eq!(
            &q.packed[..16],
            &[
                0xff, 0xef, 0xee, 0xde, 0xdd, 0xcc, 0xab, 0x9a, 0x10, 0x22, 0x43, 0x54, 0x65, 0x66,
                0x76, 0x77
            ]
        );
        assert_eq!(
            &q.packed[16..],
            &[
                0x91, 0xb2, 0xc4, 0xd5, 0xe5, 0xe6, 0xf6, 0xf7, 0xd5, 0xe6, 0xe6, 0xe6, 0xe6, 0xf7,
                0xf7, 0xf7
            ]
        );
    }

    #[test]
    fn rejects_unaligned_and_non_finite() {
        let bytes = bf16_bytes(&[1.0; 24]);
        let w = WeightView::new("w", SourceDtype::Bf16, 2, 12, &bytes).unwrap();
        assert!(matches!(
            quantize(&w),
            Err(NumericsError::NotBlockAligned { cols: 12, .. })
        ));
        let mut values = vec![1.0f32; 32];
        values[21] = f32::NAN;
        values[30] = f32::INFINITY;
        let bytes = bf16_bytes(&values);
        let w = WeightView::new("w", SourceDtype::Bf16, 2, 16, &bytes).unwrap();
        match quantize(&w) {
            Err(NumericsError::NonFinite {
                tensor,
                index,
                row,
                col,
                ..
            }) => {
                assert_eq!((tensor.as_str(), index, row, col), ("w", 21, 1, 5));
            }
            other => panic!("expected NonFinite, got {other:?}"),
        }
    }

    #[test]
    fn wrong_byte_length_is_an_error() {
        assert!(WeightView::new("w", SourceDtype::F32, 2, 16, &[0u8; 64]).is_err());
    }
}

#[cfg(test)]
mod simd_agreement {
    use super::*;

    /// Values that stress every rounding path: ties, signed zeros, subnormal-scale blocks, spikes.
    fn awkward_row(seed: u64, cols: usize) -> Vec<u8> {
        let mut state = seed | 1;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        (0..cols)
            .map(|i| {
                let r = next();
                let v = match r % 9 {
                    0 => [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0][(r >> 8) as usize % 8],
                    1 => -0.0,
                    2 => 0.0,
                    3 => f32::from_bits((r >> 16) as u32 & 0x807F_FFFF) * 1e-3,
                    4 => (i as f32) * 1e-30,
                    5 => f32::from_bits(((r >> 20) as u32 & 0x3FFF_FFFF) | ((r as u32) << 31)),
                    _ => ((r >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0,
                };
                if r % 7 == 0 {
                    -v
                } else {
                    v
                }
            })
            .flat_map(|v: f32| f32_to_bf16_bits(v).to_le_bytes())
            .collect()
    }

    #[test]
    fn dispatched_kernels_equal_the_portable_body() {
        for seed in 0..200u64 {
            let cols = 16 * (1 + seed as usize % 40);
            let row = awkward_row(seed * 7919 + 1, cols);
            let amax = row_amax(SourceDtype::Bf16, &row).unwrap();
            let mut portable_amax = 0f32;
            for c in row.chunks_exact(2) {
                portable_amax = portable_amax.max(load_one(SourceDtype::Bf16, c).abs());
            }
            assert_eq!(amax, portable_amax);
            for g in [global_scale(amax, SourceDtype::Bf16), 1.0, 3.0e38, 0.5] {
                let s_eff: [f32; 256] = std::array::from_fn(|c| e4m3_to_f32(c as u8) / g);
                let (mut p1, mut s1) = (vec![0u8; cols / 2], vec![0u8; cols / 16]);
                let (mut p2, mut s2) = (vec![0u8; cols / 2], vec![0u8; cols / 16]);
                quantize_row(SourceDtype::Bf16, &row, g, &s_eff, &mut p1, &mut s1);
                quantize_row_body(SourceDtype::Bf16, &row, g, &mut p2, &mut s2);
                assert_eq!((&p1, &s1), (&p2, &s2), "seed {seed} g {g}");
                let view = Nvfp4View {
                    rows: 1,
                    cols,
                    packed: &p1,
                    scales: &s1,
                    global_scale: g,
                };
                let fast = dequantize_bf16(&view);
                let slow: Vec<u16> = dequantize_f32(&view)
                    .into_iter()
                    .map(f32_to_bf16_bits)
                    .collect();
                assert_eq!(fast, slow, "dequantize seed {seed} g {g}");
            }
        }
    }
}
