//! Experiments on fp4forge, outside the production crates (which never import this one):
//!
//! - [`decode_bench`] (feature `cuda`): the CUDA decode benchmark, a real
//!   `Decoder<CudaBackend>` built from synthetic weights of a Laguna geometry, timing the
//!   production step (`fp4forge_engine::forward`, one sequence, one token);
//! - [`stream_probe`] (feature `cuda`): how close to the copy bandwidth a batch-1 decode step's
//!   byte stream can get in three kernel organisations;
//! - [`geometry`]: the shapes both read from a Laguna `config.json`;
//! - [`op_profile`]: any backend with every op timed (the `cpu_op_profile` example).
//!
//! Binaries: `cuda_decode_bench` (feature `cuda`). Examples: `decode_speed`,
//! `batch_decode_speed` and `cpu_op_profile` (the CPU backend on a checkpoint).

#[cfg(feature = "cuda")]
pub mod decode_bench;
pub mod geometry;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod op_profile;
#[cfg(feature = "cuda")]
pub mod stream_probe;
