//! Weights as stored: borrowed from the checkpoint's memory map, kept packed, never expanded at
//! load. Resident memory of a loaded model is about its file size; NVFP4 weights are decoded
//! block by block inside the kernels.
//!
//! [`Bytes`] is a shared, immutable byte range that keeps its owner alive (the mapped
//! [`Checkpoint`], or a plain vector for weights made in memory); [`LinearWeight`] is one
//! `[out, in]` matrix in one of the stored encodings; [`WeightLoader`] finds a module's tensors by
//! the checkpoint's names and validates their dtypes and shapes.

use std::any::Any;
use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use fp4forge_format::float::{bf16_bits_to_f32, f16_bits_to_f32};
use fp4forge_format::{Checkpoint, Dtype, Nvfp4View, TensorEntry};

use crate::error::{EngineError, Result};

/// An immutable byte range that keeps its owner (a memory map or a vector) alive.
#[derive(Clone)]
pub struct Bytes {
    owner: Arc<dyn Any + Send + Sync>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: `Bytes` is a read-only view of memory owned by `owner`, which is `Send + Sync` and is
// kept alive by the `Arc` for as long as any `Bytes` points into it. The memory never changes
// (a read-only file map or a vector nobody can reach mutably), so sharing across threads is sound.
unsafe impl Send for Bytes {}
// SAFETY: see `Send` above: shared immutable data.
unsafe impl Sync for Bytes {}

impl Bytes {
    /// Takes ownership of a vector.
    pub fn from_vec(v: Vec<u8>) -> Self {
        let owner: Arc<Vec<u8>> = Arc::new(v);
        let (ptr, len) = (owner.as_ptr(), owner.len());
        Self { owner, ptr, len }
    }

    /// The bytes of one tensor of a shared checkpoint (zero copy).
    pub fn from_tensor(ckpt: &Arc<Checkpoint>, entry: &TensorEntry<'_>) -> Self {
        let bytes = entry.bytes();
        Self {
            owner: ckpt.clone(),
            ptr: bytes.as_ptr(),
            len: bytes.len(),
        }
    }

    /// The bytes.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` lies inside memory owned by `self.owner` (a vector's buffer or
        // a checkpoint's map, neither of which moves or changes while the owner lives), and the
        // owner outlives the returned borrow because `self` holds it.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A sub-range sharing the same owner. Panics if `range` is out of bounds (callers derive it
    /// from validated shapes).
    pub fn slice(&self, range: Range<usize>) -> Self {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "Bytes::slice out of bounds"
        );
        Self {
            owner: self.owner.clone(),
            // SAFETY: in bounds, checked above.
            ptr: unsafe { self.ptr.add(range.start) },
            len: range.end - range.start,
        }
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Bytes({} bytes)", self.len)
    }
}

/// One linear layer's weight `W [rows = out, cols = in]` as stored, for `y = x · Wᵀ`.
#[derive(Debug, Clone)]
pub enum LinearWeight {
    /// bfloat16, row-major.
    Bf16 {
        /// `rows * cols * 2` bytes.
        data: Bytes,
        /// Output dimension.
        rows: usize,
        /// Input dimension.
        cols: usize,
    },
    /// IEEE half, row-major.
    F16 {
        /// `rows * cols * 2` bytes.
        data: Bytes,
        /// Output dimension.
        rows: usize,
        /// Input dimension.
        cols: usize,
    },
    /// IEEE single, row-major.
    F32 {
        /// `rows * cols * 4` bytes.
        data: Bytes,
        /// Output dimension.
        rows: usize,
        /// Input dimension.
        cols: usize,
    },
    /// compressed-tensors NVFP4: `w = e2m1(code) · (fp8(scale) / global_scale)`.
    Nvfp4 {
        /// `weight_packed`: `rows * cols / 2` bytes, even element in the low nibble.
        packed: Bytes,
        /// `weight_scale`: `rows * cols / 16` fp8 E4M3 bytes.
        scales: Bytes,
        /// `weight_global_scale` (the 2688/amax multiplier: dequantization divides by it).
        global_scale: f32,
        /// `input_global_scale` of a W4A4 module; `None` for W4A16. A backend given a weight with
        /// it set quantizes that layer's input activations to NVFP4 first (the model clears it
        /// unless `ModelOptions::emulate_w4a4` is on).
        input_global_scale: Option<f32>,
        /// Output dimension.
        rows: usize,
        /// Input dimension (a multiple of 16).
        cols: usize,
    },
}

impl LinearWeight {
    /// Output dimension.
    pub fn rows(&self) -> usize {
        match *self {
            Self::Bf16 { rows, .. }
            | Self::F16 { rows, .. }
            | Self::F32 { rows, .. }
            | Self::Nvfp4 { rows, .. } => rows,
        }
    }

    /// Input dimension.
    pub fn cols(&self) -> usize {
        match *self {
            Self::Bf16 { cols, .. }
            | Self::F16 { cols, .. }
            | Self::F32 { cols, .. }
            | Self::Nvfp4 { cols, .. } => cols,
        }
    }

    /// Bytes the weight occupies as stored.
    pub fn stored_bytes(&self) -> usize {
        match self {
            Self::Bf16 { data, .. } | Self::F16 { data, .. } | Self::F32 { data, .. } => data.len(),
            Self::Nvfp4 { packed, scales, .. } => packed.len() + scales.len() + 4,
        }
    }

    /// A short name of the encoding (`bf16`, `f16`, `f32`, `nvfp4`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Bf16 { .. } => "bf16",
            Self::F16 { .. } => "f16",
            Self::F32 { .. } => "f32",
            Self::Nvfp4 { .. } => "nvfp4",
        }
    }

    /// A dense weight from f32 values (tests, benches, synthetic models).
    pub fn from_f32(rows: usize, cols: usize, values: &[f32]) -> Self {
        assert_eq!(values.len(), rows * cols, "LinearWeight::from_f32 shape");
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self::F32 {
            data: Bytes::from_vec(bytes),
            rows,
            cols,
        }
    }

    /// A bf16 weight from raw bf16 bits (tests, benches).
    pub fn from_bf16_bits(rows: usize, cols: usize, bits: &[u16]) -> Self {
        assert_eq!(
            bits.len(),
            rows * cols,
            "LinearWeight::from_bf16_bits shape"
        );
        let bytes = bits.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self::Bf16 {
            data: Bytes::from_vec(bytes),
            rows,
            cols,
        }
    }

    /// An NVFP4 weight from an owned quantized tensor (tests, benches).
    pub fn from_nvfp4(t: &fp4forge_format::Nvfp4Tensor, input_global_scale: Option<f32>) -> Self {
        Self::Nvfp4 {
            packed: Bytes::from_vec(t.packed.clone()),
            scales: Bytes::from_vec(t.scales.clone()),
            global_scale: t.global_scale,
            input_global_scale,
            rows: t.rows,
            cols: t.cols,
        }
    }

    /// The NVFP4 view of this weight, if it is NVFP4.
    pub fn nvfp4_view(&self) -> Option<Nvfp4View<'_>> {
        match self {
            Self::Nvfp4 {
                packed,
                scales,
                global_scale,
                rows,
                cols,
                ..
            } => Some(Nvfp4View {
                rows: *rows,
                cols: *cols,
                packed: packed.as_slice(),
                scales: scales.as_slice(),
                global_scale: *global_scale,
            }),
            _ => None,
        }
    }

    /// Row `r` decoded to f32 (exact for every encoding; NVFP4 as `e2m1 · (fp8 / g)`).
    /// Panics if `r >= rows` or `out.len() != cols`.
    pub fn decode_row(&self, r: usize, out: &mut [f32]) {
        let cols = self.cols();
        assert!(r < self.rows() && out.len() == cols, "decode_row bounds");
        match self {
            Self::Bf16 { data, .. } => {
                let b = &data.as_slice()[r * cols * 2..(r + 1) * cols * 2];
                for (o, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                    *o = bf16_bits_to_f32(u16::from_le_bytes([c[0], c[1]]));
                }
            }
            Self::F16 { data, .. } => {
                let b = &data.as_slice()[r * cols * 2..(r + 1) * cols * 2];
                for (o, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                    *o = f16_bits_to_f32(u16::from_le_bytes([c[0], c[1]]));
                }
            }
            Self::F32 { data, .. } => {
                let b = &data.as_slice()[r * cols * 4..(r + 1) * cols * 4];
                for (o, c) in out.iter_mut().zip(b.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            Self::Nvfp4 {
                packed,
                scales,
                global_scale,
                ..
            } => {
                let p = &packed.as_slice()[r * cols / 2..(r + 1) * cols / 2];
                let s = &scales.as_slice()[r * cols / 16..(r + 1) * cols / 16];
                for ((o, pb), &sc) in out.chunks_exact_mut(16).zip(p.chunks_exact(8)).zip(s) {
                    let s_eff = fp4forge_format::fp8::E4M3_TO_F32[sc as usize] / global_scale;
                    for (pair, &byte) in o.chunks_exact_mut(2).zip(pb) {
                        pair[0] = fp4forge_format::fp4::E2M1_TO_F32[(byte & 0xF) as usize] * s_eff;
                        pair[1] = fp4forge_format::fp4::E2M1_TO_F32[(byte >> 4) as usize] * s_eff;
                    }
                }
            }
        }
    }

    /// The whole matrix decoded to f32 (tests and reference paths only: it allocates the
    /// decompressed size).
    pub fn to_f32(&self) -> Vec<f32> {
        let (rows, cols) = (self.rows(), self.cols());
        let mut out = vec![0f32; rows * cols];
        for (r, row) in out.chunks_exact_mut(cols.max(1)).enumerate().take(rows) {
            self.decode_row(r, row);
        }
        out
    }
}

/// The three projections of one SwiGLU expert: `down(silu(gate · x) ⊙ (up · x))`.
#[derive(Debug, Clone)]
pub struct ExpertWeights {
    /// `gate_proj [inter, hidden]`.
    pub gate: LinearWeight,
    /// `up_proj [inter, hidden]`.
    pub up: LinearWeight,
    /// `down_proj [hidden, inter]`.
    pub down: LinearWeight,
}

/// Finds tensors in a shared checkpoint by name and checks their dtypes and shapes; every
/// error names the checkpoint directory and the tensor.
#[derive(Debug, Clone)]
pub struct WeightLoader {
    ckpt: Arc<Checkpoint>,
}

impl WeightLoader {
    /// A loader over `ckpt`.
    pub fn new(ckpt: Arc<Checkpoint>) -> Self {
        Self { ckpt }
    }

    /// The checkpoint.
    pub fn checkpoint(&self) -> &Arc<Checkpoint> {
        &self.ckpt
    }

    fn dir(&self) -> PathBuf {
        self.ckpt.dir().to_path_buf()
    }

    /// An error about `tensor`.
    pub fn error(&self, tensor: &str, reason: impl Into<String>) -> EngineError {
        EngineError::Tensor {
            dir: self.dir(),
            tensor: tensor.to_owned(),
            reason: reason.into(),
        }
    }

    /// Whether a tensor named `name` exists.
    pub fn has(&self, name: &str) -> bool {
        self.ckpt.contains(name)
    }

    /// Whether the module `module` has a weight (`.weight` or NVFP4 `.weight_packed`).
    pub fn has_linear(&self, module: &str) -> bool {
        self.has(&format!("{module}.weight")) || self.has(&format!("{module}.weight_packed"))
    }

    fn entry(&self, name: &str) -> Result<TensorEntry<'_>> {
        self.ckpt
            .get(name)
            .ok_or_else(|| self.error(name, "missing from the checkpoint"))
    }

    /// The linear weight of `module` (`{module}.weight` in bf16/f16/f32, or the NVFP4 tensors
    /// `{module}.weight_packed/.weight_scale/.weight_global_scale[/.input_global_scale]`),
    /// checked to be `[rows, cols]`.
    pub fn linear(&self, module: &str, rows: usize, cols: usize) -> Result<LinearWeight> {
        let w = self.linear_any(module)?;
        if w.rows() != rows || w.cols() != cols {
            return Err(self.error(
                &linear_tensor_name(module, &w),
                format!(
                    "shape [{}, {}] (as [out, in]) does not match the config's [{rows}, {cols}]",
                    w.rows(),
                    w.cols()
                ),
            ));
        }
        Ok(w)
    }

    /// The linear weight of `module`, whatever its shape.
    pub fn linear_any(&self, module: &str) -> Result<LinearWeight> {
        let dense_name = format!("{module}.weight");
        if let Some(e) = self.ckpt.get(&dense_name) {
            let [rows, cols] = self.matrix_shape(&dense_name, &e.info.shape)?;
            let data = Bytes::from_tensor(&self.ckpt, &e);
            return match e.info.dtype {
                Dtype::BF16 => Ok(LinearWeight::Bf16 { data, rows, cols }),
                Dtype::F16 => Ok(LinearWeight::F16 { data, rows, cols }),
                Dtype::F32 => Ok(LinearWeight::F32 { data, rows, cols }),
                d => Err(self.error(
                    &dense_name,
                    format!("dtype {d} is not supported for a linear weight (BF16, F16, F32)"),
                )),
            };
        }
        let packed_name = format!("{module}.weight_packed");
        if self.has(&packed_name) {
            return self.nvfp4(module);
        }
        Err(self.error(
            &dense_name,
            format!("missing from the checkpoint (nor is there `{packed_name}`)"),
        ))
    }

    fn nvfp4(&self, module: &str) -> Result<LinearWeight> {
        let packed_name = format!("{module}.weight_packed");
        let scale_name = format!("{module}.weight_scale");
        let packed = self.entry(&packed_name)?;
        let scales = self.entry(&scale_name)?;
        if packed.info.dtype != Dtype::U8 {
            return Err(self.error(
                &packed_name,
                format!("dtype {} (NVFP4 codes must be U8)", packed.info.dtype),
            ));
        }
        if scales.info.dtype != Dtype::F8_E4M3 {
            return Err(self.error(
                &scale_name,
                format!(
                    "dtype {} (NVFP4 block scales must be F8_E4M3)",
                    scales.info.dtype
                ),
            ));
        }
        let [rows, half] = self.matrix_shape(&packed_name, &packed.info.shape)?;
        let cols = half * 2;
        if !cols.is_multiple_of(16) {
            return Err(self.error(
                &packed_name,
                format!("input dimension {cols} is not a multiple of 16"),
            ));
        }
        let sshape = self.matrix_shape(&scale_name, &scales.info.shape)?;
        if sshape != [rows, cols / 16] {
            return Err(self.error(
                &scale_name,
                format!(
                    "shape {:?} does not match the packed weight's [{rows}, {}]",
                    scales.info.shape,
                    cols / 16
                ),
            ));
        }
        let global_scale = self.scalar(&format!("{module}.weight_global_scale"))?;
        if !(global_scale.is_finite() && global_scale > 0.0) {
            return Err(self.error(
                &format!("{module}.weight_global_scale"),
                format!("{global_scale} is not a positive finite number"),
            ));
        }
        let igs_name = format!("{module}.input_global_scale");
        let input_global_scale = if self.has(&igs_name) {
            Some(self.scalar(&igs_name)?)
        } else {
            None
        };
        Ok(LinearWeight::Nvfp4 {
            packed: Bytes::from_tensor(&self.ckpt, &packed),
            scales: Bytes::from_tensor(&self.ckpt, &scales),
            global_scale,
            input_global_scale,
            rows,
            cols,
        })
    }

    fn matrix_shape(&self, name: &str, shape: &[usize]) -> Result<[usize; 2]> {
        match shape {
            [r, c] => Ok([*r, *c]),
            _ => Err(self.error(name, format!("expected a 2-D tensor, got shape {shape:?}"))),
        }
    }

    /// A one-element tensor (`[]` or `[1]`, F32/BF16/F16) as f32.
    pub fn scalar(&self, name: &str) -> Result<f32> {
        let e = self.entry(name)?;
        if e.info.numel() != 1 {
            return Err(self.error(
                name,
                format!("expected one element, got shape {:?}", e.info.shape),
            ));
        }
        let v = self.to_f32(name, &e)?;
        Ok(v[0])
    }

    /// A 1-D tensor of `len` elements as f32 (norm weights, biases: small).
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let e = self.entry(name)?;
        if e.info.shape != [len] {
            return Err(self.error(
                name,
                format!(
                    "shape {:?} does not match the config's [{len}]",
                    e.info.shape
                ),
            ));
        }
        self.to_f32(name, &e)
    }

    /// [`vector`](Self::vector) when the tensor exists.
    pub fn opt_vector(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        if self.has(name) {
            self.vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    }

    /// A 3-D tensor `[e, rows, cols]` split into `e` linear weights of `[rows, cols]` (fused
    /// expert tensors), checked against the expected shape. Dense dtypes only.
    pub fn stacked_linears(
        &self,
        name: &str,
        experts: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<LinearWeight>> {
        let e = self.entry(name)?;
        if e.info.shape != [experts, rows, cols] {
            return Err(self.error(
                name,
                format!(
                    "shape {:?} does not match the config's [{experts}, {rows}, {cols}]",
                    e.info.shape
                ),
            ));
        }
        let size = e.info.dtype.size();
        let all = Bytes::from_tensor(&self.ckpt, &e);
        let per = rows * cols * size;
        (0..experts)
            .map(|i| {
                let data = all.slice(i * per..(i + 1) * per);
                match e.info.dtype {
                    Dtype::BF16 => Ok(LinearWeight::Bf16 { data, rows, cols }),
                    Dtype::F16 => Ok(LinearWeight::F16 { data, rows, cols }),
                    Dtype::F32 => Ok(LinearWeight::F32 { data, rows, cols }),
                    d => Err(self.error(
                        name,
                        format!("dtype {d} is not supported for fused experts (BF16, F16, F32)"),
                    )),
                }
            })
            .collect()
    }

    fn to_f32(&self, name: &str, e: &TensorEntry<'_>) -> Result<Vec<f32>> {
        let b = e.bytes();
        match e.info.dtype {
            Dtype::F32 => Ok(b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()),
            Dtype::BF16 => Ok(b
                .chunks_exact(2)
                .map(|c| bf16_bits_to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect()),
            Dtype::F16 => Ok(b
                .chunks_exact(2)
                .map(|c| f16_bits_to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect()),
            d => Err(self.error(name, format!("dtype {d} is not a float type"))),
        }
    }
}

fn linear_tensor_name(module: &str, w: &LinearWeight) -> String {
    match w {
        LinearWeight::Nvfp4 { .. } => format!("{module}.weight_packed"),
        _ => format!("{module}.weight"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_slices_share_the_owner() {
        let b = Bytes::from_vec((0u8..10).collect());
        let s = b.slice(2..5);
        drop(b);
        assert_eq!(s.as_slice(), &[2, 3, 4]);
    }

    #[test]
    fn nvfp4_rows_decode_like_the_format_crate() {
        let vals: Vec<u16> = (0..4 * 32)
            .map(|i| half::bf16::from_f32(((i * 37 % 29) as f32 - 14.0) / 7.0).to_bits())
            .collect();
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let view = fp4forge_format::WeightView::new(
            "w",
            fp4forge_format::SourceDtype::Bf16,
            4,
            32,
            &bytes,
        )
        .unwrap();
        let q = fp4forge_format::quantize(&view).unwrap();
        let w = LinearWeight::from_nvfp4(&q, None);
        let reference = fp4forge_format::dequantize_f32(&Nvfp4View::of(&q));
        assert_eq!(w.to_f32(), reference);
    }
}
