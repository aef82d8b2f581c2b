//! One tensor: dequantize the GGUF data, undo the Q/K permutation where llama.cpp applied one,
//! and encode in the output dtype.

use fp4forge_format::float::f32_to_bf16_bits;
use fp4forge_format::gguf::{dequantize, GgufError, GgufFile, TensorInfo};
use fp4forge_format::Dtype;

use crate::BuilderError;

use super::permute::unpermute_rows;

/// Elements dequantized at a time when no permutation is needed (bounds the `f32` scratch).
const CHUNK_ELEMENTS: usize = 1 << 20;

/// The output encoding of the imported weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputDtype {
    /// bfloat16, round-to-nearest-even from the dequantized `f32` (the default; what HF
    /// SmolLM2/Llama checkpoints ship in).
    #[default]
    Bf16,
    /// `f32`: the dequantized values exactly (twice the size).
    F32,
}

impl OutputDtype {
    /// The safetensors dtype.
    pub fn dtype(self) -> Dtype {
        match self {
            OutputDtype::Bf16 => Dtype::BF16,
            OutputDtype::F32 => Dtype::F32,
        }
    }

    /// `torch_dtype` in config.json.
    pub fn torch_name(self) -> &'static str {
        match self {
            OutputDtype::Bf16 => "bfloat16",
            OutputDtype::F32 => "float32",
        }
    }

    fn encode(self, values: &[f32], out: &mut Vec<u8>) {
        match self {
            OutputDtype::Bf16 => out.extend(
                values
                    .iter()
                    .flat_map(|&x| f32_to_bf16_bits(x).to_le_bytes()),
            ),
            OutputDtype::F32 => out.extend(values.iter().flat_map(|x| x.to_le_bytes())),
        }
    }
}

fn check_finite(
    gguf: &GgufFile,
    info: &TensorInfo,
    values: &[f32],
    first: usize,
) -> Result<(), BuilderError> {
    match values.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(i) => Err(BuilderError::Gguf(GgufError::Tensor {
            path: gguf.path().to_path_buf(),
            tensor: info.name.clone(),
            reason: format!(
                "non-finite value {} at flat index {} after dequantizing {}",
                values[i],
                first + i,
                info.ggml_type
            ),
        })),
    }
}

/// The tensor's bytes in `dtype`, HF row order (`permute_heads`: undo llama.cpp's RoPE
/// permutation over that many heads).
pub(crate) fn convert(
    gguf: &GgufFile,
    info: &TensorInfo,
    permute_heads: Option<usize>,
    dtype: OutputDtype,
) -> Result<Vec<u8>, BuilderError> {
    let n = info.n_elements() as usize;
    let mut out = Vec::with_capacity(n * dtype.dtype().size());
    if let Some(heads) = permute_heads {
        let values = gguf.dequantize(info)?;
        check_finite(gguf, info, &values, 0)?;
        let cols = info.dims.first().copied().unwrap_or(1) as usize;
        let rows = n / cols.max(1);
        let values = unpermute_rows(&values, rows, cols, heads);
        dtype.encode(&values, &mut out);
        return Ok(out);
    }
    // Whole blocks per chunk: rows of ne[0] elements (a multiple of the block size).
    let row = (info.dims.first().copied().unwrap_or(1) as usize).max(1);
    let chunk = (CHUNK_ELEMENTS / row).max(1) * row;
    let bytes_per_elem_block = info.ggml_type.type_size();
    let block = info.ggml_type.block_size();
    let data = gguf.tensor_data(info);
    let mut scratch = vec![0f32; chunk.min(n)];
    let mut done = 0;
    while done < n {
        let len = chunk.min(n - done);
        let from = done / block * bytes_per_elem_block;
        let to = (done + len) / block * bytes_per_elem_block;
        let values = &mut scratch[..len];
        dequantize(info.ggml_type, &data[from..to], values).map_err(|e| GgufError::Tensor {
            path: gguf.path().to_path_buf(),
            tensor: info.name.clone(),
            reason: e.to_string(),
        })?;
        check_finite(gguf, info, values, done)?;
        dtype.encode(values, &mut out);
        done += len;
    }
    Ok(out)
}
