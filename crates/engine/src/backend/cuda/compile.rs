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

/// Every kernel the backend loads from the compiled source (the `kernels!` tables of `ops/`; the
/// NVRTC build check looks for each in the PTX).
pub fn kernel_entries() -> Vec<&'static str> {
    super::ops::kernel_names()
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
