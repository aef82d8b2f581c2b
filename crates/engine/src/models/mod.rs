//! How a model's weights become a `decoder::Decoder` (crate-private): the geometry comes from
//! `fp4forge_arch` (one [`fp4forge_arch::ArchSpec`], one file per family there); `loader` finds
//! the tensors it names and makes them resident. A new family needs no code here.

pub(crate) mod decoder;
pub(crate) mod loader;

pub use fp4forge_arch::{Family, SUPPORTED_ARCHITECTURES};
