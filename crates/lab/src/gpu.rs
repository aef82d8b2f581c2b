//! The device helpers of the lab's CUDA measurements: allocation, launches with programmatic
//! dependent launch, graph capture and timing, on the stream of a [`CudaBackend`] (so the lab's
//! own kernels and the backend's run in one order).

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    ValidAsZeroBits,
};
use fp4forge_engine::{Backend, CudaBackend, EngineError, Result};

/// A [`CudaBackend`]'s device, context and stream, for kernels the lab launches itself.
#[derive(Clone)]
pub struct Gpu {
    /// The backend (its stream is [`Gpu::stream`]).
    pub backend: CudaBackend,
    /// The backend's context.
    pub ctx: Arc<CudaContext>,
    /// The backend's stream.
    pub stream: Arc<CudaStream>,
    /// Streaming multiprocessors of the device.
    pub sms: usize,
    name: String,
}

impl Gpu {
    /// The device of `backend`.
    pub fn new(backend: &CudaBackend) -> Result<Self> {
        let stream = backend.cuda_stream().clone();
        let ctx = stream.context().clone();
        let name = backend.name();
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| EngineError::Backend {
                backend: name.clone(),
                reason: format!("SM count: {e:?}"),
            })? as usize;
        Ok(Self {
            backend: backend.clone(),
            ctx,
            stream,
            sms,
            name,
        })
    }

    /// An error of this device.
    pub fn err(&self, reason: impl Into<String>) -> EngineError {
        EngineError::Backend {
            backend: self.name.clone(),
            reason: reason.into(),
        }
    }

    /// The device address of `s`.
    pub fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        s.device_ptr(&self.stream).0
    }

    /// `n` zeroed elements (at least one).
    pub fn alloc<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> Result<CudaSlice<T>> {
        self.stream
            .alloc_zeros::<T>(n.max(1))
            .map_err(|e| self.err(format!("alloc of {n} elements: {e:?}")))
    }

    /// Waits for all queued work.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| self.err(format!("{e:?}")))
    }

    /// Launches `f` on the stream with programmatic stream serialization allowed
    /// ([`CudaBackend::launch_pdl`]).
    ///
    /// # Safety
    /// As [`CudaBackend::launch_pdl`]: `params` points at one value per kernel parameter, of the
    /// parameter's type, alive until this returns; the kernel waits (`griddepcontrol.wait`)
    /// before touching memory another kernel writes.
    pub unsafe fn launch_pdl(
        &self,
        f: &CudaFunction,
        cfg: cudarc::driver::LaunchConfig,
        params: &mut [*mut std::ffi::c_void],
    ) -> Result<()> {
        // SAFETY: the caller upholds `launch_pdl`'s contract, which this forwards unchanged.
        unsafe { self.backend.launch_pdl(f, cfg, params) }
    }

    /// Captures the work `record` queues on the stream into a CUDA graph (nothing runs while
    /// capturing) and instantiates it.
    pub fn capture_graph(&self, record: impl FnOnce() -> Result<()>) -> Result<CudaGraph> {
        use cudarc::driver::sys;
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| self.err(format!("capture: {e:?}")))?;
        let r = record();
        let graph = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(|e| self.err(format!("end capture: {e:?}")))?;
        r?;
        graph.ok_or_else(|| self.err("empty graph"))
    }

    /// Seconds per replay of `graph`: 5 warm-up replays, then the mean of `reps`.
    pub fn time_graph(&self, graph: &CudaGraph, reps: usize) -> Result<f64> {
        self.time_calls(5, reps, || {
            graph
                .launch()
                .map_err(|e| self.err(format!("graph launch: {e:?}")))
        })
    }

    /// Seconds per call of `step` (which queues work on the stream): `warmup` calls, then the
    /// mean over `reps` calls, synchronised before and after.
    pub fn time_calls(
        &self,
        warmup: usize,
        reps: usize,
        mut step: impl FnMut() -> Result<()>,
    ) -> Result<f64> {
        for _ in 0..warmup {
            step()?;
        }
        self.synchronize()?;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            step()?;
        }
        self.synchronize()?;
        Ok(t.elapsed().as_secs_f64() / reps.max(1) as f64)
    }

    /// Device-to-device copy bandwidth (bytes read + written per second, GB/s) of a `bytes`
    /// buffer: `reps` copies after one warm-up.
    pub fn copy_bandwidth(&self, bytes: usize, reps: usize) -> Result<f64> {
        let src = self.alloc::<u8>(bytes)?;
        let mut dst = self.alloc::<u8>(bytes)?;
        let secs = self.time_calls(1, reps, || {
            self.stream
                .memcpy_dtod(&src, &mut dst)
                .map_err(|e| self.err(format!("{e:?}")))
        })?;
        Ok(2.0 * bytes as f64 / secs / 1e9)
    }
}
