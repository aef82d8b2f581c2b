//! The CUDA backend (feature `cuda`): weights resident in GPU memory exactly as stored (packed
//! NVFP4 stays packed: 4-bit codes, fp8 block scales, one f32 global scale per tensor, dequantized
//! in registers inside the GEMV), f32 activations, a bf16 (or f32) KV cache.
//!
//! The CUDA driver and NVRTC are loaded at run time (`cudarc` with dynamic loading), so a binary
//! built without CUDA runs unchanged on a GPU machine; the kernels (`kernels.cu`) are compiled by
//! NVRTC at start-up for the device's architecture, once per process.
//!
//! Every op is one to three kernel launches on one stream; nothing synchronises with the host
//! except [`Backend::download`] and [`Backend::sample`]. Decode GEMVs (one token) run NVFP4 on
//! tensor cores where K % 128 == 0 (sm_89+), one token's MoE on persistent blocks; prefill uses a
//! tiled matrix-matrix kernel. A single-token step of the model path runs on the fused launch
//! sequence of `decode.rs` (fixed buffers, q/k/v/gate in one launch, norms/rope/append inside
//! attention, norms fused into neighbouring kernels), and the next token is sampled on the device
//! (`sample_logits`). [`bench`](mod@bench) runs the same launch sequence on synthetic weights of
//! real Laguna geometry, captured in a CUDA graph.
//!
//! Not yet: CUDA-graph capture of the model path's step (it launches eagerly; in the benchmark
//! eager is 1-2% slower than graph replay: 4.45 vs 4.39 ms at Laguna-S lean 2K), sampling on
//! device for batched steps (the server's batches of several sequences pick on the host).

pub mod bench;
mod decode;
pub mod stream_probe;

use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

use super::{AttentionParams, Backend, RouterParams, RouterScoring};
use crate::error::{EngineError, Result};
use crate::kv_cache::{KvDtype, KvLayerSpec};
use crate::models::decoder::Decoder;
use crate::rope::RopeSpec;
use crate::sampling::SamplingParams;
use crate::weights::{ExpertWeights, LinearWeight};

/// The kernels' CUDA C source.
pub const KERNELS_CU: &str = include_str!("kernels.cu");

/// Warps per block of the GEMV kernels (one warp per output row).
const GEMV_WARPS: u32 = 4;
/// Tokens per warp of the `linear` kernel (`TB` in the source).
const GEMV_TOKENS: usize = 4;
/// Output rows and tokens of one `gemm_tiled` block (`GM_BM`, `GM_BN` in the source).
const GEMM_ROWS: u32 = 64;
const GEMM_TOKENS: u32 = 64;
/// Fewest tokens for which a multi-token linear uses `gemm_tiled` (fewer: the `linear` GEMV).
const GEMM_MIN_TOKENS: usize = 16;
/// Query heads of one KV head handled by one attention block (`GMAX`).
const ATTN_GMAX: usize = 4;
/// Fewest keys per split of decode attention.
const ATTN_SPLIT_MIN_KEYS: u32 = 64;
/// Decode attention blocks per SM that `splits_for` aims at; 0: one full wave of the kernel it
/// launches (its resident blocks per SM). H200, Laguna-S, graph replay, one run: lean 5.056 /
/// 5.249 / 5.531 ms per token at 16K context aiming at 4 / 8 / 16 (4 = one wave of the long-span
/// kernel), 7.130 / 7.346 / 7.698 at 64K; at 2K 2 (one wave of the short-span kernel) beats 4.
const ATTN_SPLIT_BLOCKS_PER_SM: u32 = 0;
/// Most key splits of one decode attention call.
pub(crate) const MAX_SPLITS: usize = 128;
/// Rows per warp of `linear_multi2` (`MULTI_R`) outside its tensor-core path.
const EXPERT_ROWS: u32 = 4;
/// Warps per block of `linear_multi2` (its tensor-core path: 4 tiles of 16 rows, 2 warps each).
pub(crate) const MULTI_WARPS: u32 = 8;
/// Rows of gate and of up per warp of `experts_gate_up2` (`XR`).
const EXPERT_GU_ROWS: u32 = 2;
/// Warps per block of `experts_gate_up2` (x is staged in shared memory once per block).
const EXPERT_GU_WARPS: u32 = 8;
/// Rows per warp of `experts_down2` (`XRD`).
const EXPERT_DOWN_ROWS: u32 = 8;
/// Warps per block (`NVW`) and rows per row group (`NV_R`) of the NVFP4 decode GEMV.
const NV_WARPS: u32 = 8;
const NV_ROWS: usize = 2;
/// Launch tuning of the NVFP4 decode GEMV (defaults; the environment overrides them for
/// experiments: `FP4FORGE_NV_MINB` = 2 | 3 resident blocks per SM, `FP4FORGE_NV_GRID` = blocks
/// per SM of the persistent grid (0: one block per tile), `FP4FORGE_NV_KS` = 1 | 2 | 4 | 8;
/// `FP4FORGE_MMA_KS` = 1 | 2 | 4 | 8 warps per tile of `gemv_mma`).
#[derive(Clone, Copy)]
struct NvTune {
    minb: usize,
    grid_per_sm: usize,
    ks: Option<usize>,
    mma_ks: Option<usize>,
}

fn nv_tune() -> NvTune {
    static T: OnceLock<NvTune> = OnceLock::new();
    *T.get_or_init(|| {
        let var = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<usize>().ok());
        let minb = match var("FP4FORGE_NV_MINB") {
            Some(3) => 3,
            _ => NV_BLOCKS_PER_SM,
        };
        NvTune {
            minb,
            grid_per_sm: var("FP4FORGE_NV_GRID").unwrap_or(minb),
            ks: var("FP4FORGE_NV_KS").filter(|k| [1, 2, 4, 8].contains(k)),
            mma_ks: var("FP4FORGE_MMA_KS").filter(|k| [1, 2, 4, 8].contains(k)),
        }
    })
}

/// Largest K of the NVFP4 decode GEMV (`XS_MAX`: x is staged in shared memory).
const NV_MAX_K: usize = 9216;
/// Resident blocks per SM of the NVFP4 decode GEMV (`__launch_bounds__`).
const NV_BLOCKS_PER_SM: usize = 2;

macro_rules! launch {
    ($b:expr, $f:expr, $grid:expr, $block:expr; $($a:expr),* $(,)?) => {
        launch!($b, $f, $grid, $block, 0; $($a),*)
    };
    ($b:expr, $f:expr, $grid:expr, $block:expr, $smem:expr; $($a:expr),* $(,)?) => {{
        let cfg = ::cudarc::driver::LaunchConfig { grid_dim: $grid, block_dim: $block, shared_mem_bytes: $smem };
        if $b.inner.pdl {
            // Each argument boxed (a stable address until the launch returns); `'static`
            // values only, so a reference can never be passed where a device pointer belongs.
            let mut keep: Vec<Box<dyn ::std::any::Any>> = Vec::new();
            let mut params: Vec<*mut ::core::ffi::c_void> = Vec::new();
            $(
                let bx = Box::new($a);
                params.push(&*bx as *const _ as *mut ::core::ffi::c_void);
                keep.push(bx);
            )*
            // SAFETY: the argument list matches the kernel's signature in kernels.cu.
            let r = unsafe { $b.launch_pdl($f, cfg, &mut params) };
            drop(keep);
            r
        } else {
            let mut lb = $b.inner.stream.launch_builder($f);
            $( let a = $a; ::cudarc::driver::PushKernelArg::arg(&mut lb, &a); )*
            // SAFETY: the argument list matches the kernel's signature in kernels.cu.
            unsafe { lb.launch(cfg) }.map(|_| ()).map_err(|e| $b.err(format!("launch: {e:?}")))
        }
    }};
}
pub(crate) use launch;

pub(crate) struct Funcs {
    pub linear: CudaFunction,
    pub gemm_tiled: CudaFunction,
    pub embed: CudaFunction,
    pub rms_norm: CudaFunction,
    pub rope: CudaFunction,
    pub qk_norm_rope: CudaFunction,
    pub softplus_gate: CudaFunction,
    pub silu_mul: CudaFunction,
    pub add_scaled: CudaFunction,
    pub kv_append: CudaFunction,
    /// `[f32 d≤32, f32 d≤64, f32 d≤128, bf16 ...]`.
    pub attn: Vec<CudaFunction>,
    /// Decode attention over bf16 caches: `[d = 64, d = 128]`.
    pub attn_dec: Vec<CudaFunction>,
    pub attn_combine: CudaFunction,
    pub route: CudaFunction,
    pub fill: CudaFunction,
    /// One-token GEMV with 1, 2, 4, 8 rows per warp.
    pub gemv1: Vec<CudaFunction>,
    /// NVFP4 one-token GEMV with K split over 1, 2, 4, 8 warps; 2 then 3 blocks per SM.
    pub gemv_nv: Vec<CudaFunction>,
    /// NVFP4 one-token GEMV on tensor cores (K % 128 == 0).
    pub gemv_mma: CudaFunction,
    pub linear_multi2: CudaFunction,
    pub experts_gate_up2: CudaFunction,
    pub experts_down2: CudaFunction,
    /// One token's experts on persistent blocks (tensor cores; `persistent_moe`).
    pub experts_gate_up_p: CudaFunction,
    pub experts_down_p: CudaFunction,
    pub experts_reduce: CudaFunction,
    /// rmsnorm feeding a small BF16 GEMV (the MoE router), one token, one launch.
    pub norm_gemv_bf16: CudaFunction,
    /// The next token from one row of logits, as the host `Sampler` picks it.
    pub sample_logits: CudaFunction,
}

/// Attention kernels indexed by `3 · kv_t + head-dim class` (f32, fp8, bf16 caches).
const ATTN_KERNELS: [&str; 9] = [
    "attn_f32_1",
    "attn_f32_2",
    "attn_f32_4",
    "attn_fp8_1",
    "attn_fp8_2",
    "attn_fp8_4",
    "attn_bf16_1",
    "attn_bf16_2",
    "attn_bf16_4",
];
/// Decode attention over bf16 caches: head_dim 64, 128, and 128 for short spans
/// (`ATTN_SHORT_KEYS`).
const ATTN_DEC_KERNELS: [&str; 3] = [
    "attn_dec_bf16_64",
    "attn_dec_bf16_128",
    "attn_dec_bf16_128_short",
];
/// Attended keys up to which a head_dim-128 decode step takes the kernel variant with 2 resident
/// blocks per SM (no register cap, no spills) instead of 4. Measured on the H200 (Laguna-S
/// geometry, 2026-11-30): sliding layers (512 keys) 565 vs 618 µs per token, full layers at 64K
/// 4,103 vs 3,520 µs (the occupancy wins there).
const ATTN_SHORT_KEYS: usize = 8192;
/// One-token GEMV with 1, 2, 4, 8 rows per warp.
const GEMV1_KERNELS: [&str; 4] = ["gemv1_r1", "gemv1_r2", "gemv1_r4", "gemv1_r8"];
/// NVFP4 one-token GEMV with K split over 1, 2, 4, 8 warps; 2 then 3 blocks per SM.
const GEMV_NV_KERNELS: [&str; 8] = [
    "gemv_nv_k1_b2",
    "gemv_nv_k2_b2",
    "gemv_nv_k4_b2",
    "gemv_nv_k8_b2",
    "gemv_nv_k1_b3",
    "gemv_nv_k2_b3",
    "gemv_nv_k4_b3",
    "gemv_nv_k8_b3",
];
/// The kernels loaded one by one.
const SINGLE_KERNELS: [&str; 22] = [
    "linear",
    "gemm_tiled",
    "embed",
    "rms_norm",
    "rope",
    "qk_norm_rope",
    "softplus_gate",
    "silu_mul",
    "add_scaled",
    "kv_append",
    "attn_combine",
    "route",
    "fill",
    "gemv_mma",
    "linear_multi2",
    "experts_gate_up2",
    "experts_down2",
    "experts_gate_up_p",
    "experts_down_p",
    "experts_reduce",
    "norm_gemv_bf16",
    "sample_logits",
];

/// Every kernel the backend loads from the compiled source (`CudaBackend::new` refuses a name
/// missing here, so the NVRTC build check covers them all).
pub fn kernel_entries() -> Vec<&'static str> {
    [
        &SINGLE_KERNELS[..],
        &ATTN_KERNELS,
        &ATTN_DEC_KERNELS,
        &GEMV1_KERNELS,
        &GEMV_NV_KERNELS,
    ]
    .concat()
}

/// Compiles the kernel source for `arch` (e.g. `sm_90`) with NVRTC, as the backend does at
/// start-up, and returns the PTX. Needs only NVRTC (no GPU, no driver): a build check.
pub fn compile_kernels(arch: &'static str) -> std::result::Result<String, String> {
    ptx_for(arch).map(|p| p.to_src())
}

/// PTX per architecture, compiled once per process.
fn ptx_for(arch: &'static str) -> std::result::Result<Ptx, String> {
    static CACHE: OnceLock<Mutex<Vec<(&'static str, Ptx)>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(Vec::new()));
    let mut c = cache.lock().map_err(|_| "ptx cache poisoned".to_string())?;
    if let Some((_, p)) = c.iter().find(|(a, _)| *a == arch) {
        return Ok(p.clone());
    }
    let opts = CompileOptions {
        arch: Some(arch),
        options: vec!["-std=c++17".into(), "-default-device".into()],
        ..Default::default()
    };
    // Development hook: FP4FORGE_CUDA_KERNELS=path compiles that source instead of the built-in
    // one (same kernel names and signatures), so kernels can be tuned on a GPU machine without
    // rebuilding the binary.
    let source = match std::env::var_os("FP4FORGE_CUDA_KERNELS") {
        Some(path) => std::fs::read_to_string(&path)
            .map_err(|e| format!("FP4FORGE_CUDA_KERNELS={}: {e}", path.to_string_lossy()))?,
        None => KERNELS_CU.to_string(),
    };
    let ptx = compile_ptx_with_opts(source, opts).map_err(|e| format!("NVRTC: {e}"))?;
    c.push((arch, ptx.clone()));
    Ok(ptx)
}

pub(crate) struct Inner {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub f: Funcs,
    #[allow(dead_code)]
    module: Arc<CudaModule>,
    pub name: String,
    pub sms: usize,
    /// Launch with programmatic dependent launch (sm_90+, unless `FP4FORGE_CUDA_PDL=0`): a
    /// kernel's blocks start while its predecessor drains and wait for its results in
    /// `pdl_enter()` (kernels.cu), hiding launch and ramp-up between the small kernels of a step.
    pub pdl: bool,
    /// Decode GEMVs of NVFP4 weights with K % 128 == 0 on tensor cores (`gemv_mma` and the
    /// `mma` paths of `linear_multi2` / `experts_*`): sm_89+ (fp8 conversions), unless
    /// `FP4FORGE_CUDA_MMA=0`.
    pub mma: bool,
    /// Completion counter of the fused epilogues (`Epi` in kernels.cu).
    counters: CudaSlice<u32>,
    /// One token's experts on the persistent kernels where they apply (`persistent_moe`);
    /// `FP4FORGE_CUDA_PERSIST=0` starts it off.
    persist: std::sync::atomic::AtomicBool,
    /// The decode attention split heuristic of `splits_for`: (fewest keys per split << 16) |
    /// blocks per SM aimed at; `ATTN_SPLIT_MIN_KEYS` and `ATTN_SPLIT_BLOCKS_PER_SM` unless the
    /// benchmark sweeps them (`FP4FORGE_BENCH_SPLIT_SWEEP`).
    pub(crate) split_knobs: std::sync::atomic::AtomicU32,
    /// Cap on the persistent MoE kernels' grid (0: as many blocks as are resident).
    persist_grid: std::sync::atomic::AtomicUsize,
    /// Attended keys up to which head_dim-128 decode attention takes the short-span variant
    /// (`ATTN_SHORT_KEYS` unless set).
    attn_short_keys: std::sync::atomic::AtomicUsize,
    /// The model path's single-token steps on the fused launch sequence (`decode.rs`) where it
    /// covers the model; `FP4FORGE_CUDA_FUSED_DECODE=0` starts it off.
    fused_decode: std::sync::atomic::AtomicBool,
    /// The fused step's activation buffers (one step at a time).
    decode: Mutex<Option<decode::DecodeBuffers>>,
    /// Tokens decoded on the fused step so far.
    fused_steps: std::sync::atomic::AtomicUsize,
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

/// `FP4FORGE_CUDA_GEMM=0` computes multi-token linears with the `linear` GEMV kernel instead of
/// `gemm_tiled` (comparisons).
fn tiled_prefill() -> bool {
    static G: OnceLock<bool> = OnceLock::new();
    *G.get_or_init(|| std::env::var("FP4FORGE_CUDA_GEMM").as_deref() != Ok("0"))
}

impl CudaBackend {
    /// Opens device `ordinal`, compiles the kernels for it (NVRTC) and creates a stream.
    pub fn new(ordinal: usize) -> Result<Self> {
        let ctx = CudaContext::new(ordinal).map_err(|e| backend_err(format!("{e:?}")))?;
        // One stream, ordered: no per-buffer events needed.
        // SAFETY: every op runs on `stream`; buffers are never shared across streams.
        unsafe { ctx.disable_event_tracking() };
        let (maj, min) = ctx
            .compute_capability()
            .map_err(|e| backend_err(format!("{e:?}")))?;
        let arch: &'static str = Box::leak(format!("sm_{maj}{min}").into_boxed_str());
        let ptx = ptx_for(arch).map_err(backend_err)?;
        let module = ctx
            .load_module(ptx)
            .map_err(|e| backend_err(format!("load module: {e:?}")))?;
        let entries = kernel_entries();
        let get = |n: &str| {
            if !entries.contains(&n) {
                return Err(backend_err(format!(
                    "kernel {n} is not in kernel_entries()"
                )));
            }
            module
                .load_function(n)
                .map_err(|e| backend_err(format!("kernel {n}: {e:?}")))
        };
        let f = Funcs {
            linear: get("linear")?,
            gemm_tiled: get("gemm_tiled")?,
            embed: get("embed")?,
            rms_norm: get("rms_norm")?,
            rope: get("rope")?,
            qk_norm_rope: get("qk_norm_rope")?,
            softplus_gate: get("softplus_gate")?,
            silu_mul: get("silu_mul")?,
            add_scaled: get("add_scaled")?,
            kv_append: get("kv_append")?,
            attn: ATTN_KERNELS.iter().map(|n| get(n)).collect::<Result<_>>()?,
            attn_dec: ATTN_DEC_KERNELS
                .iter()
                .map(|n| get(n))
                .collect::<Result<_>>()?,
            attn_combine: get("attn_combine")?,
            route: get("route")?,
            fill: get("fill")?,
            gemv1: GEMV1_KERNELS
                .iter()
                .map(|n| get(n))
                .collect::<Result<_>>()?,
            gemv_nv: GEMV_NV_KERNELS
                .iter()
                .map(|n| get(n))
                .collect::<Result<_>>()?,
            gemv_mma: get("gemv_mma")?,
            linear_multi2: get("linear_multi2")?,
            experts_gate_up2: get("experts_gate_up2")?,
            experts_down2: get("experts_down2")?,
            experts_gate_up_p: get("experts_gate_up_p")?,
            experts_down_p: get("experts_down_p")?,
            experts_reduce: get("experts_reduce")?,
            norm_gemv_bf16: get("norm_gemv_bf16")?,
            sample_logits: get("sample_logits")?,
        };
        let stream = ctx
            .new_stream()
            .map_err(|e| backend_err(format!("{e:?}")))?;
        let dev_name = ctx.name().unwrap_or_default();
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .unwrap_or(100) as usize;
        let counters = stream
            .alloc_zeros::<u32>(1)
            .map_err(|e| backend_err(format!("{e:?}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                counters,
                persist: std::sync::atomic::AtomicBool::new(
                    std::env::var("FP4FORGE_CUDA_PERSIST").as_deref() != Ok("0"),
                ),
                persist_grid: std::sync::atomic::AtomicUsize::new(0),
                split_knobs: std::sync::atomic::AtomicU32::new(
                    (ATTN_SPLIT_MIN_KEYS << 16) | ATTN_SPLIT_BLOCKS_PER_SM,
                ),
                attn_short_keys: std::sync::atomic::AtomicUsize::new(ATTN_SHORT_KEYS),
                fused_decode: std::sync::atomic::AtomicBool::new(
                    std::env::var("FP4FORGE_CUDA_FUSED_DECODE").as_deref() != Ok("0"),
                ),
                decode: Mutex::new(None),
                fused_steps: std::sync::atomic::AtomicUsize::new(0),
                ctx,
                stream,
                f,
                module,
                name: format!("cuda:{ordinal} ({dev_name}, {arch})"),
                sms,
                pdl: maj >= 9 && std::env::var("FP4FORGE_CUDA_PDL").map_or(true, |v| v != "0"),
                mma: (maj, min) >= (8, 9)
                    && std::env::var("FP4FORGE_CUDA_MMA").map_or(true, |v| v != "0"),
            }),
        })
    }

    /// Launches `f` on the stream with programmatic stream serialization allowed.
    ///
    /// # Safety
    /// `params` points at one value per kernel parameter, of the parameter's type, alive until
    /// this returns; the kernel calls `pdl_enter()` before touching memory another kernel writes.
    pub(crate) unsafe fn launch_pdl(
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

    /// Captures the work `record` queues on the stream into a CUDA graph (nothing runs while
    /// capturing) and instantiates it.
    pub(crate) fn capture_graph(
        &self,
        record: impl FnOnce() -> Result<()>,
    ) -> Result<cudarc::driver::CudaGraph> {
        use cudarc::driver::sys;
        self.inner
            .stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| self.err(format!("capture: {e:?}")))?;
        let r = record();
        let graph = self
            .inner
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(|e| self.err(format!("end capture: {e:?}")))?;
        r?;
        graph.ok_or_else(|| self.err("empty graph"))
    }

    /// Seconds per replay of `graph`: 5 warm-up replays, then the mean of `reps`.
    pub(crate) fn time_graph(&self, graph: &cudarc::driver::CudaGraph, reps: usize) -> Result<f64> {
        let replay = || {
            graph
                .launch()
                .map_err(|e| self.err(format!("graph launch: {e:?}")))
        };
        for _ in 0..5 {
            replay()?;
        }
        self.synchronize()?;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            replay()?;
        }
        self.synchronize()?;
        Ok(t.elapsed().as_secs_f64() / reps.max(1) as f64)
    }

    /// Waits for all queued work.
    pub fn synchronize(&self) -> Result<()> {
        self.inner
            .stream
            .synchronize()
            .map_err(|e| self.err(format!("{e:?}")))
    }

    pub(crate) fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        s.device_ptr(&self.inner.stream).0
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

    fn tensor(&self, rows: usize, cols: usize) -> Result<CudaTensor> {
        Ok(CudaTensor {
            buf: self.alloc(rows * cols)?,
            rows,
            cols,
        })
    }

    /// Fills `n` elements at `ptr` with seeded synthetic values (see `fill` in kernels.cu).
    pub(crate) fn fill(&self, ptr: u64, n: usize, seed: u64, mode: i32, amp: f32) -> Result<()> {
        let blocks = (n.div_ceil(256)).min(65536) as u32;
        launch!(self, &self.inner.f.fill, (blocks.max(1), 1, 1), (256, 1, 1); ptr, n as i64, seed, mode, amp)
    }

    /// Runs an epilogue as its own launch (for `rows` rows).
    pub(crate) fn epilogue_launch(&self, epi: &Epi, rows: usize) -> Result<()> {
        if epi.kind == 0 {
            return Ok(());
        }
        launch!(self, &self.inner.f.rms_norm, (rows as u32, 1, 1), (512, 1, 1);
            epi.x, epi.w, epi.out, epi.n, epi.eps)
    }

    /// Whether `norm_gemv_raw` takes `w`: BF16, `cols` a multiple of 256 and at most 4,096.
    pub(crate) fn norm_gemv_applies(w: &CudaLinear) -> bool {
        w.fmt == 2 && w.cols.is_multiple_of(256) && w.cols <= 4096
    }

    /// One token: `xn = norm_w * rmsnorm(x)` (written to `xn`) and `y = xn · Wᵀ`, in one launch
    /// (`norm_gemv_bf16`; `norm_gemv_applies(w)` must hold).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn norm_gemv_raw(
        &self,
        w: &CudaLinear,
        x: u64,
        norm_w: u64,
        eps: f32,
        xn: u64,
        y: u64,
    ) -> Result<()> {
        self.check(Self::norm_gemv_applies(w), || {
            format!(
                "norm_gemv: {} is not BF16 with columns a multiple of 256 up to 4,096",
                w.name
            )
        })?;
        const WARPS: usize = 4; // NG_WARPS
        launch!(self, &self.inner.f.norm_gemv_bf16, (w.rows.div_ceil(WARPS) as u32, 1, 1), (32 * WARPS as u32, 1, 1);
            self.ptr(&w.data), x, norm_w, eps, xn, y, w.rows as i32, w.cols as i32)
    }

    /// `y = resid + x · Wᵀ + bias` on raw pointers (`resid`, `bias` may be 0).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemv_raw(
        &self,
        w: &CudaLinear,
        x: u64,
        y: u64,
        bias: u64,
        resid: u64,
        t: usize,
    ) -> Result<()> {
        let fast =
            (w.fmt == 3 && w.cols.is_multiple_of(32)) || (w.fmt == 2 && w.cols.is_multiple_of(8));
        if t == 1
            && w.fmt == 3
            && self.inner.mma
            && w.cols.is_multiple_of(MMA_CHUNK)
            && w.cols <= NV_MAX_K
            && !self.legacy_gemv()
        {
            // (each warp stages at most MMA_WARP_CHUNKS chunks of x: an override is raised to that)
            let chunks = w.cols / MMA_CHUNK;
            let ks = nv_tune()
                .mma_ks
                .map(|k| {
                    let mut k = k;
                    while chunks.div_ceil(k) > MMA_WARP_CHUNKS {
                        k *= 2;
                    }
                    k
                })
                .unwrap_or_else(|| mma_split(w.rows, w.cols, self.inner.sms));
            let blocks = w.rows.div_ceil(16 * (NV_WARPS as usize / ks));
            return launch!(self, &self.inner.f.gemv_mma, (blocks as u32, 1, 1), (32 * NV_WARPS, 1, 1);
                self.ptr(&w.data), w.scales_ptr(self), w.inv_g, x, y, bias, resid,
                w.rows as i32, w.cols as i32, ks as i32);
        }
        if t == 1 && fast && w.fmt == 3 && w.cols <= NV_MAX_K && !self.legacy_gemv() {
            let tune = nv_tune();
            let (mut ki, mut ks) = nv_split(w.rows, w.cols, self.inner.sms);
            if let Some(f) = tune.ks {
                ks = f;
                ki = f.trailing_zeros() as usize;
            }
            let tile = (NV_WARPS as usize / ks) * NV_ROWS;
            // persistent blocks (as many as are resident), each staging x in shared memory once;
            // `grid_per_sm` 0: one block per tile.
            let tiles = w.rows.div_ceil(tile);
            let blocks = match tune.grid_per_sm {
                0 => tiles,
                g => tiles.min(g * self.inner.sms),
            };
            let ki = ki + if tune.minb == 3 { 4 } else { 0 };
            let grid = (blocks as u32, 1, 1);
            return launch!(self, &self.inner.f.gemv_nv[ki], grid, (32 * NV_WARPS, 1, 1);
                self.ptr(&w.data), w.scales_ptr(self), w.inv_g, x, y, bias, resid,
                w.rows as i32, w.cols as i32);
        }
        if t == 1 && fast && !self.legacy_gemv() {
            // Rows per warp: as many as keep >= 16 warps per SM busy (x is reused across them).
            let target = 16 * self.inner.sms;
            let (ri, r) = [(3usize, 8usize), (2, 4), (1, 2)]
                .into_iter()
                .find(|&(_, r)| w.rows / r >= target)
                .unwrap_or((0, 1));
            let grid = ((w.rows as u32).div_ceil(GEMV_WARPS * r as u32), 1, 1);
            return launch!(self, &self.inner.f.gemv1[ri], grid, (32 * GEMV_WARPS, 1, 1);
                w.fmt, self.ptr(&w.data), w.scales_ptr(self), w.inv_g, x, y, bias, resid,
                w.rows as i32, w.cols as i32);
        }
        if t >= GEMM_MIN_TOKENS && w.cols.is_multiple_of(32) && tiled_prefill() {
            let grid = (
                (w.rows as u32).div_ceil(GEMM_ROWS),
                (t as u32).div_ceil(GEMM_TOKENS),
                1,
            );
            return launch!(self, &self.inner.f.gemm_tiled, grid, (256, 1, 1);
                w.fmt, self.ptr(&w.data), w.scales_ptr(self), w.inv_g, x, y, bias, resid,
                w.rows as i32, w.cols as i32, t as i32);
        }
        let grid = (
            (w.rows as u32).div_ceil(GEMV_WARPS),
            t.div_ceil(GEMV_TOKENS) as u32,
            1,
        );
        launch!(self, &self.inner.f.linear, grid, (32 * GEMV_WARPS, 1, 1);
            w.fmt, self.ptr(&w.data), w.scales_ptr(self), w.inv_g, x, y, bias, resid,
            w.rows as i32, w.cols as i32, t as i32)
    }

    /// One token's per-head q/k RMSNorms (`qn`, `kn`: 0 for none) and rope at `pos` over
    /// `q` (`heads` heads) and `k` (the cache's kv heads), in place, and the rotated k row and
    /// the `v` row written into cache slot `slot`, in one launch (`qk_norm_rope`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn qk_norm_rope_raw(
        &self,
        q: u64,
        k: u64,
        v: u64,
        (qn, kn, eps): (u64, u64, f32),
        heads: usize,
        (inv_freq, rdim, attn_factor): (u64, usize, f32),
        pos: usize,
        cache: &CudaKvLayer,
        slot: usize,
    ) -> Result<()> {
        let (kvh, d) = (cache.spec.kv_heads, cache.spec.head_dim);
        // one thread per value of a head, whole warps (the block sum reads every warp's share)
        let threads = d.div_ceil(32) * 32;
        launch!(self, &self.inner.f.qk_norm_rope, ((heads + 2 * kvh) as u32, 1, 1), (threads as u32, 1, 1);
            q, k, qn, kn, heads as i32, d as i32, eps, inv_freq, rdim as i32, attn_factor, pos as i32,
            self.ptr(&cache.k), self.ptr(&cache.v), v, slot as i64, kvh as i32, cache.kv_t,
            cache.k_scale, cache.v_scale)
    }

    /// Whether `linear_multi` takes inputs of width `k` (`K % 32 == 0`, `K <= XS_MAX`).
    pub fn linear_multi_applies(k: usize) -> bool {
        k > 0 && k.is_multiple_of(32) && k <= NV_MAX_K
    }

    /// `x · W_iᵀ` for each of `ws` (at most 6, all of `x`'s width, which
    /// `linear_multi_applies`) over one token `x` (`[1, cols]`), in one launch: the q/k/v/gate
    /// projections of a decode step.
    pub fn linear_multi(&self, x: &CudaTensor, ws: &[&CudaLinear]) -> Result<Vec<CudaTensor>> {
        self.check(x.rows == 1, || {
            format!("linear_multi of {} tokens (one only)", x.rows)
        })?;
        let ys = ws
            .iter()
            .map(|w| self.tensor(1, w.rows))
            .collect::<Result<Vec<_>>>()?;
        let parts: Vec<(&CudaLinear, u64)> = ws
            .iter()
            .zip(&ys)
            .map(|(w, y)| (*w, self.ptr(&y.buf)))
            .collect();
        self.linear_multi_raw(&MultiLinear::new(self, &parts, x.cols)?, self.ptr(&x.buf))?;
        Ok(ys)
    }

    /// The linears of `m` over one token's `x` in one launch (`linear_multi2`).
    pub(crate) fn linear_multi_raw(&self, m: &MultiLinear, x: u64) -> Result<()> {
        launch!(self, &self.inner.f.linear_multi2, (m.blocks, 1, 1), (32 * MULTI_WARPS, 1, 1);
            m.segs, x, m.k as i32, i32::from(self.inner.mma))
    }

    /// `FP4FORGE_CUDA_LEGACY_GEMV=1` uses the one-row-per-warp kernel for decode (comparisons).
    fn legacy_gemv(&self) -> bool {
        static L: OnceLock<bool> = OnceLock::new();
        *L.get_or_init(|| std::env::var_os("FP4FORGE_CUDA_LEGACY_GEMV").is_some())
    }
}

/// One linear of a `linear_multi2` launch (`Seg` in kernels.cu; layout identical).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Seg {
    w: u64,
    scales: u64,
    y: u64,
    inv_g: f32,
    fmt: i32,
    n: i32,
    block0: i32,
}

/// The segments of a `linear_multi2` launch (`Segs` in kernels.cu; layout identical): segment
/// `s` covers the blocks from its `block0` to the next one's.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Segs {
    s: [Seg; 6],
    n: i32,
    _pad: i32,
}
// SAFETY: plain old data matching the C structs.
unsafe impl DeviceRepr for Segs {}

/// Up to [`MultiLinear::MAX`] linears of one input vector (one token) in one launch
/// (`linear_multi2`): q/k/v/gate, or an MLP's gate and up.
#[derive(Clone, Copy)]
pub(crate) struct MultiLinear {
    segs: Segs,
    blocks: u32,
    k: usize,
}

impl MultiLinear {
    /// Most linears in one launch.
    pub(crate) const MAX: usize = 6;

    /// `y_i = x · W_iᵀ` for each `(W_i, y_i)` of `parts`; every `W_i` takes `k` inputs and
    /// `CudaBackend::linear_multi_applies(k)` holds.
    pub(crate) fn new(b: &CudaBackend, parts: &[(&CudaLinear, u64)], k: usize) -> Result<Self> {
        b.check(
            CudaBackend::linear_multi_applies(k)
                && !parts.is_empty()
                && parts.len() <= Self::MAX
                && parts.iter().all(|(w, _)| w.cols == k),
            || format!("linear_multi: {} linears of {k} inputs", parts.len()),
        )?;
        let mut segs = Segs::default();
        let mut block0 = 0u32;
        for (i, (w, y)) in parts.iter().enumerate() {
            segs.s[i] = Seg {
                w: b.ptr(&w.data),
                scales: w.scales_ptr(b),
                y: *y,
                inv_g: w.inv_g,
                fmt: w.fmt,
                n: w.rows as i32,
                block0: block0 as i32,
            };
            block0 += (w.rows as u32).div_ceil(b.multi_rows_per_block(w, k));
        }
        segs.n = parts.len() as i32;
        Ok(Self {
            segs,
            blocks: block0,
            k,
        })
    }
}

/// Work fused into a decode kernel's last block (`Epi` in kernels.cu; layout identical): kind 0
/// none, 1 `out = rmsnorm(x) · w` of one row of `n` values.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct Epi {
    counter: u64,
    x: u64,
    w: u64,
    out: u64,
    eps: f32,
    kind: i32,
    n: i32,
    _pad: i32,
}
// SAFETY: plain old data matching the C struct's layout.
unsafe impl DeviceRepr for Epi {}

impl Epi {
    /// `out = rmsnorm(x) · w` over `n` values.
    pub(crate) fn norm(b: &CudaBackend, x: u64, w: u64, out: u64, n: usize, eps: f32) -> Self {
        Self {
            counter: b.ptr(&b.inner.counters),
            x,
            w,
            out,
            eps,
            kind: 1,
            n: n as i32,
            _pad: 0,
        }
    }

    /// Whether a kernel of `threads` threads per block can run it in its last block (`EPI_V`
    /// float4s per thread).
    fn fusable(&self, threads: usize) -> bool {
        self.kind == 1 && self.n % 4 == 0 && (self.n as usize) <= 32 * threads
    }
}

/// The router's top-k for `experts_raw` (`Route` in kernels.cu; layout identical): computed
/// inside the persistent gate/up kernel where it applies, else by the `route` kernel first.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct Route {
    logits: u64,
    bias: u64,
    softcap: f32,
    scale: f32,
    n: i32,
    softmax: i32,
    normalize: i32,
    _pad: i32,
}
// SAFETY: plain old data matching the C struct's layout.
unsafe impl DeviceRepr for Route {}

impl Route {
    /// The decision of `p` over `n` experts from `logits` (`bias` 0: none), weights × `scale`.
    pub(crate) fn new(logits: u64, bias: u64, n: usize, p: &RouterParams, scale: f32) -> Self {
        Self {
            logits,
            bias,
            softcap: p.logit_softcap,
            scale,
            n: n as i32,
            softmax: i32::from(p.scoring == RouterScoring::Softmax),
            normalize: i32::from(p.normalize),
            _pad: 0,
        }
    }
}

/// The per-head q/k norms, rope and KV append of a decode step, done by the decode attention
/// kernel (`Prep` in kernels.cu; layout identical).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct AttnPrep {
    qn: u64,
    kn: u64,
    inv_freq: u64,
    kc: u64,
    vc: u64,
    slot: i64,
    eps: f32,
    attn_factor: f32,
    rdim: i32,
    on: i32,
}
// SAFETY: plain old data matching the C struct's layout.
unsafe impl DeviceRepr for AttnPrep {}

impl AttnPrep {
    /// Norm weights `qn`, `kn` (0: none, each `head_dim` long), rope `inv_freq` over the first
    /// `rdim` dims scaled by `attn_factor`, and the new rows written to `slot` of `cache`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        b: &CudaBackend,
        cache: &CudaKvLayer,
        slot: usize,
        qn: u64,
        kn: u64,
        eps: f32,
        inv_freq: u64,
        rdim: usize,
        attn_factor: f32,
    ) -> Self {
        Self {
            qn,
            kn,
            inv_freq,
            kc: b.ptr(&cache.k),
            vc: b.ptr(&cache.v),
            slot: slot as i64,
            eps,
            attn_factor,
            rdim: rdim as i32,
            on: 1,
        }
    }
}

/// Largest top-k the device samples (`SAMPLE_K_MAX`); beyond it the host sorts.
const SAMPLE_K_MAX: usize = 256;

/// Resident blocks per SM of the persistent MoE kernels (`__launch_bounds__(256, 2)`).
const PERSIST_BLOCKS_PER_SM: usize = 2;
/// B entries for all routed items in `experts_down_p` (`XB_ITEMS_MAX`).
const PERSIST_XB_ENTRIES: usize = 5120;

/// Columns of one chunk of the tensor-core NVFP4 GEMV (a lane's 16 bytes of a row = 32 columns).
const MMA_CHUNK: usize = 128;
/// Chunks of x one warp of `gemv_mma` stages for itself (`XW_CHUNKS`).
const MMA_WARP_CHUNKS: usize = 9;

/// K split (warps per 16-row tile: 1, 2, 4, 8) of `gemv_mma` for `rows x cols`: the smallest
/// that leaves each warp at most 8 chunks, then larger while the grid has fewer blocks than SMs
/// and each warp keeps at least 2 chunks.
fn mma_split(rows: usize, cols: usize, sms: usize) -> usize {
    let chunks = cols / MMA_CHUNK;
    let tiles = rows.div_ceil(16);
    let mut ks = 1;
    while ks < 8 && chunks > 8 * ks {
        ks *= 2;
    }
    while ks < 8 && chunks >= 4 * ks && tiles.div_ceil(NV_WARPS as usize / ks) < sms {
        ks *= 2;
    }
    ks
}

/// `(kernel index, K split)` of the NVFP4 decode GEMV for `rows x cols`: the smallest split of K
/// over warps (1, 2, 4, 8) that gives at least ~32 row-group warps per SM, while every warp keeps
/// at least one 32-element chunk per lane.
fn nv_split(rows: usize, cols: usize, sms: usize) -> (usize, usize) {
    let chunks = cols / 32;
    let warps = rows.div_ceil(NV_ROWS);
    let target = 32 * sms;
    let mut best = (0, 1);
    for (i, ks) in [1usize, 2, 4, 8].into_iter().enumerate() {
        if ks > 1 && chunks < 32 * ks {
            break;
        }
        best = (i, ks);
        if warps * ks >= target {
            break;
        }
    }
    best
}

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
    pub(crate) fn scales_ptr(&self, b: &CudaBackend) -> u64 {
        self.scales.as_ref().map_or(0, |s| b.ptr(s))
    }

    /// Bytes resident on the device.
    pub fn bytes(&self) -> usize {
        self.data.len() + self.scales.as_ref().map_or(0, |s| s.len())
    }
}

/// One projection of all experts of a layer, stacked `[E, rows, cols]`.
pub struct ExpertArena {
    pub(crate) fmt: i32,
    pub(crate) data: CudaSlice<u8>,
    pub(crate) scales: Option<CudaSlice<u8>>,
    pub(crate) inv_g: CudaSlice<f32>,
}

/// The kernel-side description of an [`ExpertArena`] (`ExpertProj` in kernels.cu).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ExpertProj {
    w: u64,
    scales: u64,
    inv_g: u64,
    fmt: i32,
    _pad: i32,
}
// SAFETY: plain old data matching the C struct's layout.
unsafe impl DeviceRepr for ExpertProj {}

impl ExpertArena {
    pub(crate) fn proj(&self, b: &CudaBackend) -> ExpertProj {
        ExpertProj {
            w: b.ptr(&self.data),
            scales: self.scales.as_ref().map_or(0, |s| b.ptr(s)),
            inv_g: b.ptr(&self.inv_g),
            fmt: self.fmt,
            _pad: 0,
        }
    }
}

/// All routed experts of one MoE layer.
pub struct CudaExperts {
    pub(crate) gate: ExpertArena,
    pub(crate) up: ExpertArena,
    pub(crate) down: ExpertArena,
    pub(crate) n: usize,
    pub(crate) inter: usize,
    pub(crate) hidden: usize,
}

/// A rotary embedding: `inv_freq` on the device; cos/sin computed in the kernel.
pub struct CudaRope {
    pub(crate) inv_freq: CudaSlice<f32>,
    pub(crate) rotary_dim: usize,
    pub(crate) attention_factor: f32,
}

/// One layer's KV cache on the device: `[slot, kv_heads, head_dim]`, a ring of `window` slots
/// for sliding layers, growing (doubling) for full ones.
pub struct CudaKvLayer {
    spec: KvLayerSpec,
    pub(crate) len: usize,
    pub(crate) cap: usize,
    pub(crate) k: CudaSlice<u8>,
    pub(crate) v: CudaSlice<u8>,
    /// 0 = f32, 1 = fp8 e4m3, 2 = bf16.
    pub(crate) kv_t: i32,
    /// fp8: stored values are e4m3(x / scale) (1 for the other types).
    pub(crate) k_scale: f32,
    pub(crate) v_scale: f32,
}

impl CudaKvLayer {
    fn elem(&self) -> usize {
        match self.kv_t {
            2 => 2,
            1 => 1,
            _ => 4,
        }
    }
}

/// Selected experts and weights per token, on the device.
pub struct CudaRouting {
    pub(crate) sel: CudaSlice<i32>,
    pub(crate) wts: CudaSlice<f32>,
    pub(crate) top_k: usize,
    pub(crate) tokens: usize,
}

fn fmt_of(w: &LinearWeight) -> i32 {
    match w {
        LinearWeight::F32 { .. } => 0,
        LinearWeight::F16 { .. } => 1,
        LinearWeight::Bf16 { .. } => 2,
        LinearWeight::Nvfp4 { .. } => 3,
    }
}

impl CudaBackend {
    fn kv_grow(&self, c: &mut CudaKvLayer, need: usize) -> Result<()> {
        let row_bytes = c.spec.row_width() * c.elem();
        let target = match c.spec.window {
            Some(w) => w,
            None if need <= c.cap => return Ok(()),
            None => need.max(c.cap * 2).max(256),
        };
        if target <= c.cap {
            return Ok(());
        }
        let mut k = self.alloc::<u8>(target * row_bytes)?;
        let mut v = self.alloc::<u8>(target * row_bytes)?;
        let used = c.cap.min(c.len) * row_bytes;
        if used > 0 {
            self.inner
                .stream
                .memcpy_dtod(&c.k.slice(0..used), &mut k.slice_mut(0..used))
                .map_err(|e| self.err(format!("{e:?}")))?;
            self.inner
                .stream
                .memcpy_dtod(&c.v.slice(0..used), &mut v.slice_mut(0..used))
                .map_err(|e| self.err(format!("{e:?}")))?;
        }
        c.k = k;
        c.v = v;
        c.cap = target;
        Ok(())
    }

    fn attn_func(&self, kv_t: i32, d: usize) -> Result<&CudaFunction> {
        let i = match d {
            d if d <= 32 => 0,
            d if d <= 64 => 1,
            d if d <= 128 => 2,
            _ => return Err(self.err(format!("head_dim {d} > 128"))),
        };
        Ok(&self.inner.f.attn[i + 3 * kv_t as usize])
    }

    /// Whether a decode step (`t` = 1) over `cache` with heads of `head_dim` takes the grouped
    /// decode kernel (bf16 cache, head_dim 64 or 128), the one that can also do the q/k norms,
    /// rope and KV append itself (`AttnPrep`).
    pub(crate) fn dec_attention_applies(cache: &CudaKvLayer, head_dim: usize, t: usize) -> bool {
        t == 1 && cache.kv_t == 2 && matches!(head_dim, 64 | 128)
    }

    /// Attention of `t` query rows (raw pointers) over `cache` (positions `< pos0`) and the
    /// chunk `k`, `v`; writes `out` (with `softplus(gate)` applied when `gate != 0`). Does not
    /// append, unless `prep` is given: then q and k arrive as projected, and the kernel applies
    /// the per-head norms and rope and writes the new key and value rows into cache slot
    /// `prep.slot` (only where `dec_attention_applies`). `scratch` holds the split partials
    /// (`part_o`, `part_ml`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_raw(
        &self,
        q: u64,
        k: u64,
        v: u64,
        cache: &CudaKvLayer,
        pos0: usize,
        t: usize,
        p: &AttentionParams,
        out: u64,
        gate: u64,
        splits: usize,
        scratch: Option<(u64, u64)>,
        prep: Option<AttnPrep>,
    ) -> Result<()> {
        let g = p.heads / p.kv_heads;
        let ngroups = g.div_ceil(ATTN_GMAX);
        let window = cache.spec.window.unwrap_or(0) as i32;
        let grid = ((p.kv_heads * ngroups) as u32, t as u32, splits as u32);
        let (po, pml) = scratch.unwrap_or((0, 0));
        // Decode over bf16 caches: the grouped kernel (ngroups blocks split a kv head's queries).
        let dec_ok = Self::dec_attention_applies(cache, p.head_dim, t);
        self.check(dec_ok || prep.is_none(), || {
            format!(
                "attention: norms + rope inside the kernel need a bf16 cache, head_dim 64 or 128 \
                 and one token (kv type {}, head_dim {}, {t} tokens)",
                cache.kv_t, p.head_dim
            )
        })?;
        let dec = match p.head_dim {
            64 if dec_ok => Some(&self.inner.f.attn_dec[0]),
            128 if dec_ok => {
                let keys = pos0 + 1;
                let keys = cache.spec.window.map_or(keys, |w| keys.min(w));
                let short = self
                    .inner
                    .attn_short_keys
                    .load(std::sync::atomic::Ordering::Relaxed);
                Some(&self.inner.f.attn_dec[if keys <= short { 2 } else { 1 }])
            }
            _ => None,
        };
        if let Some(func) = dec {
            launch!(self, func, grid, (128, 1, 1);
                q, k, v, self.ptr(&cache.k), self.ptr(&cache.v), out, po, pml,
                p.heads as i32, p.kv_heads as i32, p.scale,
                pos0 as i32, window, splits as i32, ngroups as i32, prep.unwrap_or_default())?;
        } else {
            let func = self.attn_func(cache.kv_t, p.head_dim)?;
            launch!(self, func, grid, (128, 1, 1);
                q, k, v, self.ptr(&cache.k), self.ptr(&cache.v), out, po, pml,
                t as i32, p.heads as i32, p.kv_heads as i32, p.head_dim as i32, p.scale,
                pos0 as i32, window, splits as i32, ngroups as i32, cache.k_scale, cache.v_scale)?;
        }
        if splits > 1 {
            launch!(self, &self.inner.f.attn_combine, (p.heads as u32, t as u32, 1),
                (p.head_dim.max(32) as u32, 1, 1);
                po, pml, out, gate, p.heads as i32, p.head_dim as i32, splits as i32)?;
        } else if gate != 0 {
            let n = t * p.heads * p.head_dim;
            launch!(self, &self.inner.f.softplus_gate, ((n as u32).div_ceil(256), 1, 1), (256, 1, 1);
                out, gate, n as i64, p.head_dim as i32)?;
        }
        Ok(())
    }

    /// Number of key splits for a decode step of `p` over `keys` keys: as many blocks as fill one
    /// wave of the attention kernel (`ATTN_SPLIT_BLOCKS_PER_SM`; decode attention is latency-bound
    /// and needs warps in flight, but a partial second wave and more partial results to merge
    /// cost more), at least `ATTN_SPLIT_MIN_KEYS` keys (one round of the block's 4 warps) per
    /// split. Prefill (`t > 1`): one.
    pub(crate) fn splits_for(&self, keys: usize, p: &AttentionParams, t: usize) -> usize {
        if t > 1 {
            return 1;
        }
        // blocks per split: each kv head's query heads in groups of at most ATTN_GMAX
        let blocks = p.kv_heads * (p.heads / p.kv_heads.max(1)).div_ceil(ATTN_GMAX);
        let (min_keys, per_sm) = {
            let v = self
                .inner
                .split_knobs
                .load(std::sync::atomic::Ordering::Relaxed);
            ((v >> 16) as usize, (v & 0xffff) as usize)
        };
        let per_sm = if per_sm == 0 {
            // resident blocks per SM (`__launch_bounds__`): the short-span head_dim-128 kernel 2,
            // the others 4
            let short = self
                .inner
                .attn_short_keys
                .load(std::sync::atomic::Ordering::Relaxed);
            if p.head_dim == 128 && keys <= short {
                2
            } else {
                4
            }
        } else {
            per_sm
        };
        let want = (per_sm * self.inner.sms / blocks.max(1)).max(1);
        want.min(keys.div_ceil(min_keys.max(1)))
            .clamp(1, MAX_SPLITS)
    }

    pub(crate) fn kv_append_raw(
        &self,
        cache: &mut CudaKvLayer,
        k: u64,
        v: u64,
        t: usize,
    ) -> Result<()> {
        let width = cache.spec.row_width();
        let window = cache.spec.window.unwrap_or(0) as i32;
        launch!(self, &self.inner.f.kv_append, (t as u32, 1, 1), (128, 1, 1);
            self.ptr(&cache.k), self.ptr(&cache.v), k, v, t as i32, cache.len as i32,
            window, width as i32, cache.kv_t, cache.k_scale, cache.v_scale)?;
        cache.len += t;
        Ok(())
    }

    fn arena(&self, name: &str, ws: &[&LinearWeight]) -> Result<ExpertArena> {
        let fmt = fmt_of(ws[0]);
        let (rows, cols) = (ws[0].rows(), ws[0].cols());
        self.check(
            ws.iter()
                .all(|w| fmt_of(w) == fmt && w.rows() == rows && w.cols() == cols),
            || format!("`{name}`: experts of one layer differ in encoding or shape"),
        )?;
        let mut data = Vec::new();
        let mut scales = Vec::new();
        let mut inv = Vec::with_capacity(ws.len());
        for w in ws {
            match w {
                LinearWeight::Bf16 { data: d, .. }
                | LinearWeight::F16 { data: d, .. }
                | LinearWeight::F32 { data: d, .. } => {
                    data.extend_from_slice(d.as_slice());
                    inv.push(1.0);
                }
                LinearWeight::Nvfp4 {
                    packed,
                    scales: s,
                    global_scale,
                    ..
                } => {
                    data.extend_from_slice(packed.as_slice());
                    scales.extend_from_slice(s.as_slice());
                    inv.push(1.0 / global_scale);
                }
            }
        }
        Ok(ExpertArena {
            fmt,
            data: self.upload_bytes(&data)?,
            scales: if fmt == 3 {
                Some(self.upload_bytes(&scales)?)
            } else {
                None
            },
            inv_g: self
                .inner
                .stream
                .clone_htod(&inv)
                .map_err(|e| self.err(format!("{e:?}")))?,
        })
    }
}

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Linear = CudaLinear;
    type Experts = CudaExperts;
    type Rope = CudaRope;
    type KvLayer = CudaKvLayer;
    type Routing = CudaRouting;

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
            cap: 0,
            k: self.alloc(1)?,
            v: self.alloc(1)?,
            kv_t,
            k_scale: scale(spec.k_scale),
            v_scale: scale(spec.v_scale),
        })
    }

    fn kv_layer_bytes(&self, layer: &CudaKvLayer) -> usize {
        2 * layer.cap * layer.spec.row_width() * layer.elem()
    }

    fn kv_fork(&self, layer: &CudaKvLayer, len: usize) -> Result<CudaKvLayer> {
        self.check(layer.spec.can_fork(layer.len, len), || {
            format!(
                "KV copy of {len} positions of a layer holding {}",
                layer.len
            )
        })?;
        let mut out = self.new_kv_layer(&layer.spec)?;
        // unwrapped: rows 0..len are positions 0..len; wrapped (len is the whole sequence): the ring
        let rows = len.min(layer.cap);
        self.kv_grow(&mut out, rows)?;
        let bytes = rows * layer.spec.row_width() * layer.elem();
        if bytes > 0 {
            for (src, dst) in [(&layer.k, &mut out.k), (&layer.v, &mut out.v)] {
                self.inner
                    .stream
                    .memcpy_dtod(&src.slice(0..bytes), &mut dst.slice_mut(0..bytes))
                    .map_err(|e| self.err(format!("{e:?}")))?;
            }
        }
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
        launch!(self, &self.inner.f.embed, (ids.len() as u32, 1, 1), (256, 1, 1);
            table.fmt, self.ptr(&table.data), table.scales_ptr(self), table.inv_g,
            self.ptr(&d_ids), self.ptr(&out.buf), table.cols as i32)?;
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
        if groups > 0 {
            let threads = if width >= 1024 { 512 } else { 128 };
            launch!(self, &self.inner.f.rms_norm, (groups as u32, 1, 1), (threads, 1, 1);
                self.ptr(&x.buf), self.ptr(&w.buf), self.ptr(&out.buf), width as i32, eps)?;
        }
        Ok(out)
    }

    fn linear(
        &self,
        x: &CudaTensor,
        w: &CudaLinear,
        bias: Option<&CudaTensor>,
    ) -> Result<CudaTensor> {
        self.check(x.cols == w.cols, || {
            format!("`{}` takes {} inputs, got {}", w.name, w.cols, x.cols)
        })?;
        if let Some(b) = bias {
            self.check(b.rows * b.cols == w.rows, || {
                format!("bias for `{}`", w.name)
            })?;
        }
        let y = self.tensor(x.rows, w.rows)?;
        if x.rows > 0 {
            self.gemv_raw(
                w,
                self.ptr(&x.buf),
                self.ptr(&y.buf),
                bias.map_or(0, |b| self.ptr(&b.buf)),
                0,
                x.rows,
            )?;
        }
        Ok(y)
    }

    fn rope(
        &self,
        x: &mut CudaTensor,
        rope: &CudaRope,
        head_dim: usize,
        pos0: usize,
    ) -> Result<()> {
        self.check(
            head_dim > 0 && x.cols.is_multiple_of(head_dim) && rope.rotary_dim <= head_dim,
            || format!("rope of head_dim {head_dim} on {} columns", x.cols),
        )?;
        if x.rows == 0 || rope.rotary_dim < 2 {
            return Ok(());
        }
        let heads = x.cols / head_dim;
        let threads = (rope.rotary_dim / 2).div_ceil(32) * 32;
        launch!(self, &self.inner.f.rope, (heads as u32, x.rows as u32, 1), (threads as u32, 1, 1);
            self.ptr(&x.buf), self.ptr(&rope.inv_freq), heads as i32, head_dim as i32,
            rope.rotary_dim as i32, rope.attention_factor, pos0 as i32)
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
        if spec.window.is_none() || cache.cap == 0 {
            self.kv_grow(cache, pos0 + t)?;
        }
        let keys = match spec.window {
            Some(w) => w.min(pos0 + 1),
            None => pos0 + 1,
        };
        let splits = self.splits_for(keys, p, t);
        let scratch = if splits > 1 {
            let po = self.alloc::<f32>(t * p.heads * splits * p.head_dim)?;
            let pml = self.alloc::<f32>(t * p.heads * splits * 2)?;
            Some((po, pml))
        } else {
            None
        };
        self.attention_raw(
            self.ptr(&q.buf),
            self.ptr(&k.buf),
            self.ptr(&v.buf),
            cache,
            pos0,
            t,
            p,
            self.ptr(&out.buf),
            0,
            splits,
            scratch.as_ref().map(|(a, b)| (self.ptr(a), self.ptr(b))),
            None,
        )?;
        self.kv_append_raw(cache, self.ptr(&k.buf), self.ptr(&v.buf), t)?;
        drop(scratch);
        Ok(out)
    }

    fn softplus_gate(&self, x: &mut CudaTensor, gate: &CudaTensor) -> Result<()> {
        self.check(
            gate.rows == x.rows && gate.cols > 0 && x.cols.is_multiple_of(gate.cols),
            || {
                format!(
                    "gate {:?} for {:?}",
                    (gate.rows, gate.cols),
                    (x.rows, x.cols)
                )
            },
        )?;
        let n = x.rows * x.cols;
        if n == 0 {
            return Ok(());
        }
        launch!(self, &self.inner.f.softplus_gate, ((n as u32).div_ceil(256), 1, 1), (256, 1, 1);
            self.ptr(&x.buf), self.ptr(&gate.buf), n as i64, (x.cols / gate.cols) as i32)
    }

    fn silu_mul(&self, gate: &CudaTensor, up: &CudaTensor) -> Result<CudaTensor> {
        self.check(gate.rows == up.rows && gate.cols == up.cols, || {
            "silu_mul of different shapes".into()
        })?;
        let out = self.tensor(gate.rows, gate.cols)?;
        let n = gate.rows * gate.cols;
        if n > 0 {
            launch!(self, &self.inner.f.silu_mul, ((n as u32).div_ceil(256), 1, 1), (256, 1, 1);
                self.ptr(&gate.buf), self.ptr(&up.buf), self.ptr(&out.buf), n as i64)?;
        }
        Ok(out)
    }

    fn add_scaled(&self, y: &mut CudaTensor, alpha: f32, x: &CudaTensor) -> Result<()> {
        self.check(y.rows == x.rows && y.cols == x.cols, || {
            "add of different shapes".into()
        })?;
        let n = y.rows * y.cols;
        if n == 0 {
            return Ok(());
        }
        launch!(self, &self.inner.f.add_scaled, ((n as u32).div_ceil(256), 1, 1), (256, 1, 1);
            self.ptr(&y.buf), alpha, self.ptr(&x.buf), n as i64)
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
            launch!(self, &self.inner.f.route, (t as u32, 1, 1), (32, 1, 1);
                self.ptr(&logits.buf), bias.map_or(0, |b| self.ptr(&b.buf)), n as i32,
                p.top_k as i32, i32::from(p.scoring == RouterScoring::Softmax),
                i32::from(p.normalize), p.logit_softcap, scale, self.ptr(&sel), self.ptr(&wts))?;
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
        let h = self.alloc::<f32>(t * r.top_k * e.inter)?;
        let part = self.alloc::<f32>(t * r.top_k * e.hidden)?;
        self.experts_raw(
            e,
            None,
            &r.sel,
            &r.wts,
            r.top_k,
            t,
            self.ptr(&x.buf),
            self.ptr(&h),
            self.ptr(&part),
            self.ptr(&out.buf),
            0,
            Epi::default(),
            None,
        )?;
        Ok(out)
    }

    fn sample(
        &self,
        logits: &CudaTensor,
        params: &SamplingParams,
        u: Option<f64>,
    ) -> Result<Option<u32>> {
        let greedy = params.is_greedy() || u.is_none();
        if logits.rows != 1 || !(greedy || (2..=SAMPLE_K_MAX).contains(&params.top_k)) {
            return Ok(None);
        }
        let out = self.alloc::<u32>(1)?;
        let (temperature, top_k) = if greedy {
            (0.0, 1)
        } else {
            (params.temperature, params.top_k as i32)
        };
        launch!(self, &self.inner.f.sample_logits, (1, 1, 1), (1024, 1, 1);
            self.ptr(&logits.buf), logits.cols as i32, temperature, top_k, params.top_p,
            u.unwrap_or(0.0), self.ptr(&out))?;
        let id = self
            .inner
            .stream
            .clone_dtoh(&out)
            .map_err(|e| self.err(format!("download: {e:?}")))?;
        Ok(id.first().copied())
    }

    #[allow(private_interfaces)]
    fn decode_step(
        &self,
        decoder: &Decoder<Self>,
        kv: &mut [CudaKvLayer],
        id: u32,
        pos0: usize,
    ) -> Result<Option<CudaTensor>> {
        self.decode_fused(decoder, kv, id, pos0)
    }
}

/// A shared expert for the fused MoE kernels: gate, up, down (each one resident linear).
pub(crate) struct SharedExpert<'a> {
    pub gate: &'a CudaLinear,
    pub up: &'a CudaLinear,
    pub down: &'a CudaLinear,
}

impl CudaBackend {
    /// `l` as an expert projection whose `1 / global_scale` is the f32 at device address `inv`.
    fn lin_proj(&self, l: &CudaLinear, inv: u64) -> ExpertProj {
        ExpertProj {
            w: self.ptr(&l.data),
            scales: l.scales_ptr(self),
            inv_g: inv,
            fmt: l.fmt,
            _pad: 0,
        }
    }

    /// Routed (and optionally shared) experts in three launches (gate/up, down, ordered sum):
    /// `out = resid + Σ w·E(x) [+ S(x)]`. `h` holds `items × max(inter, shared_inter)` floats and
    /// `part` `items × hidden`, `items = t·k [+ t]`. With `route`, `sel` / `wts` are outputs: the
    /// router's top-k is computed first (inside the gate/up kernel on the persistent path, else
    /// by the `route` kernel); without, they are inputs. `epi` runs after the sum (in its last
    /// block for one token).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn experts_raw(
        &self,
        e: &CudaExperts,
        shared: Option<(&SharedExpert<'_>, [u64; 3])>,
        sel: &CudaSlice<i32>,
        wts: &CudaSlice<f32>,
        k: usize,
        t: usize,
        x: u64,
        h: u64,
        part: u64,
        out: u64,
        resid: u64,
        epi: Epi,
        route: Option<&Route>,
    ) -> Result<()> {
        let (sg, su, sd, sinter) = match &shared {
            Some((s, inv)) => (
                self.lin_proj(s.gate, inv[0]),
                self.lin_proj(s.up, inv[1]),
                self.lin_proj(s.down, inv[2]),
                s.gate.rows,
            ),
            None => (
                ExpertProj::default(),
                ExpertProj::default(),
                ExpertProj::default(),
                0,
            ),
        };
        let has = i32::from(shared.is_some());
        let persistent = self.persistent_moe(e, &shared, k, t);
        let fused_route = match route {
            Some(r) if persistent && r.n <= 256 && k <= 32 => *r,
            Some(r) => {
                launch!(self, &self.inner.f.route, (t as u32, 1, 1), (32, 1, 1);
                    r.logits, r.bias, r.n, k as i32, r.softmax, r.normalize, r.softcap, r.scale,
                    self.ptr(sel), self.ptr(wts))?;
                Route::default()
            }
            None => Route::default(),
        };
        if persistent {
            let groups = |rows: usize, per: usize, items: usize| rows.div_ceil(per) * items;
            let shared_n = usize::from(shared.is_some());
            let resident = match self
                .inner
                .persist_grid
                .load(std::sync::atomic::Ordering::Relaxed)
            {
                0 => PERSIST_BLOCKS_PER_SM * self.inner.sms,
                cap => cap.min(PERSIST_BLOCKS_PER_SM * self.inner.sms),
            };
            let gu = groups(e.inter, 16, k) + groups(sinter, 16, shared_n);
            launch!(self, &self.inner.f.experts_gate_up_p, (gu.min(resident) as u32, 1, 1), (256, 1, 1);
                e.gate.proj(self), e.up.proj(self), sg, su, has, sinter as i32, self.ptr(sel),
                self.ptr(wts), k as i32, x, h, e.inter as i32, e.hidden as i32, fused_route)?;
            let dn = groups(e.hidden, 64, k + shared_n);
            launch!(self, &self.inner.f.experts_down_p, (dn.min(resident) as u32, 1, 1), (256, 1, 1);
                e.down.proj(self), sd, has, sinter as i32, self.ptr(sel), self.ptr(wts), k as i32,
                h, e.inter as i32, part, e.hidden as i32)?;
        } else {
            self.experts_per_item(e, sg, su, sd, has, sinter, sel, wts, k, t, x, h, part)?;
        }
        let n = (t * e.hidden) as u32;
        let (fused, separate) = if t == 1 && epi.fusable(256) {
            (epi, false)
        } else {
            (Epi::default(), epi.kind != 0)
        };
        launch!(self, &self.inner.f.experts_reduce, (n.div_ceil(256), 1, 1), (256, 1, 1);
            part, k as i32, t as i32, has, out, resid, e.hidden as i32, fused)?;
        if separate {
            self.epilogue_launch(&epi, t)?;
        }
        Ok(())
    }

    /// Whether one token's experts run on the persistent kernels (`experts_*_p`): tensor cores on
    /// (sm_89+), NVFP4 routed experts with `hidden` and `inter` multiples of 128, every routed
    /// item's `h` staged at once (`k · inter <= 10240`), a BF16 shared expert if any; unless
    /// switched off (`set_persistent_moe`).
    fn persistent_moe(
        &self,
        e: &CudaExperts,
        shared: &Option<(&SharedExpert<'_>, [u64; 3])>,
        k: usize,
        t: usize,
    ) -> bool {
        let on = self
            .inner
            .persist
            .load(std::sync::atomic::Ordering::Relaxed);
        let shared_ok = match shared {
            None => true,
            Some((s, _)) => {
                [s.gate, s.up, s.down].iter().all(|l| l.fmt == 2)
                    && s.gate.rows.is_multiple_of(8)
                    && e.hidden.is_multiple_of(8)
            }
        };
        on && t == 1
            && self.inner.mma
            && [e.gate.fmt, e.up.fmt, e.down.fmt].iter().all(|&f| f == 3)
            && e.hidden.is_multiple_of(MMA_CHUNK)
            && e.hidden <= NV_MAX_K
            && e.inter.is_multiple_of(MMA_CHUNK)
            && k * e.inter <= 2 * PERSIST_XB_ENTRIES
            && k < 64
            && shared_ok
    }

    /// Output rows of one `linear_multi2` block for the segment of weight `w` (input width `k`):
    /// 64 on the tensor-core path, `MULTI_WARPS · MULTI_R` otherwise.
    pub(crate) fn multi_rows_per_block(&self, w: &CudaLinear, k: usize) -> u32 {
        if self.inner.mma && w.fmt == 3 && k.is_multiple_of(MMA_CHUNK) && k <= NV_MAX_K {
            64
        } else {
            MULTI_WARPS * EXPERT_ROWS
        }
    }

    /// Switches the persistent MoE kernels on or off (for comparisons; on by default).
    pub(crate) fn set_persistent_moe(&self, on: bool) {
        self.inner
            .persist
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Sets the attended keys up to which head_dim-128 decode attention takes its short-span
    /// variant (`None`: the default, `ATTN_SHORT_KEYS`; `Some(0)`: never), so tests cover both
    /// variants.
    pub fn set_attn_short_keys(&self, keys: Option<usize>) {
        self.inner.attn_short_keys.store(
            keys.unwrap_or(ATTN_SHORT_KEYS),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Caps the persistent MoE kernels' grid at `blocks` (0: as many as are resident), so that
    /// tests at small shapes make each block walk several groups and items, as at full size.
    pub fn set_persistent_grid(&self, blocks: usize) {
        self.inner
            .persist_grid
            .store(blocks, std::sync::atomic::Ordering::Relaxed);
    }

    /// Gate/up and down of `items` (token, expert) pairs, one grid row per item.
    #[allow(clippy::too_many_arguments)]
    fn experts_per_item(
        &self,
        e: &CudaExperts,
        sg: ExpertProj,
        su: ExpertProj,
        sd: ExpertProj,
        has: i32,
        sinter: usize,
        sel: &CudaSlice<i32>,
        wts: &CudaSlice<f32>,
        k: usize,
        t: usize,
        x: u64,
        h: u64,
        part: u64,
    ) -> Result<()> {
        let items = t * k + if has != 0 { t } else { 0 };
        let rows = e.inter.max(sinter) as u32;
        launch!(self, &self.inner.f.experts_gate_up2,
            (rows.div_ceil(EXPERT_GU_WARPS * EXPERT_GU_ROWS), items as u32, 1),
            (32 * EXPERT_GU_WARPS, 1, 1);
            e.gate.proj(self), e.up.proj(self), sg, su, has, sinter as i32, self.ptr(sel),
            k as i32, t as i32, x, h, e.inter as i32, e.hidden as i32, i32::from(self.inner.mma))?;
        launch!(self, &self.inner.f.experts_down2,
            ((e.hidden as u32).div_ceil(GEMV_WARPS * EXPERT_DOWN_ROWS), items as u32, 1),
            (32 * GEMV_WARPS, 1, 1);
            e.down.proj(self), sd, sinter as i32, self.ptr(sel), self.ptr(wts), k as i32,
            t as i32, h, e.inter as i32, part, e.hidden as i32, i32::from(self.inner.mma))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `gemv_mma` stages each warp's chunks of x in a region of `MMA_WARP_CHUNKS`: the split
    /// must keep every warp within it for every K the kernel takes.
    #[test]
    fn mma_split_keeps_each_warp_within_its_staging_region() {
        for cols in (MMA_CHUNK..=NV_MAX_K).step_by(MMA_CHUNK) {
            for rows in [16, 100, 1024, 3072, 6144, 100_352] {
                for sms in [1, 78, 132] {
                    let ks = mma_split(rows, cols, sms);
                    assert!([1, 2, 4, 8].contains(&ks));
                    assert!(
                        (cols / MMA_CHUNK).div_ceil(ks) <= MMA_WARP_CHUNKS,
                        "{rows} x {cols} on {sms} SMs: split {ks}"
                    );
                }
            }
        }
    }
}
