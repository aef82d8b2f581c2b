//! `config.json` look-ups for what is not geometry (token ids, `generation_config.json`): the
//! reader is [`fp4forge_arch::ConfigJson`], whose errors become [`EngineError`]s here. The
//! model's geometry is read by `fp4forge_arch` alone.

use fp4forge_arch::ArchError;

use crate::error::EngineError;

pub use fp4forge_arch::ConfigJson;

impl From<ArchError> for EngineError {
    fn from(e: ArchError) -> Self {
        match e {
            ArchError::Checkpoint(c) => EngineError::Checkpoint(c),
            ArchError::Field {
                file,
                field,
                reason,
            } => EngineError::Config {
                file,
                field,
                reason,
            },
            ArchError::UnsupportedArchitecture {
                file,
                found,
                supported,
            } => EngineError::UnsupportedArchitecture {
                file,
                found,
                supported,
            },
        }
    }
}
