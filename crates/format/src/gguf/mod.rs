//! GGUF, llama.cpp's single-file model format: reading, and dequantizing ggml blocks to `f32`.
//!
//! # Layout (version 3, little-endian)
//!
//! ```text
//! "GGUF" u32 version  u64 n_tensors  u64 n_kv
//! n_kv ×      string key, u32 value type, value     (string = u64 len + UTF-8;
//!                                                    array = u32 elem type + u64 count + elems)
//! n_tensors × string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset
//! padding to `general.alignment` (default 32)       <- data section starts here
//! tensor data, each at data start + offset (offsets aligned)
//! ```
//!
//! ggml dimensions are stored **innermost first**: `ne[0]` is the contiguous row length. A
//! Linear weight `[out, in]` in PyTorch is `ne = [in, out]` here; [`TensorInfo::shape`] gives
//! the PyTorch order. Quantized types pack `ne[0]` in blocks of 32 or 256 elements
//! ([`GgmlType::block_size`]); [`dequantize`] unpacks them exactly as ggml does.
//!
//! [`GgufFile::open`] memory-maps the file and validates the whole header before anything else;
//! bad input gives a [`GgufError`] naming the file and the key or tensor, never a panic.

mod error;
mod quants;
mod reader;
mod types;
mod value;
mod writer;

pub use error::{DequantError, GgufError};
pub use quants::{dequantize, dequantize_to_vec};
pub use reader::{
    GgufFile, GgufHeader, TensorInfo, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS,
};
pub use types::{GgmlType, ValueType};
pub use value::{MetadataArray, MetadataValue};
pub use writer::GgufWriter;
