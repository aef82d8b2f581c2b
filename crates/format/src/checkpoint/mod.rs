//! Reading checkpoints: safetensors files (memory-mapped, headers validated), shard indexes and
//! checkpoint directories. Every failure is a typed [`CheckpointError`] naming the file and the
//! tensor; no input, however malformed, makes these readers panic.

mod dir;
mod dtype;
mod error;
mod file;
mod header;
mod index;

pub use dir::{Checkpoint, TensorEntry, CONFIG_FILE_NAME};
pub use dtype::{Dtype, UnknownDtype};
pub use error::CheckpointError;
pub use file::{LoadFormat, SafetensorsFile};
pub use header::{SafetensorsHeader, TensorInfo, MAX_HEADER_LEN};
pub use index::{ShardIndex, INDEX_FILE_NAME, SINGLE_FILE_NAME};
