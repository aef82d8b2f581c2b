//! The CUDA backend (feature `cuda`): weights resident in GPU memory exactly as stored (packed
//! NVFP4 stays packed: 4-bit codes, fp8 block scales, one f32 global scale per tensor, dequantized
//! in registers inside the GEMV), f32 activations, a paged bf16 (or fp8, f32) KV cache: blocks
//! of 64 positions from one device pool behind a block table per layer (`kv_pool`), capped by
//! [`Backend::limit_kv_memory`], shared between forked sessions.
//!
//! The CUDA driver and NVRTC are loaded at run time (`cudarc` with dynamic loading), so a binary
//! built without CUDA runs unchanged on a GPU machine; the kernels (`kernels/*.cu`, one source) are
//! compiled by NVRTC for the device's architecture to device code (CUBIN), once per machine: kept
//! in the kernel cache (`CudaOptions::kernel_cache`) for later starts.
//!
//! Every op is one to three kernel launches on one stream; nothing synchronises with the host
//! except [`Backend::download`] and [`Backend::sample`]. Decode GEMVs (one token) run NVFP4 on
//! tensor cores where K % 128 == 0 (sm_89+), one token's MoE on persistent blocks. Linears of 2+
//! rows (prefill, batched steps; sm_80+) run on tensor cores (`gemm_mma`, K split across blocks
//! when the tokens are few, 8-token column groups past the last token skipped); prefill's routed
//! experts (16+ rows) grouped by expert on the same core, and its attention over bf16 or fp8
//! caches in a flash-attention kernel. A decode step of the model path, one sequence or several
//! over bf16 or fp8 caches, runs on the fused launch sequence of `decode.rs` (fixed buffers; one
//! sequence: q/k/v/gate in one launch, norms fused into neighbouring kernels, persistent MoE;
//! several: one launch per linear over all rows, every sequence's attention in one
//! `attn_dec_batch` launch), norms/rope/append inside attention; each sequence's next token is
//! sampled on the device (`sample_logits`, all sequences of a step in one launch and one
//! download). The decode benchmark and the stream probe live in the `fp4forge-lab` crate.
//!
//! Modules: `options` (every knob: [`CudaOptions`], the `FP4FORGE_*` variables), `compile` (the
//! kernel source, NVRTC), `ops` (one `kernels!` table per `.cu` file: the function tables, the
//! kernel names and a typed launcher per kernel over `DevPtr`s), `kv_pool` (the KV blocks' device
//! memory), `linear` (GEMVs, several linears in one launch, fused epilogues), `attention` (the KV
//! cache's block tables, decode and prefill attention),
//! `moe` (expert arenas, routing, the expert kernels), `decode` (the fused decode step).
//!
//! Not yet: CUDA-graph capture of the model path's step (it launches eagerly; in the former
//! graph-replay benchmark eager was 1-2% slower: 4.45 vs 4.39 ms at Laguna-S lean 2K).

mod compile;
mod decode;
mod kv_pool;
mod ops;
mod options;

use compile::*;
pub use compile::{
    compile_kernels, kernel_entries, kernel_resources, CompiledKernels, KernelResources, KERNELS_CU,
};
use kv_pool::{KvBlock, KvPool, KV_BLOCK};
pub use ops::attention::{CudaKvLayer, CudaRope};
pub use ops::moe::{CudaExperts, CudaRouting, ExpertArena};
use ops::prefill::{
    EXPERTS_H16_ITEMS, EXPERTS_H16_SMEM, GEMM_H16_FEW_TOKENS, GEMM_H16_ROWS, GEMM_H16_SMEM,
    GEMM_H16_TOKENS, GEMM_MMA_ROWS, GEMM_MMA_TOKENS,
};
use ops::sampling::{SAMPLE_THREADS, SORTED_SCRATCH_BYTES};
use ops::{attention::*, gemv::*, moe::*, DevPtr, Funcs};
pub use options::CudaOptions;

use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
};
use cudarc::nvrtc::Ptx;

use super::{
    AttentionParams, AttnChunk, Backend, HeadNorms, LogprobRequest, Resident, RouterParams,
    RouterScoring, SampleRequest,
};
use crate::error::{EngineError, Result};
use crate::ir::{Decoder, KvDtype, KvLayerSpec, SeqChunk};
use crate::logprobs::TokenLogprob;
use crate::rope::RopeSpec;
use crate::weights::{ExpertWeights, LinearWeight};

/// Device memory [`CudaBackend::limit_kv_memory`] keeps out of the KV caches' cap for the
/// activations and scratch of the forward passes (prefill chunks of a few thousand tokens, the
/// MoE's grouped buffers, attention split partials).
pub const ACTIVATION_RESERVE: usize = 2 << 30;

pub(crate) struct Inner {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub f: Funcs,
    #[allow(dead_code)]
    module: Arc<CudaModule>,
    pub name: String,
    pub sms: usize,
    /// The device's L2 cache in bytes (0: unknown; `CudaOptions::l2_prefetch_rows` sizes what it
    /// prefetches by it).
    pub l2_bytes: usize,
    /// Launch with programmatic dependent launch (sm_90+, unless `CudaOptions::pdl` is off): a
    /// kernel's blocks start while its predecessor drains and wait for its results in
    /// `pdl_enter()` (kernels/common.cu), hiding launch and ramp-up between the small kernels of a step.
    pub pdl: bool,
    /// Decode GEMVs of NVFP4 weights with K % 128 == 0 on tensor cores (`gemv_mma` and the
    /// `mma` paths of `linear_multi2` / `experts_*`): sm_89+ (fp8 conversions), unless
    /// `CudaOptions::mma` is off.
    pub mma: bool,
    /// bf16 mma, ldmatrix and cp.async (sm_80+): the multi-token kernels on tensor cores
    /// (`gemm_mma`, the grouped experts, the prefill attention `attn_flash_*`; each also behind
    /// its own `CudaOptions` knob).
    pub sm80: bool,
    /// `gemm_h16` and the grouped experts on its core (`experts_*_h16`) can run here: tensor
    /// cores on (`mma`) and their dynamic shared memory ([`GEMM_H16_SMEM`],
    /// [`EXPERTS_H16_SMEM`]) granted (sm_90: 227 KiB a block; not sm_89's 99 KiB).
    pub h16_gemm: bool,
    /// `gemv_mt_wide` can run here: tensor cores on (`mma`) and its dynamic shared memory
    /// ([`MT_WIDE_SMEM`]) granted.
    pub mt_wide: bool,
    /// Completion counter of the fused epilogues (`Epi` in kernels/common.cu).
    counters: CudaSlice<u32>,
    /// The tickets of the launches whose last block adds their K splits: `gemv_mt_wide`'s, one
    /// a row block, and `gemm_mma`'s / `gemm_h16`'s, one a tile (`CudaOptions::splitk_last`);
    /// zero between launches (each launch's last block of a row block or tile resets its own).
    pub split_tickets: CudaSlice<u32>,
    /// The knobs (`CudaOptions::from_env` unless opened `with_options`); `pdl` and `mma` above
    /// are fixed when the backend opens, the rest is read at each use.
    options: RwLock<CudaOptions>,
    /// The fused step's activation buffers (one step at a time).
    decode: Mutex<Option<decode::DecodeBuffers>>,
    /// Tokens decoded on the fused step so far.
    fused_steps: std::sync::atomic::AtomicUsize,
    /// MoE sums that also ran the next norm (`experts_reduce_norm_stage`) so far.
    sums_with_norm: std::sync::atomic::AtomicUsize,
    /// Routers whose top-k ran as their launch's tail (`gemv_mt_bf16_topk`) so far.
    routed_in_router: std::sync::atomic::AtomicUsize,
    /// One input's NVFP4 and bf16 linears run in one launch (`gemv_mt_mixed4`,
    /// `gemv_mt_mixed8`) so far.
    mixed_linears: std::sync::atomic::AtomicUsize,
    /// Routers that ran their shared expert's gate and up in their launch so far.
    shared_in_router: std::sync::atomic::AtomicUsize,
    /// `gemv_mt` launches on a deep variant (`gemv_mt_nv4_deep`, `gemv_mt_nv_deep`) so far.
    deep_linears: std::sync::atomic::AtomicUsize,
    /// `gemv_mt` launches on `gemv_mt_wide` so far.
    wide_linears: std::sync::atomic::AtomicUsize,
    /// `gemm_h16` launches on `gemm_h16_t32` (a few tokens) so far.
    few_h16_linears: std::sync::atomic::AtomicUsize,
    /// K-split `gemm_mma` / `gemm_h16` launches whose tiles' last blocks added the splits so far.
    splitk_last_launches: std::sync::atomic::AtomicUsize,
    /// Inputs of batched steps' experts staged by the kernel that produced them so far (the
    /// routed experts' by the norm, the shared expert's down projection's on `gemv_mt` by
    /// `silu_mul_stage`).
    moe_inputs_staged: std::sync::atomic::AtomicUsize,
    /// Per-item experts' launches on their tensor-core-only kernels so far.
    tc_item_launches: std::sync::atomic::AtomicUsize,
    /// Few-items-per-tile experts' launches at three blocks a SM so far.
    few_b3_launches: std::sync::atomic::AtomicUsize,
    /// Few-items-per-tile experts' launches on tiles of 8 items so far.
    few_tile8_launches: std::sync::atomic::AtomicUsize,
    /// Routers whose top-k tail also grouped the items by expert so far.
    grouped_in_router: std::sync::atomic::AtomicUsize,
    /// MoE calls whose shared expert ran on `gemv_mt` beside per-item routed experts so far.
    shared_on_mt: std::sync::atomic::AtomicUsize,
    /// Batched steps' MoE layers whose input norm ran in the router's launch (`routers_with_norm`).
    routers_with_norm: std::sync::atomic::AtomicUsize,
    /// Sequences attended in `attn_dec_batch` launches (`CudaBackend::batched_attention_rows`).
    batched_attention_rows: std::sync::atomic::AtomicUsize,
    /// Of those, sequences attended on the `_g8` kernels (`CudaBackend::g8_attention_rows`).
    g8_attention_rows: std::sync::atomic::AtomicUsize,
    /// Of those, sequences attended on the tensor-core kernels
    /// (`CudaBackend::mma_attention_rows`).
    mma_attention_rows: std::sync::atomic::AtomicUsize,
    /// Linears run in `gemm_mma_segs` launches (`CudaBackend::merged_bf16_linears`).
    merged_bf16_linears: std::sync::atomic::AtomicUsize,
    /// The blocks of every KV cache.
    kv_pool: KvPool,
}

/// The CUDA backend on one device. Cheap to clone.
#[derive(Clone)]
pub struct CudaBackend {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBackend({})", self.inner.name)
    }
}

fn backend_err(reason: impl Into<String>) -> EngineError {
    EngineError::Backend {
        backend: "cuda".into(),
        reason: reason.into(),
    }
}

impl CudaBackend {
    /// Opens device `ordinal` with the options of the environment
    /// ([`CudaOptions::from_env`]), compiles the kernels for it (NVRTC) and creates a stream.
    pub fn new(ordinal: usize) -> Result<Self> {
        Self::with_options(ordinal, CudaOptions::from_env())
    }

    /// Opens device `ordinal` with `options` (the environment is not read), compiles the kernels
    /// for it (NVRTC) and creates a stream.
    pub fn with_options(ordinal: usize, options: CudaOptions) -> Result<Self> {
        // (cudarc panics on the first driver call where the library cannot be loaded)
        // SAFETY: loading the library is the whole check.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(backend_err(
                "the CUDA driver library (libcuda.so.1) cannot be loaded: this machine has no \
                 NVIDIA driver, or its directory is not on LD_LIBRARY_PATH",
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| backend_err(format!("{e:?}")))?;
        // One stream, ordered: no per-buffer events needed.
        // SAFETY: every op runs on `stream`; buffers are never shared across streams.
        unsafe { ctx.disable_event_tracking() };
        let (maj, min) = ctx
            .compute_capability()
            .map_err(|e| backend_err(format!("{e:?}")))?;
        let arch: &'static str = Box::leak(format!("sm_{maj}{min}").into_boxed_str());
        let ptx = module_for(
            arch,
            options.kernels_source.as_deref(),
            options.kernel_cache.as_deref(),
        )
        .map_err(backend_err)?;
        let module = ctx
            .load_module(ptx)
            .map_err(|e| backend_err(format!("load module: {e:?}")))?;
        let f = Funcs::load(&mut |n: &str| {
            module
                .load_function(n)
                .map_err(|e| backend_err(format!("kernel {n}: {e:?}")))
        })?;
        let stream = ctx
            .new_stream()
            .map_err(|e| backend_err(format!("{e:?}")))?;
        let dev_name = ctx.name().unwrap_or_default();
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .unwrap_or(100) as usize;
        let l2_bytes = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
            .map_or(0, |v| v.max(0) as usize);
        let mma = (maj, min) >= (8, 9) && options.mma;
        // (a device that cannot give them their shared memory keeps gemm_mma and the grouped
        // experts' mma kernels for prompts)
        let h16_gemm = mma
            && [
                (&f.prefill.gemm_h16[0], GEMM_H16_SMEM),
                (&f.prefill.gemm_h16[1], GEMM_H16_SMEM),
                (&f.prefill.gemm_h16[2], GEMM_H16_SMEM),
                (&f.moe.experts_gate_up_h16[0], EXPERTS_H16_SMEM),
                (&f.moe.experts_down_h16[0], EXPERTS_H16_SMEM),
            ]
            .iter()
            .all(|(k, bytes)| {
                k.set_attribute(
                    cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    *bytes as i32,
                )
                .is_ok()
            });
        let mt_wide = mma
            && f.gemv.gemv_mt_wide[0]
                .set_attribute(
                    cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    MT_WIDE_SMEM as i32,
                )
                .is_ok();
        let counters = stream
            .alloc_zeros::<u32>(1)
            .map_err(|e| backend_err(format!("{e:?}")))?;
        let split_tickets = stream
            .alloc_zeros::<u32>(SPLIT_TICKETS)
            .map_err(|e| backend_err(format!("{e:?}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                counters,
                split_tickets,
                decode: Mutex::new(None),
                fused_steps: std::sync::atomic::AtomicUsize::new(0),
                sums_with_norm: std::sync::atomic::AtomicUsize::new(0),
                routed_in_router: std::sync::atomic::AtomicUsize::new(0),
                mixed_linears: std::sync::atomic::AtomicUsize::new(0),
                shared_in_router: std::sync::atomic::AtomicUsize::new(0),
                deep_linears: std::sync::atomic::AtomicUsize::new(0),
                wide_linears: std::sync::atomic::AtomicUsize::new(0),
                few_h16_linears: std::sync::atomic::AtomicUsize::new(0),
                splitk_last_launches: std::sync::atomic::AtomicUsize::new(0),
                moe_inputs_staged: std::sync::atomic::AtomicUsize::new(0),
                tc_item_launches: std::sync::atomic::AtomicUsize::new(0),
                few_b3_launches: std::sync::atomic::AtomicUsize::new(0),
                few_tile8_launches: std::sync::atomic::AtomicUsize::new(0),
                shared_on_mt: std::sync::atomic::AtomicUsize::new(0),
                routers_with_norm: std::sync::atomic::AtomicUsize::new(0),
                grouped_in_router: std::sync::atomic::AtomicUsize::new(0),
                batched_attention_rows: std::sync::atomic::AtomicUsize::new(0),
                g8_attention_rows: std::sync::atomic::AtomicUsize::new(0),
                mma_attention_rows: std::sync::atomic::AtomicUsize::new(0),
                merged_bf16_linears: std::sync::atomic::AtomicUsize::new(0),
                kv_pool: KvPool::default(),
                ctx,
                stream,
                f,
                module,
                name: format!("cuda:{ordinal} ({dev_name}, {arch})"),
                sms,
                l2_bytes,
                pdl: maj >= 9 && options.pdl,
                mma,
                sm80: maj >= 8,
                h16_gemm,
                mt_wide,
                options: RwLock::new(options),
            }),
        })
    }

    /// The backend's knobs as they are now.
    pub fn options(&self) -> CudaOptions {
        self.opts().clone()
    }

    /// Replaces the backend's knobs from the next launch on (benchmarks and tests:
    /// `kernels_source`, `pdl` and `mma` keep the values the backend was opened with).
    pub fn set_options(&self, options: CudaOptions) {
        *self
            .inner
            .options
            .write()
            .unwrap_or_else(|e| e.into_inner()) = options;
    }

    /// Switches the model path's fused decode step on or off (`CudaOptions::fused_decode`: on
    /// by default, `FP4FORGE_CUDA_FUSED_DECODE=0` starts it off), e.g. to compare it with the
    /// generic ops.
    pub fn set_fused_decode(&self, on: bool) {
        let mut o = self.options();
        o.fused_decode = on;
        self.set_options(o);
    }

    /// The knobs, read in place.
    pub(crate) fn opts(&self) -> RwLockReadGuard<'_, CudaOptions> {
        self.inner.options.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Launches `f` on the backend's stream with programmatic stream serialization allowed (the
    /// backend's own launches, and `crates/lab`'s kernels on the same stream).
    ///
    /// # Safety
    /// `params` points at one value per kernel parameter, of the parameter's type, alive until
    /// this returns; the kernel calls `pdl_enter()` (`griddepcontrol.wait`) before touching
    /// memory another kernel writes.
    pub unsafe fn launch_pdl(
        &self,
        f: &CudaFunction,
        cfg: cudarc::driver::LaunchConfig,
        params: &mut [*mut std::ffi::c_void],
    ) -> Result<()> {
        use cudarc::driver::sys;
        // SAFETY: plain C structs; zero is a valid start for both.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.inner.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        self.inner
            .ctx
            .bind_to_thread()
            .map_err(|e| self.err(format!("bind: {e:?}")))?;
        // SAFETY: the caller's contract; `config` and `attr` outlive the call.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(|e| self.err(format!("launch: {e:?}")))
    }

    pub(crate) fn err(&self, reason: impl Into<String>) -> EngineError {
        EngineError::Backend {
            backend: self.inner.name.clone(),
            reason: reason.into(),
        }
    }

    fn check(&self, ok: bool, what: impl FnOnce() -> String) -> Result<()> {
        if ok {
            Ok(())
        } else {
            Err(self.err(what()))
        }
    }

    /// Whether `gemm_h16` (and the grouped experts on its core) can run on this device: tensor
    /// cores and their shared memory (sm_90).
    pub fn h16_gemm_runs(&self) -> bool {
        self.inner.h16_gemm
    }

    /// The device's streaming multiprocessors (what the launch geometries fill).
    pub fn sm_count(&self) -> usize {
        self.inner.sms
    }

    /// Waits for all queued work.
    pub fn synchronize(&self) -> Result<()> {
        self.inner
            .stream
            .synchronize()
            .map_err(|e| self.err(format!("{e:?}")))
    }

    /// The stream every op of this backend runs on (its context: `stream.context()`), for
    /// experiments outside the engine (`fp4forge-lab`'s stream probe) that launch their own
    /// kernels next to the backend's.
    pub fn cuda_stream(&self) -> &Arc<CudaStream> {
        &self.inner.stream
    }

    /// For benchmarks: makes `layer` hold `len` positions without a prefill. The store grows to
    /// room for `len + 1` positions (a sliding layer: its window), every slot is filled with
    /// seeded synthetic values, and its length is set to `len`; the next append goes at
    /// position `len`. What attention then reads is those values, not any token's keys.
    pub fn kv_assume_filled(&self, layer: &mut CudaKvLayer, len: usize) -> Result<()> {
        self.kv_grow(layer, len + 1)?;
        // bf16 values, fp8 bytes that are never NaN, f32 values (see `fill` in sampling.cu)
        let (mode, elem) = match layer.kv_t {
            2 => (1, 2),
            1 => (2, 1),
            _ => (3, 4),
        };
        let n = layer.block_bytes() / elem;
        for (i, b) in layer.blocks.iter().enumerate() {
            self.fill(DevPtr::<u8>::new(b.addr), n, 0x6b76 + i as u64, mode, 1.0)?;
        }
        layer.len = len;
        Ok(())
    }

    /// Caps the device memory of all KV caches at `bytes` (`None`: no cap; memory already
    /// taken stays). A cache that would grow past it fails with an error that says so.
    pub fn set_kv_budget(&self, bytes: Option<usize>) {
        self.inner.kv_pool.set_budget(bytes);
    }

    /// Caps the KV caches at what is left of `fraction` of the device's memory after what is in
    /// use now (the weights, the runtime; by any process) and [`ACTIVATION_RESERVE`] for the
    /// passes' activations; returns the cap. Errors when nothing is left.
    fn limit_kv_to_fraction(&self, fraction: f64) -> Result<usize> {
        let (free, total) = self.memory_info()?;
        let allowed = (total as f64 * fraction) as usize;
        let in_use = total - free;
        let cap = allowed
            .saturating_sub(in_use)
            .saturating_sub(ACTIVATION_RESERVE);
        self.check(cap > 0, || {
            format!(
                "gpu_memory_utilization {fraction}: {allowed} of {total} bytes allowed, {in_use} \
                 in use after loading and {ACTIVATION_RESERVE} kept for activations leave nothing \
                 for the KV cache"
            )
        })?;
        self.set_kv_budget(Some(cap));
        Ok(cap)
    }

    /// The device's free and total memory, bytes.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.inner
            .ctx
            .bind_to_thread()
            .map_err(|e| self.err(format!("{e:?}")))?;
        cudarc::driver::result::mem_get_info().map_err(|e| self.err(format!("{e:?}")))
    }

    /// The device address of `s`.
    pub(crate) fn ptr<T>(&self, s: &CudaSlice<T>) -> DevPtr<T> {
        DevPtr::new(s.device_ptr(&self.inner.stream).0)
    }

    pub(crate) fn alloc<T: DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<T>> {
        self.inner
            .stream
            .alloc_zeros::<T>(n.max(1))
            .map_err(|e| self.err(format!("alloc of {n} elements: {e:?}")))
    }

    fn upload_bytes(&self, b: &[u8]) -> Result<CudaSlice<u8>> {
        if b.is_empty() {
            return self.alloc(1);
        }
        self.inner
            .stream
            .clone_htod(b)
            .map_err(|e| self.err(format!("upload: {e:?}")))
    }

    /// `n` values of device memory (f32, u32, i32: plain numbers), not zeroed (no memset
    /// launch), for a buffer its kernel writes whole before anything reads it.
    pub(crate) fn alloc_unset<T: DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<T>> {
        // SAFETY: the plain numeric types this is used with have no invalid bit patterns, and
        // the caller's kernel writes every element before it is read.
        unsafe { self.inner.stream.alloc::<T>(n.max(1)) }
            .map_err(|e| self.err(format!("alloc of {n} elements: {e:?}")))
    }

    /// A tensor for an op's output, not zeroed: every op that makes one writes all of its
    /// elements before anything reads them.
    fn tensor(&self, rows: usize, cols: usize) -> Result<CudaTensor> {
        Ok(CudaTensor {
            buf: self.alloc_unset(rows * cols)?,
            rows,
            cols,
        })
    }

    /// Fills `n` elements at `ptr` with seeded synthetic values (see `fill` in kernels/sampling.cu).
    pub(crate) fn fill<T>(
        &self,
        ptr: DevPtr<T>,
        n: usize,
        seed: u64,
        mode: i32,
        amp: f32,
    ) -> Result<()> {
        let blocks = (n.div_ceil(256)).min(65536) as u32;
        ops::sampling::FillArgs {
            p: ptr.cast(),
            n: n as i64,
            seed,
            mode,
            amp,
        }
        .launch(self, (blocks.max(1), 1, 1), (256, 1, 1))
    }
}

/// Largest top-k `sample_logits` samples (`SAMPLE_K_MAX`); top-k 0 (every candidate) and
/// beyond run on `sample_sorted`.
const SAMPLE_K_MAX: usize = 256;

/// Most alternatives per row the device scores (one pass over the row each); beyond it the host
/// does (OpenAI and vLLM allow 20).
const LOGPROB_TOP_MAX: usize = 64;

/// An activation matrix `[rows, cols]` of f32 in device memory.
pub struct CudaTensor {
    pub(crate) buf: CudaSlice<f32>,
    rows: usize,
    cols: usize,
}

/// A resident linear weight, in its stored encoding.
pub struct CudaLinear {
    pub(crate) fmt: i32,
    pub(crate) data: CudaSlice<u8>,
    pub(crate) scales: Option<CudaSlice<u8>>,
    pub(crate) inv_g: f32,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    name: String,
}

impl CudaLinear {
    /// The block scales' address (null: not NVFP4).
    pub(crate) fn scales_ptr(&self, b: &CudaBackend) -> DevPtr<u8> {
        self.scales.as_ref().map_or(DevPtr::NULL, |s| b.ptr(s))
    }

    /// Bytes resident on the device.
    pub fn bytes(&self) -> usize {
        self.data.len() + self.scales.as_ref().map_or(0, |s| s.len())
    }
}

fn fmt_of(w: &LinearWeight) -> i32 {
    match w {
        LinearWeight::F32 { .. } => 0,
        LinearWeight::F16 { .. } => 1,
        LinearWeight::Bf16 { .. } => 2,
        LinearWeight::Nvfp4 { .. } => 3,
    }
}

impl Resident for CudaBackend {
    type Tensor = CudaTensor;
    type Linear = CudaLinear;
    type Experts = CudaExperts;
    type Rope = CudaRope;
    type KvLayer = CudaKvLayer;
    type Routing = CudaRouting;
}

impl Backend for CudaBackend {
    fn name(&self) -> String {
        self.inner.name.clone()
    }

    fn execute<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        // The context is current on whichever thread runs the pass.
        let _ = self.inner.ctx.bind_to_thread();
        f()
    }

    fn load_linear(&self, name: &str, weight: LinearWeight) -> Result<CudaLinear> {
        let (rows, cols) = (weight.rows(), weight.cols());
        let fmt = fmt_of(&weight);
        let (data, scales, inv_g) = match &weight {
            LinearWeight::Bf16 { data, .. }
            | LinearWeight::F16 { data, .. }
            | LinearWeight::F32 { data, .. } => (self.upload_bytes(data.as_slice())?, None, 1.0),
            LinearWeight::Nvfp4 {
                packed,
                scales,
                global_scale,
                ..
            } => {
                self.check(cols.is_multiple_of(16), || {
                    format!("`{name}`: {cols} columns")
                })?;
                (
                    self.upload_bytes(packed.as_slice())?,
                    Some(self.upload_bytes(scales.as_slice())?),
                    1.0 / global_scale,
                )
            }
        };
        Ok(CudaLinear {
            fmt,
            data,
            scales,
            inv_g,
            rows,
            cols,
            name: name.to_owned(),
        })
    }

    fn load_experts(&self, name: &str, experts: Vec<ExpertWeights>) -> Result<CudaExperts> {
        self.check(!experts.is_empty(), || format!("`{name}`: no experts"))?;
        let gate = self.arena(name, &experts.iter().map(|e| &e.gate).collect::<Vec<_>>())?;
        let up = self.arena(name, &experts.iter().map(|e| &e.up).collect::<Vec<_>>())?;
        let down = self.arena(name, &experts.iter().map(|e| &e.down).collect::<Vec<_>>())?;
        Ok(CudaExperts {
            gate,
            up,
            down,
            n: experts.len(),
            inter: experts[0].gate.rows(),
            hidden: experts[0].gate.cols(),
        })
    }

    fn load_rope(&self, rope: &RopeSpec) -> Result<CudaRope> {
        Ok(CudaRope {
            inv_freq: self
                .inner
                .stream
                .clone_htod(&rope.inv_freq)
                .map_err(|e| self.err(format!("{e:?}")))?,
            rotary_dim: rope.rotary_dim,
            attention_factor: rope.attention_factor,
        })
    }

    fn new_kv_layer(&self, spec: &KvLayerSpec) -> Result<CudaKvLayer> {
        let kv_t = match spec.dtype {
            KvDtype::F32 => 0,
            KvDtype::Fp8E4m3 => 1,
            KvDtype::Bf16 => 2,
        };
        // as the CPU cache: scales only for fp8, and a missing or bad one is 1
        let scale = |s: f32| {
            if kv_t == 1 && s.is_finite() && s > 0.0 {
                s
            } else {
                1.0
            }
        };
        self.check(
            spec.head_dim.is_multiple_of(8) && spec.head_dim <= 128,
            || format!("head_dim {}", spec.head_dim),
        )?;
        Ok(CudaKvLayer {
            spec: spec.clone(),
            len: 0,
            blocks: Vec::new(),
            table: self.alloc(1)?,
            kv_t,
            k_scale: scale(spec.k_scale),
            v_scale: scale(spec.v_scale),
        })
    }

    fn kv_layer_bytes(&self, layer: &CudaKvLayer) -> usize {
        layer.blocks.len() * layer.block_bytes()
    }

    fn kv_growth_bytes(&self, layer: &CudaKvLayer, positions: usize) -> usize {
        layer
            .blocks_for(positions)
            .saturating_sub(layer.blocks.len())
            * layer.block_bytes()
    }

    fn kv_memory(&self) -> super::KvMemory {
        let u = self.inner.kv_pool.usage();
        super::KvMemory {
            used: u.used,
            capacity: u.budget,
            available: u.budget.map(|cap| {
                cap.saturating_sub(u.used)
                    .min(cap.saturating_sub(u.held) + u.free)
            }),
        }
    }

    fn limit_kv_memory(&self, limit: super::KvLimit) -> Result<usize> {
        match limit {
            super::KvLimit::Bytes(b) => {
                self.set_kv_budget(Some(b));
                Ok(b)
            }
            super::KvLimit::DeviceFraction(f) => self.limit_kv_to_fraction(f),
        }
    }

    fn kv_fork(&self, layer: &CudaKvLayer, len: usize) -> Result<CudaKvLayer> {
        self.check(layer.spec.can_fork(layer.len, len), || {
            format!(
                "KV copy of {len} positions of a layer holding {}",
                layer.len
            )
        })?;
        let mut out = self.new_kv_layer(&layer.spec)?;
        // Full layers share the blocks wholly below `len` (never written again: appends go to
        // later positions); the partial last block, and a sliding layer's ring (written again
        // as the sequence wraps), are copied.
        let need = out.blocks_for(len);
        let shared = if layer.spec.window.is_none() {
            len / KV_BLOCK
        } else {
            0
        };
        let bytes = layer.block_bytes();
        let copied = layer.blocks.get(shared..need).ok_or_else(|| {
            self.err(format!(
                "KV copy of {len} positions of a layer of {} blocks",
                layer.blocks.len()
            ))
        })?;
        let mut blocks: Vec<Arc<KvBlock>> = layer.blocks[..shared].to_vec();
        self.inner
            .ctx
            .bind_to_thread()
            .map_err(|e| self.err(format!("{e:?}")))?;
        for src in copied {
            let b = self.inner.kv_pool.take(self, bytes)?;
            // SAFETY: both are blocks of `bytes` bytes of the pool, on this stream.
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(
                    b.addr,
                    src.addr,
                    bytes,
                    self.inner.stream.cu_stream(),
                )
            }
            .map_err(|e| self.err(format!("{e:?}")))?;
            blocks.push(b);
        }
        self.kv_table_extend(&mut out, blocks)?;
        out.len = len;
        Ok(out)
    }

    fn upload(&self, rows: usize, cols: usize, data: &[f32]) -> Result<CudaTensor> {
        self.check(data.len() == rows * cols, || {
            format!("upload of {} values as [{rows}, {cols}]", data.len())
        })?;
        let buf = if data.is_empty() {
            self.alloc(1)?
        } else {
            self.inner
                .stream
                .clone_htod(data)
                .map_err(|e| self.err(format!("upload: {e:?}")))?
        };
        Ok(CudaTensor { buf, rows, cols })
    }

    fn download(&self, x: &CudaTensor) -> Result<Vec<f32>> {
        let mut v = self
            .inner
            .stream
            .clone_dtoh(&x.buf)
            .map_err(|e| self.err(format!("download: {e:?}")))?;
        v.truncate(x.rows * x.cols);
        Ok(v)
    }

    fn dims(&self, x: &CudaTensor) -> (usize, usize) {
        (x.rows, x.cols)
    }

    fn rows(&self, x: &CudaTensor, start: usize, len: usize) -> Result<CudaTensor> {
        self.check(start + len <= x.rows, || {
            format!("rows {start}..{} of a {}-row tensor", start + len, x.rows)
        })?;
        let mut out = self.tensor(len, x.cols)?;
        let c = x.cols;
        if len * c > 0 {
            self.inner
                .stream
                .memcpy_dtod(
                    &x.buf.slice(start * c..(start + len) * c),
                    &mut out.buf.slice_mut(0..len * c),
                )
                .map_err(|e| self.err(format!("{e:?}")))?;
        }
        Ok(out)
    }

    fn concat_rows(&self, parts: &[&CudaTensor]) -> Result<CudaTensor> {
        let cols = parts.first().map_or(0, |p| p.cols);
        self.check(parts.iter().all(|p| p.cols == cols), || {
            "concat_rows of different widths".into()
        })?;
        let rows = parts.iter().map(|p| p.rows).sum();
        let mut out = self.tensor(rows, cols)?;
        let mut at = 0;
        for p in parts {
            let n = p.rows * cols;
            if n > 0 {
                self.inner
                    .stream
                    .memcpy_dtod(&p.buf.slice(0..n), &mut out.buf.slice_mut(at..at + n))
                    .map_err(|e| self.err(format!("{e:?}")))?;
            }
            at += n;
        }
        Ok(out)
    }

    fn embed(&self, table: &CudaLinear, ids: &[u32]) -> Result<CudaTensor> {
        for &id in ids {
            self.check((id as usize) < table.rows, || {
                format!("token id {id} outside table `{}`", table.name)
            })?;
        }
        let out = self.tensor(ids.len(), table.cols)?;
        if ids.is_empty() {
            return Ok(out);
        }
        let d_ids = self
            .inner
            .stream
            .clone_htod(ids)
            .map_err(|e| self.err(format!("{e:?}")))?;
        ops::prefill::EmbedArgs {
            fmt: table.fmt,
            w: self.ptr(&table.data),
            scales: table.scales_ptr(self),
            inv_g: table.inv_g,
            ids: self.ptr(&d_ids),
            y: self.ptr(&out.buf),
            k: table.cols as i32,
        }
        .launch(self, (ids.len() as u32, 1, 1), (256, 1, 1))?;
        Ok(out)
    }

    fn rms_norm(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        eps: f32,
        width: usize,
    ) -> Result<CudaTensor> {
        self.check(
            width > 0 && x.cols.is_multiple_of(width) && w.rows * w.cols == width,
            || format!("rms_norm of width {width} on {} columns", x.cols),
        )?;
        let out = self.tensor(x.rows, x.cols)?;
        let groups = x.rows * x.cols / width;
        self.rms_norm_raw(
            (self.ptr(&x.buf), self.ptr(&w.buf), self.ptr(&out.buf)),
            width,
            groups,
            eps,
        )?;
        Ok(out)
    }

    fn linear(
        &self,
        x: &CudaTensor,
        w: &CudaLinear,
        bias: Option<&CudaTensor>,
    ) -> Result<CudaTensor> {
        self.linear_rows(x, w, bias, &SharedInput::default())
    }

    fn linear_add(
        &self,
        y: &mut CudaTensor,
        x: &CudaTensor,
        w: &CudaLinear,
        bias: Option<&CudaTensor>,
    ) -> Result<()> {
        self.linear_add_rows(y, x, w, bias)
    }

    fn gated_linear_add(
        &self,
        y: &mut CudaTensor,
        x: CudaTensor,
        gate: &CudaTensor,
        w: &CudaLinear,
        bias: Option<&CudaTensor>,
    ) -> Result<()> {
        self.gated_linear_add_rows(y, x, gate, w, bias)
    }

    fn linears(
        &self,
        x: &CudaTensor,
        ws: &[(&CudaLinear, Option<&CudaTensor>)],
    ) -> Result<Vec<CudaTensor>> {
        self.linears_rows(x, ws)
    }

    fn rope(
        &self,
        x: &mut CudaTensor,
        rope: &CudaRope,
        head_dim: usize,
        pos0: usize,
    ) -> Result<()> {
        self.norm_rope(x, None, 0.0, rope, (head_dim, pos0))
    }

    /// One `norm_rope` launch (a block a row: the norm as `rms_norm_warp` computes it, then the
    /// rotation) where the heads fit it (`head_dim % 4 == 0`, at most `RMS_NORM_WARP_MAX`) and
    /// `CudaOptions::norm_rope` is on; else `rms_norm` then the rotation alone (the same bits).
    fn norm_rope(
        &self,
        x: &mut CudaTensor,
        norm: Option<&CudaTensor>,
        eps: f32,
        rope: &CudaRope,
        (head_dim, pos0): (usize, usize),
    ) -> Result<()> {
        self.check(
            head_dim > 0 && x.cols.is_multiple_of(head_dim) && rope.rotary_dim <= head_dim,
            || format!("rope of head_dim {head_dim} on {} columns", x.cols),
        )?;
        self.check(
            rope.rotary_dim / 2 <= ops::elementwise::ROPE_HALF_MAX,
            || {
                format!(
                    "rope of {} rotary dims (at most {})",
                    rope.rotary_dim,
                    2 * ops::elementwise::ROPE_HALF_MAX
                )
            },
        )?;
        let fits = ops::elementwise::norm_rope_takes(head_dim) && self.opts().norm_rope;
        if let Some(w) = norm.filter(|_| !fits) {
            *x = self.rms_norm(x, w, eps, head_dim)?;
        }
        let w = norm.filter(|_| fits);
        if x.rows == 0 || (rope.rotary_dim < 2 && w.is_none()) {
            return Ok(());
        }
        if let Some(w) = w {
            self.check(w.rows * w.cols == head_dim, || {
                format!(
                    "a per-head norm of {} values for head_dim {head_dim}",
                    w.rows * w.cols
                )
            })?;
        }
        ops::elementwise::NormRopeArgs {
            x: self.ptr(&x.buf),
            w: w.map_or(DevPtr::NULL, |w| self.ptr(&w.buf)),
            eps,
            inv_freq: self.ptr(&rope.inv_freq),
            heads: (x.cols / head_dim) as i32,
            hd: head_dim as i32,
            rdim: if rope.rotary_dim < 2 {
                0
            } else {
                rope.rotary_dim as i32
            },
            attn_factor: rope.attention_factor,
            pos0: pos0 as i32,
        }
        .launch(self, (x.rows as u32, 1, 1), (256, 1, 1))
    }

    fn attention(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        cache: &mut CudaKvLayer,
        p: &AttentionParams,
    ) -> Result<CudaTensor> {
        let spec = cache.spec.clone();
        self.check(
            p.kv_heads > 0
                && p.heads.is_multiple_of(p.kv_heads)
                && q.cols == p.heads * p.head_dim
                && k.cols == p.kv_heads * p.head_dim
                && v.cols == k.cols
                && q.rows == k.rows
                && k.rows == v.rows
                && spec.kv_heads == p.kv_heads
                && spec.head_dim == p.head_dim,
            || {
                format!(
                    "attention shapes q {:?} k {:?} for {p:?}",
                    (q.rows, q.cols),
                    (k.rows, k.cols)
                )
            },
        )?;
        let t = q.rows;
        let out = self.tensor(t, q.cols)?;
        if t == 0 {
            return Ok(out);
        }
        let pos0 = cache.len;
        self.kv_grow(cache, pos0 + t)?;
        let keys = match spec.window {
            Some(w) => w.min(pos0 + 1),
            None => pos0 + 1,
        };
        if self.flash_attention_applies(cache, p.head_dim, t) {
            let call = FlashCall {
                q: self.ptr(&q.buf),
                k: self.ptr(&k.buf),
                v: self.ptr(&v.buf),
                t,
                out: self.ptr(&out.buf),
            };
            self.attention_flash(cache, p, call)?;
            return Ok(out);
        }
        let splits = self.splits_for(keys, p, t);
        let scratch = if splits > 1 {
            let po = self.alloc::<f32>(t * p.heads * splits * p.head_dim)?;
            let pml = self.alloc::<f32>(t * p.heads * splits * 2)?;
            Some((po, pml))
        } else {
            None
        };
        self.attention_raw(
            cache,
            p,
            AttnCall {
                q: self.ptr(&q.buf),
                k: self.ptr(&k.buf),
                v: self.ptr(&v.buf),
                pos0,
                t,
                out: self.ptr(&out.buf),
                gate: DevPtr::NULL,
                splits,
                scratch: scratch.as_ref().map(|(a, b)| (self.ptr(a), self.ptr(b))),
                prep: None,
            },
        )?;
        self.kv_append_raw(cache, self.ptr(&k.buf), self.ptr(&v.buf), t)?;
        drop(scratch);
        Ok(out)
    }

    /// The single-token chunks of a pass (decoding sequences) run their attention together in
    /// one launch per run of two or more consecutive ones (`attention_decode_batch`); the
    /// others (prompt chunks, other caches) chunk by chunk; all write their rows of one output.
    fn attention_chunks(
        &self,
        (q, k, v): (CudaTensor, CudaTensor, &CudaTensor),
        norms: HeadNorms<'_, Self>,
        rope: &CudaRope,
        chunks: &mut [AttnChunk<'_, Self>],
        p: &AttentionParams,
    ) -> Result<CudaTensor> {
        let runs = chunks
            .windows(2)
            .any(|w| w.iter().all(|c| Self::decode_batch_eligible(c, p)));
        if !runs || !self.opts().batched_attention {
            return crate::forward::attention_each(self, (q, k, v), norms, rope, chunks, p);
        }
        let (q, k) = crate::forward::head_normed(self, q, k, norms, p.head_dim)?;
        self.check(
            q.cols == p.heads * p.head_dim
                && k.cols == p.kv_heads * p.head_dim
                && v.cols == k.cols
                && q.rows == k.rows
                && v.rows == k.rows
                && chunks.iter().map(|c| c.rows).sum::<usize>() == q.rows,
            || {
                format!(
                    "batched attention of q {:?}, k {:?}, v {:?} over {} chunks",
                    (q.rows, q.cols),
                    (k.rows, k.cols),
                    (v.rows, v.cols),
                    chunks.len()
                )
            },
        )?;
        let mut out = self.tensor(q.rows, q.cols)?;
        let (mut i, mut row) = (0, 0);
        while i < chunks.len() {
            let run = chunks[i..]
                .iter()
                .take_while(|c| Self::decode_batch_eligible(c, p))
                .count();
            if run >= 2 {
                let at = |t: &CudaTensor| self.ptr(&t.buf).add(row * t.cols);
                let io = DecBatchIo {
                    q: at(&q),
                    k: at(&k),
                    v: at(v),
                    out: at(&out),
                    gate: DevPtr::NULL,
                    norms: QkNorms::NONE,
                };
                self.attention_decode_batch(io, rope, &mut chunks[i..i + run], p)?;
                i += run;
                row += run;
                continue;
            }
            let c = &mut chunks[i];
            let n = c.rows;
            let o = crate::forward::attend_rows(self, (&q, &k, v), row, rope, c, p)?;
            let w = q.cols;
            self.inner
                .stream
                .memcpy_dtod(
                    &o.buf.slice(0..n * w),
                    &mut out.buf.slice_mut(row * w..(row + n) * w),
                )
                .map_err(|e| self.err(format!("{e:?}")))?;
            i += 1;
            row += n;
        }
        Ok(out)
    }

    fn softplus_gate(&self, x: &mut CudaTensor, gate: &CudaTensor) -> Result<()> {
        let group = self.gate_group(x, gate)?;
        self.softplus_gate_raw(
            self.ptr(&x.buf),
            self.ptr(&gate.buf),
            x.rows * x.cols,
            group,
        )
    }

    fn silu_mul(&self, gate: &CudaTensor, up: &CudaTensor) -> Result<CudaTensor> {
        self.check(gate.rows == up.rows && gate.cols == up.cols, || {
            "silu_mul of different shapes".into()
        })?;
        let out = self.tensor(gate.rows, gate.cols)?;
        let n = gate.rows * gate.cols;
        if n > 0 {
            self.silu_mul_raw(
                self.ptr(&gate.buf),
                self.ptr(&up.buf),
                self.ptr(&out.buf),
                n,
            )?;
        }
        Ok(out)
    }

    fn add_scaled(&self, y: &mut CudaTensor, alpha: f32, x: &CudaTensor) -> Result<()> {
        self.check(y.rows == x.rows && y.cols == x.cols, || {
            "add of different shapes".into()
        })?;
        self.add_scaled_raw(self.ptr(&y.buf), alpha, self.ptr(&x.buf), y.rows * y.cols)
    }

    fn route(
        &self,
        logits: &CudaTensor,
        bias: Option<&CudaTensor>,
        p: &RouterParams,
        scale: f32,
    ) -> Result<CudaRouting> {
        let n = logits.cols;
        if let Some(b) = bias {
            self.check(b.rows * b.cols == n, || {
                format!("router bias for {n} experts")
            })?;
        }
        self.check(
            p.top_k > 0 && p.top_k <= n && p.top_k <= 32 && n <= 1024,
            || format!("top-{} of {n} experts", p.top_k),
        )?;
        let t = logits.rows;
        let sel = self.alloc::<i32>(t * p.top_k)?;
        let wts = self.alloc::<f32>(t * p.top_k)?;
        if t > 0 {
            ops::moe::RouteArgs {
                logits: self.ptr(&logits.buf),
                bias: bias.map_or(DevPtr::NULL, |b| self.ptr(&b.buf)),
                n: n as i32,
                k: p.top_k as i32,
                softmax: i32::from(p.scoring == RouterScoring::Softmax),
                normalize: i32::from(p.normalize),
                softcap: p.logit_softcap,
                scale,
                sel: self.ptr(&sel),
                wts: self.ptr(&wts),
                pf: ops::moe::ExpertPrefetch::default(),
            }
            .launch(self, (t as u32, 1, 1), (32, 1, 1))?;
        }
        Ok(CudaRouting {
            sel,
            wts,
            top_k: p.top_k,
            tokens: t,
        })
    }

    fn experts(&self, x: &CudaTensor, r: &CudaRouting, e: &CudaExperts) -> Result<CudaTensor> {
        self.check(r.tokens == x.rows && x.cols == e.hidden, || {
            "routing does not match the tokens or experts".into()
        })?;
        let _ = e.n;
        let t = x.rows;
        let out = self.tensor(t, e.hidden)?;
        if t == 0 {
            return Ok(out);
        }
        // (every item's rows of h and part are written before they are read: not zeroed, which
        // at 2,048 tokens of Laguna-XS would be 166 MB of memset a layer)
        let h = self.alloc_unset::<f32>(t * r.top_k * e.inter)?;
        let part = self.alloc_unset::<f32>(t * r.top_k * e.hidden)?;
        self.experts_raw(
            e,
            None,
            MoeBuffers {
                sel: &r.sel,
                wts: &r.wts,
                top_k: r.top_k,
                tokens: t,
                x: self.ptr(&x.buf),
                h: self.ptr(&h),
                part: self.ptr(&part),
                out: self.ptr(&out.buf),
                resid: DevPtr::NULL,
                staged: None,
                tiles: None,
                shared_gu: None,
            },
            Epi::default(),
            None,
            None,
        )?;
        Ok(out)
    }

    /// Every single-row request in one download of the ids: greedy rows and top-k 2..=256 in one
    /// `sample_logits` launch (the candidates selected in shared memory), the others (top-k 0:
    /// the whole vocabulary, or more than 256) in one `sample_sorted` launch (each row sorted in
    /// scratch of [`SORTED_SCRATCH_BYTES`] a logit, or, at top-k 0 and top-p 1, walked in index
    /// order).
    fn sample(&self, rows: &[SampleRequest<'_, CudaTensor>]) -> Result<Vec<Option<u32>>> {
        let mut picked = vec![None; rows.len()];
        let (mut table, mut sorted) = (Vec::new(), Vec::new());
        let (mut at, mut sorted_at) = (Vec::new(), Vec::new());
        for (i, r) in rows.iter().enumerate() {
            if r.logits.rows != 1 || r.logits.cols > i32::MAX as usize {
                continue;
            }
            let greedy = r.params.is_greedy() || r.u.is_none();
            let (temperature, top_k) = if greedy {
                (0.0, 1)
            } else {
                (r.params.temperature, r.params.top_k)
            };
            let row = ops::sampling::SampleRow {
                logits: self.ptr(&r.logits.buf),
                n: r.logits.cols as i32,
                temperature,
                top_k: top_k.min(i32::MAX as usize) as i32,
                top_p: r.params.top_p,
                u: r.u.unwrap_or(0.0),
            };
            if greedy || (2..=SAMPLE_K_MAX).contains(&top_k) {
                table.push(row);
                at.push(i);
            } else {
                sorted.push(row);
                sorted_at.push(i);
            }
        }
        let count = at.len() + sorted_at.len();
        if count == 0 {
            return Ok(picked);
        }
        let out = self.alloc_unset::<u32>(count)?;
        let upload = |what: &'static str| {
            move |e: cudarc::driver::DriverError| self.err(format!("upload of {what}: {e:?}"))
        };
        // (kept until the launches are queued)
        let _table = if table.is_empty() {
            None
        } else {
            let t = self
                .inner
                .stream
                .clone_htod(&table)
                .map_err(upload("the sampled rows"))?;
            ops::sampling::SampleLogitsArgs {
                rows: self.ptr(&t),
                out: self.ptr(&out),
            }
            .launch(self, (table.len() as u32, 1, 1), (SAMPLE_THREADS, 1, 1))?;
            Some(t)
        };
        let _sorted = if sorted.is_empty() {
            None
        } else {
            // each row's scratch, 8-byte aligned (its logits count times the bytes a logit)
            let mut offsets = Vec::with_capacity(sorted.len());
            let mut bytes = 0usize;
            for r in &sorted {
                offsets.push(bytes);
                bytes += (r.n as usize * SORTED_SCRATCH_BYTES).next_multiple_of(8);
            }
            let scratch = self.alloc_unset::<u8>(bytes)?;
            let rows: Vec<_> = sorted
                .iter()
                .zip(offsets)
                .map(|(&row, off)| ops::sampling::SortedSampleRow {
                    row,
                    scratch: self.ptr(&scratch).add(off),
                })
                .collect();
            let t = self
                .inner
                .stream
                .clone_htod(&rows)
                .map_err(upload("the sorted rows"))?;
            ops::sampling::SampleSortedArgs {
                rows: self.ptr(&t),
                out: self.ptr(&out).add(at.len()),
            }
            .launch(self, (rows.len() as u32, 1, 1), (SAMPLE_THREADS, 1, 1))?;
            Some((t, scratch))
        };
        let ids = self
            .inner
            .stream
            .clone_dtoh(&out)
            .map_err(|e| self.err(format!("download: {e:?}")))?;
        for (i, id) in at.into_iter().chain(sorted_at).zip(ids) {
            picked[i] = Some(id);
        }
        Ok(picked)
    }

    /// Every row of every request in one `row_logprobs` launch (a block per row) and one
    /// download of the scores; a request of more than [`LOGPROB_TOP_MAX`] alternatives is left
    /// to the host.
    fn logprobs(
        &self,
        requests: &[LogprobRequest<'_, CudaTensor>],
    ) -> Result<Vec<Option<Vec<TokenLogprob>>>> {
        let mut out = vec![None; requests.len()];
        let mut table = Vec::new();
        let mut slots = 0usize;
        let mut at = Vec::new();
        for (i, r) in requests.iter().enumerate() {
            let (rows, vocab) = (r.logits.rows, r.logits.cols);
            self.check(r.targets.len() <= rows, || {
                format!("{} logprob targets for {rows} rows", r.targets.len())
            })?;
            if r.top > LOGPROB_TOP_MAX || vocab > i32::MAX as usize {
                continue;
            }
            let top = r.top.min(vocab);
            for (row, &target) in r.targets.iter().enumerate() {
                table.push(ops::sampling::LogprobRow {
                    logits: self.ptr(&r.logits.buf).add(row * vocab),
                    n: vocab as i32,
                    target: i32::try_from(target).unwrap_or(-1),
                    top: top as i32,
                    out: slots as i32,
                });
                slots += top;
            }
            at.push((i, r.targets.len(), top));
        }
        if table.is_empty() {
            return Ok(out);
        }
        let rows = table.len();
        let table = self
            .inner
            .stream
            .clone_htod(&table)
            .map_err(|e| self.err(format!("upload: {e:?}")))?;
        let lp = self.alloc_unset::<f32>(rows)?;
        let rank = self.alloc_unset::<u32>(rows)?;
        let top_id = self.alloc_unset::<u32>(slots.max(1))?;
        let top_lp = self.alloc_unset::<f32>(slots.max(1))?;
        ops::sampling::RowLogprobsArgs {
            rows: self.ptr(&table),
            lp: self.ptr(&lp),
            rank: self.ptr(&rank),
            top_id: self.ptr(&top_id),
            top_lp: self.ptr(&top_lp),
        }
        .launch(self, (rows as u32, 1, 1), (1024, 1, 1))?;
        let get = |e| self.err(format!("download: {e:?}"));
        let lp = self.inner.stream.clone_dtoh(&lp).map_err(get)?;
        let rank = self.inner.stream.clone_dtoh(&rank).map_err(get)?;
        let top_id = self.inner.stream.clone_dtoh(&top_id).map_err(get)?;
        let top_lp = self.inner.stream.clone_dtoh(&top_lp).map_err(get)?;
        let (mut row, mut slot) = (0usize, 0usize);
        for (i, n, top) in at {
            let mut scores = Vec::with_capacity(n);
            for _ in 0..n {
                scores.push(TokenLogprob {
                    logprob: lp[row],
                    rank: rank[row],
                    top: (slot..slot + top).map(|s| (top_id[s], top_lp[s])).collect(),
                });
                row += 1;
                slot += top;
            }
            out[i] = Some(scores);
        }
        Ok(out)
    }

    /// A decode step (one token of each sequence, its last logits wanted) runs the fused
    /// launch sequence of [`CudaBackend::decode_fused`] where it covers the decoder and the
    /// sequences.
    fn fused_pass(
        &self,
        net: &Decoder<Self>,
        seqs: &mut [SeqChunk<'_, Self>],
    ) -> Result<Option<Vec<Option<CudaTensor>>>> {
        Ok(self
            .decode_fused(net, seqs)?
            .map(|ts| ts.into_iter().map(Some).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where no CUDA driver can be loaded (CI, a CPU machine), opening a device is an error that
    /// says so, not a panic inside the driver bindings; where one can, there is nothing to check.
    #[test]
    fn a_machine_without_a_driver_gets_an_error() {
        // SAFETY: loading the library is the whole check.
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            println!("a CUDA driver is present: nothing to check");
            return;
        }
        let err = CudaBackend::new(0).expect_err("no driver, yet a device opened");
        let text = err.to_string();
        assert!(text.contains("CUDA driver library"), "{text}");
    }
}
