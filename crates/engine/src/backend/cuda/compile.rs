//! The kernel source and its compilation: NVRTC at start-up for the device's architecture,
//! once per process, and the names of the kernels the backend loads.

use super::*;

/// The kernels' CUDA C source: the files of `kernels/` in dependency order, one translation unit.
pub const KERNELS_CU: &str = concat!(
    include_str!("kernels/common.cu"),
    "\n",
    include_str!("kernels/gemv.cu"),
    "\n",
    include_str!("kernels/prefill.cu"),
    "\n",
    include_str!("kernels/elementwise.cu"),
    "\n",
    include_str!("kernels/attention.cu"),
    "\n",
    include_str!("kernels/moe.cu"),
    "\n",
    include_str!("kernels/sampling.cu"),
);

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
pub(super) const ATTN_KERNELS: [&str; 9] = [
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
pub(super) const ATTN_DEC_KERNELS: [&str; 3] = [
    "attn_dec_bf16_64",
    "attn_dec_bf16_128",
    "attn_dec_bf16_128_short",
];

/// One-token GEMV with 1, 2, 4, 8 rows per warp.
pub(super) const GEMV1_KERNELS: [&str; 4] = ["gemv1_r1", "gemv1_r2", "gemv1_r4", "gemv1_r8"];

/// NVFP4 one-token GEMV with K split over 1, 2, 4, 8 warps; 2 then 3 blocks per SM.
pub(super) const GEMV_NV_KERNELS: [&str; 8] = [
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
pub(super) const SINGLE_KERNELS: [&str; 22] = [
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
/// start-up, and returns the PTX. Needs only NVRTC (no GPU, no driver): a build check. The source
/// is the built-in one unless `FP4FORGE_CUDA_KERNELS` names another ([`CudaOptions::from_env`]).
pub fn compile_kernels(arch: &'static str) -> std::result::Result<String, String> {
    let options = CudaOptions::from_env();
    ptx_for(arch, options.kernels_source.as_deref()).map(|p| p.to_src())
}

/// PTX per architecture and source (`source`: a file compiled instead of [`KERNELS_CU`], the
/// development hook `CudaOptions::kernels_source`), compiled once per process.
pub(super) fn ptx_for(
    arch: &'static str,
    source: Option<&std::path::Path>,
) -> std::result::Result<Ptx, String> {
    type Cache = Vec<(&'static str, Option<std::path::PathBuf>, Ptx)>;
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(Vec::new()));
    let mut c = cache.lock().map_err(|_| "ptx cache poisoned".to_string())?;
    if let Some((_, _, p)) = c
        .iter()
        .find(|(a, s, _)| *a == arch && s.as_deref() == source)
    {
        return Ok(p.clone());
    }
    let opts = CompileOptions {
        arch: Some(arch),
        options: vec!["-std=c++17".into(), "-default-device".into()],
        ..Default::default()
    };
    // The development hook compiles another source (same kernel names and signatures; the
    // kernels/ files concatenated in `KERNELS_CU`'s order with a newline between them), so
    // kernels can be tuned on a GPU machine without rebuilding the binary.
    let text = match source {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("FP4FORGE_CUDA_KERNELS={}: {e}", path.display()))?,
        None => KERNELS_CU.to_string(),
    };
    let ptx = compile_ptx_with_opts(text, opts).map_err(|e| format!("NVRTC: {e}"))?;
    c.push((arch, source.map(|p| p.to_path_buf()), ptx.clone()));
    Ok(ptx)
}
