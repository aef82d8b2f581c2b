//! The kernel source and its compilation: NVRTC for the device's architecture, once per process
//! and, through the kernel cache (a directory of CUBINs), once per machine; and the names of the
//! kernels the backend loads.

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
/// start-up: the PTX and the CUBIN. Needs only NVRTC (no GPU, no driver): a build check. The
/// source is the built-in one unless `FP4FORGE_CUDA_KERNELS` names another
/// ([`CudaOptions::from_env`]); the kernel cache is neither read nor written.
pub fn compile_kernels(arch: &'static str) -> std::result::Result<CompiledKernels, String> {
    let options = CudaOptions::from_env();
    let text = kernel_text(options.kernels_source.as_deref())?;
    nvrtc_compile(&text, arch, &[])
}

/// What ptxas reports of one kernel's resources for one architecture (its `-v` output).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelResources {
    /// The entry point.
    pub name: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of local memory per thread for the stack frame (arrays indexed at run time and
    /// spilled registers).
    pub stack_bytes: u32,
    /// Bytes per thread stored to local memory because the registers ran out.
    pub spill_store_bytes: u32,
    /// Bytes per thread loaded back from those spills.
    pub spill_load_bytes: u32,
    /// Static shared memory per block (dynamic shared memory is the launch's).
    pub shared_bytes: u32,
}

/// Compiles the kernel source (as [`compile_kernels`] does: the built-in one unless
/// `FP4FORGE_CUDA_KERNELS` names another) for `arch` with ptxas reporting, and returns every entry
/// point's registers, stack, spills and static shared memory, in the source's order. A tuning aid
/// that needs no GPU: a kernel that spills under its `__launch_bounds__` shows here.
pub fn kernel_resources(arch: &'static str) -> std::result::Result<Vec<KernelResources>, String> {
    let options = CudaOptions::from_env();
    let text = kernel_text(options.kernels_source.as_deref())?;
    let compiled = nvrtc_compile(&text, arch, &["-Xptxas=-v"])?;
    Ok(parse_ptxas_report(&compiled.log))
}

/// The kernels of a ptxas `-v` report: per entry point, the `Compiling entry function 'NAME'`
/// line, then `N bytes stack frame, N bytes spill stores, N bytes spill loads`, then `Used N
/// registers, ... N bytes smem` (absent parts: 0; non-inlined device functions are skipped).
fn parse_ptxas_report(log: &str) -> Vec<KernelResources> {
    // the number before `unit` in `line` (`"72 bytes spill stores"`), 0 where it is missing
    let number_before = |line: &str, unit: &str| -> u32 {
        line.find(unit)
            .and_then(|at| line[..at].split_whitespace().last()?.parse().ok())
            .unwrap_or(0)
    };
    let mut out: Vec<KernelResources> = Vec::new();
    let mut current: Option<KernelResources> = None;
    for line in log.lines() {
        if let Some(at) = line.find("Compiling entry function '") {
            out.extend(current.take());
            let rest = &line[at + "Compiling entry function '".len()..];
            let name = rest.split('\'').next().unwrap_or(rest);
            current = Some(KernelResources {
                name: name.to_string(),
                registers: 0,
                stack_bytes: 0,
                spill_store_bytes: 0,
                spill_load_bytes: 0,
                shared_bytes: 0,
            });
        } else if let Some(k) = current.as_mut() {
            if line.contains("bytes stack frame") {
                k.stack_bytes = number_before(line, " bytes stack frame");
                k.spill_store_bytes = number_before(line, " bytes spill stores");
                k.spill_load_bytes = number_before(line, " bytes spill loads");
            } else if line.contains("registers") {
                k.registers = number_before(line, " registers");
                k.shared_bytes = number_before(line, " bytes smem");
                out.extend(current.take());
            }
        }
    }
    out.extend(current);
    out
}

/// What NVRTC made of the kernel source for one architecture.
pub struct CompiledKernels {
    /// The PTX (the source of the build check).
    pub ptx: String,
    /// The device code for the architecture (CUBIN), where NVRTC made one (it does for a real
    /// architecture such as `sm_90`): loading it skips the driver's PTX compilation.
    pub cubin: Option<Vec<u8>>,
    /// NVRTC's log (warnings; ptxas's report where asked for).
    pub log: String,
}

/// The NVRTC options of every compilation (the architecture's comes first).
const NVRTC_OPTIONS: [&str; 2] = ["-std=c++17", "-default-device"];

/// Compiles `text` for `arch` with NVRTC ([`NVRTC_OPTIONS`] and `extra`): the PTX, the CUBIN
/// where NVRTC made one, and the log.
fn nvrtc_compile(
    text: &str,
    arch: &str,
    extra: &[&str],
) -> std::result::Result<CompiledKernels, String> {
    use cudarc::nvrtc::{result, sys};
    if nvrtc_version().is_none() {
        return Err(
            "the NVRTC library (libnvrtc.so.13) cannot be loaded: install CUDA's NVRTC \
                    (e.g. the nvidia-cuda-nvrtc wheel, scripts/fetch-nvrtc.sh) and put its \
                    directory on LD_LIBRARY_PATH"
                .into(),
        );
    }
    let src = std::ffi::CString::new(text).map_err(|_| "a NUL byte in the kernel source")?;
    let prog = result::create_program(&src, None).map_err(|e| format!("NVRTC: {e:?}"))?;
    let mut options = vec![format!("--gpu-architecture={arch}")];
    options.extend(NVRTC_OPTIONS.iter().map(|o| o.to_string()));
    options.extend(extra.iter().map(|o| o.to_string()));
    // SAFETY: `prog` was created above and is destroyed once, below, after its last use.
    let out = unsafe {
        let compiled = result::compile_program(prog, &options);
        let out = match compiled {
            Err(e) => {
                let log = result::get_program_log(prog)
                    .map(|l| c_text(&l))
                    .unwrap_or_default();
                Err(format!("NVRTC ({options:?}): {e:?}\n{log}"))
            }
            Ok(()) => result::get_ptx(prog)
                .map_err(|e| format!("NVRTC PTX: {e:?}"))
                .map(|p| {
                    let mut size = 0usize;
                    let cubin = (sys::nvrtcGetCUBINSize(prog, &mut size).result().is_ok()
                        && size > 0)
                        .then(|| {
                            let mut bin = vec![0u8; size];
                            sys::nvrtcGetCUBIN(prog, bin.as_mut_ptr().cast())
                                .result()
                                .ok()
                                .map(|_| bin)
                        })
                        .flatten();
                    CompiledKernels {
                        ptx: c_text(&p),
                        cubin,
                        log: result::get_program_log(prog)
                            .map(|l| c_text(&l))
                            .unwrap_or_default(),
                    }
                }),
        };
        let _ = result::destroy_program(prog);
        out
    };
    out
}

/// The text of a NUL-terminated C string NVRTC returned (a log, the PTX).
fn c_text(chars: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The kernel source: [`KERNELS_CU`], or the file `source` names (the development hook
/// `CudaOptions::kernels_source`: the same kernel names and signatures, the `kernels/` files
/// concatenated in `KERNELS_CU`'s order with a newline between them, so kernels can be tuned on
/// a GPU machine without rebuilding the binary).
fn kernel_text(source: Option<&std::path::Path>) -> std::result::Result<String, String> {
    match source {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("FP4FORGE_CUDA_KERNELS={}: {e}", path.display())),
        None => Ok(KERNELS_CU.to_string()),
    }
}

/// The file of the kernel cache that holds the CUBIN of `text` for `arch` made by this NVRTC
/// version with [`NVRTC_OPTIONS`]: named by a 64-bit FNV-1a hash of all of them.
fn kernel_cache_file(dir: &std::path::Path, text: &str, arch: &str) -> std::path::PathBuf {
    let version = nvrtc_version().map_or("none".to_string(), |(a, b)| format!("{a}.{b}"));
    let key = format!("{arch}\0{version}\0{}\0", NVRTC_OPTIONS.join(" "));
    let h = fnv1a(key.bytes().chain(text.bytes()));
    dir.join(format!("kernels-{arch}-{h:016x}.cubin"))
}

/// The NVRTC library's version, `None` where none can be loaded.
fn nvrtc_version() -> Option<(i32, i32)> {
    // SAFETY: loading probes only; then two plain out-parameters.
    unsafe {
        if !cudarc::nvrtc::sys::is_culib_present() {
            return None;
        }
        let (mut major, mut minor) = (0, 0);
        cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor)
            .result()
            .ok()?;
        Some((major, minor))
    }
}

/// 64-bit FNV-1a of `bytes`.
fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The CUBIN of a kernel cache file: its bytes after the 8-byte FNV-1a of them, `None` where the
/// file is missing, unreadable, empty or does not match its hash (then it is compiled anew and
/// rewritten).
fn read_cached(file: &std::path::Path) -> Option<Vec<u8>> {
    let bytes = std::fs::read(file).ok()?;
    let (head, bin) = bytes.split_at_checked(8)?;
    let want = u64::from_le_bytes(head.try_into().ok()?);
    (!bin.is_empty() && fnv1a(bin.iter().copied()) == want).then(|| bin.to_vec())
}

/// The loadable kernels for `arch`, once per process and source: the CUBIN from the kernel cache
/// `cache` (a directory; `None`: none) where it holds one for this source, architecture and NVRTC
/// version; else compiled by NVRTC (the CUBIN written to the cache, atomically; a cache that
/// cannot be written is skipped with a warning), or its PTX where NVRTC made no CUBIN.
pub(super) fn module_for(
    arch: &'static str,
    source: Option<&std::path::Path>,
    cache: Option<&std::path::Path>,
) -> std::result::Result<Ptx, String> {
    type Loaded = Vec<(&'static str, Option<std::path::PathBuf>, Ptx)>;
    static LOADED: OnceLock<Mutex<Loaded>> = OnceLock::new();
    let loaded = LOADED.get_or_init(|| Mutex::new(Vec::new()));
    let mut c = loaded
        .lock()
        .map_err(|_| "kernel module cache poisoned".to_string())?;
    if let Some((_, _, p)) = c
        .iter()
        .find(|(a, s, _)| *a == arch && s.as_deref() == source)
    {
        return Ok(p.clone());
    }
    let text = kernel_text(source)?;
    let file = cache.map(|dir| kernel_cache_file(dir, &text, arch));
    let module = match cached_or_compiled(file.as_deref(), || nvrtc_compile(&text, arch, &[]))? {
        Module::Cubin(bin) => Ptx::from_binary(bin),
        Module::Ptx(ptx) => Ptx::from_src(ptx),
    };
    c.push((arch, source.map(|p| p.to_path_buf()), module.clone()));
    Ok(module)
}

/// Loadable kernels: device code, or PTX for the driver to compile.
#[derive(Debug, PartialEq)]
enum Module {
    Cubin(Vec<u8>),
    Ptx(String),
}

/// The CUBIN the kernel cache `file` holds (`None`: no cache), else what `compile` makes, its
/// CUBIN stored in `file` (atomically, behind its hash, the directory created; a cache that
/// cannot be written is skipped with a warning), or its PTX where it made no CUBIN.
fn cached_or_compiled(
    file: Option<&std::path::Path>,
    compile: impl FnOnce() -> std::result::Result<CompiledKernels, String>,
) -> std::result::Result<Module, String> {
    if let Some(bin) = file.and_then(read_cached) {
        return Ok(Module::Cubin(bin));
    }
    let compiled = compile()?;
    let Some(bin) = compiled.cubin else {
        return Ok(Module::Ptx(compiled.ptx));
    };
    if let Some(file) = file {
        let mut stored = fnv1a(bin.iter().copied()).to_le_bytes().to_vec();
        stored.extend_from_slice(&bin);
        let written = file
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .map_err(|e| e.to_string())
            .and_then(|()| {
                fp4forge_format::write_file_atomic(file, &stored).map_err(|e| e.to_string())
            });
        if let Err(e) = written {
            eprintln!(
                "warning: kernel cache {} not written: {e} (FP4FORGE_KERNEL_CACHE=off: no cache)",
                file.display()
            );
        }
    }
    Ok(Module::Cubin(bin))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compiled(cubin: Option<&[u8]>) -> CompiledKernels {
        CompiledKernels {
            ptx: "// ptx".into(),
            cubin: cubin.map(<[u8]>::to_vec),
            log: String::new(),
        }
    }

    /// ptxas's `-v` lines as NVRTC logs them: entry points with and without spills and static
    /// shared memory; a device function's properties are not an entry.
    #[test]
    fn ptxas_reports_are_read_per_entry_point() {
        let log = "\
ptxas info    : Compiling entry function 'gemm_h16' for 'sm_90'
ptxas info    : Function properties for gemm_h16
ptxas         .     72 bytes stack frame, 72 bytes spill stores, 64 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 72 bytes cumulative stack size
ptxas info    : Compile time = 335.191 ms
ptxas info    : Function properties for _Z6helperv
ptxas         .     8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'gemm_mma' for 'sm_90'
ptxas info    : Function properties for gemm_mma
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 111 registers, used 1 barriers, 40960 bytes smem
";
        let got = parse_ptxas_report(log);
        let k = |name: &str,
                 registers,
                 stack_bytes,
                 spill_store_bytes,
                 spill_load_bytes,
                 shared_bytes| {
            KernelResources {
                name: name.into(),
                registers,
                stack_bytes,
                spill_store_bytes,
                spill_load_bytes,
                shared_bytes,
            }
        };
        assert_eq!(
            got,
            [
                k("gemm_h16", 128, 72, 72, 64, 0),
                k("gemm_mma", 111, 0, 0, 0, 40960)
            ]
        );
    }

    /// The first start compiles and stores the CUBIN; the next loads it without compiling; a
    /// damaged file is compiled anew and rewritten; PTX (no CUBIN) is never stored.
    #[test]
    fn kernel_cache_stores_and_loads_the_cubin() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sub").join("kernels-sm_90-0.cubin");
        let first = cached_or_compiled(Some(&file), || Ok(compiled(Some(b"cubin")))).unwrap();
        assert_eq!(first, Module::Cubin(b"cubin".to_vec()));
        let again = cached_or_compiled(Some(&file), || Err("compiled again".into())).unwrap();
        assert_eq!(again, Module::Cubin(b"cubin".to_vec()));
        let mut bytes = std::fs::read(&file).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        std::fs::write(&file, &bytes).unwrap();
        let fresh = cached_or_compiled(Some(&file), || Ok(compiled(Some(b"other")))).unwrap();
        assert_eq!(fresh, Module::Cubin(b"other".to_vec()));
        assert_eq!(read_cached(&file), Some(b"other".to_vec()));
        let ptx_file = dir.path().join("ptx.cubin");
        let ptx = cached_or_compiled(Some(&ptx_file), || Ok(compiled(None))).unwrap();
        assert_eq!(ptx, Module::Ptx("// ptx".into()));
        assert!(!ptx_file.exists());
        let none = cached_or_compiled(None, || Ok(compiled(Some(b"x")))).unwrap();
        assert_eq!(none, Module::Cubin(b"x".to_vec()));
        // the cache file's name changes with the source and the architecture
        let a = kernel_cache_file(dir.path(), "a", "sm_90");
        assert_ne!(a, kernel_cache_file(dir.path(), "b", "sm_90"));
        assert_ne!(a, kernel_cache_file(dir.path(), "a", "sm_89"));
    }
}
