//! How a model's weights become an [`crate::ir::Decoder`] (crate-private): the geometry comes
//! from `fp4forge_arch` (one [`fp4forge_arch::ArchSpec`], one file per family there); `loader`
//! finds the tensors it names and makes them resident through `load_ctx`. A new family needs no
//! code here.

pub(crate) mod load_ctx;
pub(crate) mod loader;

pub use fp4forge_arch::{Family, SUPPORTED_ARCHITECTURES};
