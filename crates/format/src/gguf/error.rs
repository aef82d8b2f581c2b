//! Errors of GGUF reading and dequantization. Every variant names the file, and the metadata key
//! or tensor when there is one.

use std::path::PathBuf;

use thiserror::Error;

use super::GgmlType;

/// Why a GGUF file could not be read, or one of its values or tensors could not be used.
#[derive(Debug, Error)]
pub enum GgufError {
    /// An operating-system I/O call failed on `path`.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The fixed header or the layout of the file is malformed (magic, version, counts,
    /// truncation), at byte `offset`.
    #[error("{}: invalid GGUF at byte {offset}: {reason}", path.display())]
    Header {
        /// The file.
        path: PathBuf,
        /// Byte offset where the problem was found.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A metadata key/value pair is malformed, missing, or of a type the caller cannot use.
    #[error("{}: metadata `{key}`: {reason}", path.display())]
    Metadata {
        /// The file.
        path: PathBuf,
        /// The metadata key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A tensor's info or data is malformed or cannot be dequantized.
    #[error("{}: tensor `{tensor}`: {reason}", path.display())]
    Tensor {
        /// The file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
}

/// Why a buffer of ggml blocks could not be dequantized.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DequantError {
    /// The element type has a known layout but no dequantizer here.
    #[error("dequantizing {0} is not supported (supported: {list})", list = GgmlType::dequantizable_list())]
    Unsupported(GgmlType),
    /// The element count is not a whole number of blocks.
    #[error("{elements} elements is not a multiple of the {ty} block size {block}")]
    NotBlockAligned {
        /// The element type.
        ty: GgmlType,
        /// Elements requested.
        elements: usize,
        /// Elements per block.
        block: usize,
    },
    /// The byte buffer does not hold exactly the blocks the element count implies.
    #[error("{ty}: {elements} elements take {expected} bytes, got {actual}")]
    ByteLength {
        /// The element type.
        ty: GgmlType,
        /// Elements requested.
        elements: usize,
        /// Bytes the element count implies.
        expected: usize,
        /// Bytes given.
        actual: usize,
    },
}
