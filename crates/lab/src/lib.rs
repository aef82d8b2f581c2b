//! Experiments on fp4forge, outside the production crates (which never import this one):
//!
//! - [`decode_bench`] (feature `cuda`): the CUDA decode benchmark, a real
//!   `Decoder<CudaBackend>` built from synthetic weights of a Laguna geometry, timing the
//!   production step (`fp4forge_engine::forward`, one sequence, one token);
//! - [`stream_probe`] (feature `cuda`): how close to the copy bandwidth a batch-1 decode step's
//!   byte stream can get in three kernel organisations;
//! - [`geometry`]: the shapes both read from a Laguna `config.json`;
//! - [`op_profile`]: any backend with every op timed (the `cpu_op_profile` example);
//! - [`timeline`]: where a step leaves the GPU idle (CUPTI's kernel records, feature `cuda`;
//!   `batch_decode_speed --timeline N`).
//!
//! Binaries: `cuda_decode_bench` (feature `cuda`). Examples: `decode_speed` and `cpu_op_profile`
//! (the CPU backend on a checkpoint), `batch_decode_speed` and `prefill_speed` (any device).

#[cfg(feature = "cuda")]
pub mod decode_bench;
pub mod geometry;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod op_profile;
#[cfg(feature = "cuda")]
pub mod stream_probe;
pub mod timeline;

/// Opens (`on`) or closes Nsight's capture range: `cuProfilerStart` / `cuProfilerStop` on the
/// calling thread's CUDA context, so that a tool started with `--profile-from-start off` (ncu,
/// nsys) profiles only the work launched in between. Call it on the thread that has run the
/// backend's launches (its context is current there).
#[cfg(feature = "cuda")]
pub fn profiler_capture(on: bool) -> Result<(), String> {
    use cudarc::driver::sys;
    // SAFETY: neither call takes arguments; they act on the thread's current context.
    let r = unsafe {
        if on {
            sys::cuProfilerStart()
        } else {
            sys::cuProfilerStop()
        }
    };
    match r {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(format!(
            "{}: {e:?}",
            if on {
                "cuProfilerStart"
            } else {
                "cuProfilerStop"
            }
        )),
    }
}

/// Without the `cuda` feature there is no CUDA work to capture: refused.
#[cfg(not(feature = "cuda"))]
pub fn profiler_capture(_on: bool) -> Result<(), String> {
    Err("a profiler capture range needs the lab's `cuda` feature".into())
}

/// `len` pseudo-random token ids below `vocab` (xorshift64 from a fixed seed): the fixed prompt
/// of the CPU speed examples (and of `benches/cpu_vs_llamacpp.sh`'s pp prompt).
pub fn synthetic_prompt(len: usize, vocab: usize) -> Vec<u32> {
    let mut s = 0x1234_5678u64;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab.max(1) as u64) as u32
        })
        .collect()
}

/// Removes `flag V` from `args` and parses V; `default` where the flag is not given.
pub fn take_arg<T: std::str::FromStr>(
    args: &mut Vec<String>,
    flag: &str,
    default: T,
) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    let Some(i) = args.iter().position(|a| a == flag) else {
        return Ok(default);
    };
    let value = args
        .get(i + 1)
        .ok_or_else(|| format!("{flag} needs a value"))?
        .clone();
    args.drain(i..i + 2);
    value.parse().map_err(|e| format!("{flag} {value}: {e}"))
}

/// Removes `--device D` from `args` and parses D (`cpu`, `cuda`, `cuda:N`); the CPU where it is
/// not given.
pub fn take_device(args: &mut Vec<String>) -> Result<fp4forge_engine::Device, String> {
    take_arg(args, "--device", fp4forge_engine::Device::Cpu)
}
