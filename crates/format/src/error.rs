//! Errors of the NVFP4 numerics.

use thiserror::Error;

/// Why a tensor cannot be quantized or dequantized. Every variant names the tensor.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum NumericsError {
    /// The input dimension is not a multiple of the NVFP4 block size (16).
    #[error("tensor `{tensor}`: input dimension {cols} is not a multiple of 16")]
    NotBlockAligned {
        /// Tensor name.
        tensor: String,
        /// The offending input (last) dimension.
        cols: usize,
    },
    /// The tensor holds a NaN or an infinity.
    #[error("tensor `{tensor}`: non-finite value {value} at flat index {index} (row {row}, column {col})")]
    NonFinite {
        /// Tensor name.
        tensor: String,
        /// Flat (row-major) index of the first bad element.
        index: usize,
        /// Row of the first bad element.
        row: usize,
        /// Column of the first bad element.
        col: usize,
        /// The value found there.
        value: f32,
    },
    /// The byte buffer does not hold `rows × cols` elements of the stated dtype.
    #[error("tensor `{tensor}`: expected {expected} bytes for its shape and dtype, got {actual}")]
    ByteLength {
        /// Tensor name.
        tensor: String,
        /// Bytes the shape implies.
        expected: usize,
        /// Bytes given.
        actual: usize,
    },
    /// A fused group (one shared global scale) was empty or mixed source dtypes.
    #[error("fused group [{members}]: {reason}")]
    FusedGroup {
        /// Member tensor names, comma separated.
        members: String,
        /// What is wrong with the group.
        reason: String,
    },
}
