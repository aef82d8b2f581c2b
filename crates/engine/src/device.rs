//! Where a model runs, chosen by value: [`Device`] names a backend, [`open`] loads a checkpoint
//! onto it and hands the [`Model`] to the caller's [`WithModel`], whatever its backend type.
//!
//! This is the only place that matches a device to a backend type (and knows which backends
//! this build has), so the CLI and the server never name a backend: adding one is an arm here.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::model::{Model, ModelOptions};

/// Where the engine runs a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// The CPU backend ([`ModelOptions::threads`] worker threads).
    #[default]
    Cpu,
    /// The CUDA backend on the GPU of this ordinal (needs the `cuda` feature).
    Cuda(usize),
}

impl Device {
    /// The prefill chunk [`ModelOptions::prefill_chunk`] a user of this device gets unless they
    /// choose one: [`DEFAULT_PREFILL_CHUNK`](crate::DEFAULT_PREFILL_CHUNK) on the CPU,
    /// [`DEFAULT_PREFILL_CHUNK_GPU`](crate::DEFAULT_PREFILL_CHUNK_GPU) on a GPU.
    pub fn default_prefill_chunk(self) -> usize {
        match self {
            Device::Cpu => crate::model::DEFAULT_PREFILL_CHUNK,
            Device::Cuda(_) => crate::model::DEFAULT_PREFILL_CHUNK_GPU,
        }
    }

    /// Whether this build can run on it (CUDA needs the `cuda` feature).
    pub fn available(self) -> bool {
        match self {
            Device::Cpu => true,
            Device::Cuda(_) => cfg!(feature = "cuda"),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// A device name that is not `cpu`, `cuda` or `cuda:N`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown device '{0}': expected cpu or cuda[:N]")]
pub struct ParseDeviceError(pub String);

impl FromStr for Device {
    type Err = ParseDeviceError;

    /// `cpu`, `cuda` (GPU 0) or `cuda:N`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParseDeviceError(s.to_string());
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => {
                let n = t.strip_prefix("cuda:").ok_or_else(bad)?;
                if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                n.parse().map(Device::Cuda).map_err(|_| bad())
            }
        }
    }
}

/// What to do with a model once it is loaded, for any backend (a closure cannot be generic over
/// the backend type, so the caller implements this instead).
pub trait WithModel {
    /// What [`open`] returns.
    type Output;
    /// Uses the loaded model.
    fn with<B: Backend>(self, model: Model<B>) -> Self::Output;
}

/// Loads the checkpoint in `dir` onto `device` with `options` and hands the model to `user`.
/// Errors: [`EngineError::DeviceNotBuilt`] for a backend this build lacks,
/// [`EngineError::DeviceStart`] when the device cannot be started, and every load error.
pub fn open<W: WithModel>(
    device: Device,
    dir: &Path,
    options: ModelOptions,
    user: W,
) -> Result<W::Output> {
    match device {
        Device::Cpu => Ok(user.with(Model::load(dir, options)?)),
        #[cfg(feature = "cuda")]
        Device::Cuda(ordinal) => {
            let backend = crate::backend::CudaBackend::new(ordinal).map_err(|e| {
                EngineError::DeviceStart {
                    device,
                    source: Box::new(e),
                }
            })?;
            Ok(user.with(Model::load_with_backend(dir, options, backend)?))
        }
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => Err(EngineError::DeviceNotBuilt { device }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_prefills_in_larger_chunks() {
        assert_eq!(
            Device::Cpu.default_prefill_chunk(),
            crate::DEFAULT_PREFILL_CHUNK
        );
        assert_eq!(
            Device::Cuda(0).default_prefill_chunk(),
            crate::DEFAULT_PREFILL_CHUNK_GPU
        );
        const { assert!(crate::DEFAULT_PREFILL_CHUNK_GPU > crate::DEFAULT_PREFILL_CHUNK) };
    }

    #[test]
    fn device_names_parse_and_print() {
        assert_eq!("cpu".parse(), Ok(Device::Cpu));
        assert_eq!("CPU".parse(), Ok(Device::Cpu));
        assert_eq!("cuda".parse(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:0".parse(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(Device::Cuda(3)));
        for bad in [
            "", "gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:+1", "cuda0", "cpu:0",
        ] {
            let e = bad.parse::<Device>().unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("unknown device '{bad}': expected cpu or cuda[:N]")
            );
        }
        for d in [Device::Cpu, Device::Cuda(0), Device::Cuda(7)] {
            assert_eq!(d.to_string().parse(), Ok(d));
        }
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn a_backend_this_build_lacks_is_refused_by_name() {
        struct Never;
        impl WithModel for Never {
            type Output = ();
            fn with<B: Backend>(self, _: Model<B>) {}
        }
        let err = open(
            Device::Cuda(1),
            Path::new("/nonexistent"),
            ModelOptions::new(),
            Never,
        )
        .unwrap_err();
        assert!(matches!(err, EngineError::DeviceNotBuilt { .. }), "{err}");
        assert!(err.to_string().contains("cuda:1"), "{err}");
        assert!(err.to_string().contains("`cuda` feature"), "{err}");
    }
}
