//! Build check of the CUDA kernels without a GPU: NVRTC (only the library; no driver, no device)
//! compiles the kernel source for every architecture the backend supports, every kernel the
//! backend loads is in the PTX, and on sm_90 no kernel spills registers past its budget (ptxas's
//! report, printed as a table). Run by CI with the NVRTC library `scripts/fetch-nvrtc.sh` fetches:
//!
//! ```text
//! LD_LIBRARY_PATH=$(scripts/fetch-nvrtc.sh) cargo test -p fp4forge-engine --features cuda \
//!     --test nvrtc -- --ignored
//! ```
#![cfg(feature = "cuda")]

use fp4forge_engine::backend::cuda::{compile_kernels, kernel_entries, kernel_resources};

#[test]
#[ignore = "needs the NVRTC library (scripts/fetch-nvrtc.sh)"]
fn kernels_compile_for_every_supported_architecture() {
    // sm_80: no fp8 conversions or PDL (those paths compile to nothing); sm_89: fp8 + tensor-core
    // NVFP4 GEMVs; sm_90: everything (the H200).
    for arch in ["sm_80", "sm_89", "sm_90"] {
        let compiled = compile_kernels(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        // the device code the backend loads (and caches) instead of the PTX
        let cubin = compiled.cubin.unwrap_or_else(|| panic!("{arch}: no CUBIN"));
        assert_eq!(&cubin[..4], b"\x7fELF", "{arch}: the CUBIN is no ELF image");
        let ptx = compiled.ptx;
        let names = kernel_entries();
        for name in &names {
            assert!(
                ptx.contains(&format!(".entry {name}(")),
                "{arch}: kernel `{name}` missing from the PTX"
            );
        }
        println!(
            "{arch}: {} kernels, {} bytes of PTX",
            names.len(),
            ptx.len()
        );
    }
}

/// Bytes of spill stores and loads per thread that ptxas (sm_90, the pinned NVRTC of
/// `scripts/fetch-nvrtc.sh`) gives kernels whose registers run out under their launch bounds, as
/// measured when each budget was set; every other kernel spills nothing.
const SPILL_BUDGETS: &[(&str, u32, u32)] = &[
    // the prefill attention of 128-wide heads at 255 registers
    ("attn_flash_bf16_128", 44, 80),
    ("attn_flash_fp8_128", 28, 68),
    // 64 accumulators, the A fragments of two mma chunks and the B loads at 128 registers
    ("gemm_h16", 72, 72),
    ("gemv_mma", 8, 8),
];

/// ptxas's resources for every kernel on sm_90 (the H200), printed as a table (`--nocapture`),
/// and no kernel spilling more registers to local memory than its budget in [`SPILL_BUDGETS`]:
/// a change that makes a hot kernel spill shows here, without a GPU. With
/// `FP4FORGE_CUDA_KERNELS=file.cu` the same report for a variant of the kernels.
#[test]
#[ignore = "needs the NVRTC library (scripts/fetch-nvrtc.sh)"]
fn kernel_spills_stay_within_their_budgets() {
    let kernels = kernel_resources("sm_90").unwrap_or_else(|e| panic!("sm_90: {e}"));
    let names = kernel_entries();
    assert!(
        names.iter().all(|n| kernels.iter().any(|k| k.name == *n)),
        "ptxas reported {} kernels; some the backend loads are missing",
        kernels.len()
    );
    println!(
        "{:<34} {:>5} {:>6} {:>8} {:>8} {:>7}",
        "kernel (sm_90)", "regs", "stack", "spill st", "spill ld", "smem"
    );
    let mut over = Vec::new();
    for k in &kernels {
        println!(
            "{:<34} {:>5} {:>6} {:>8} {:>8} {:>7}",
            k.name,
            k.registers,
            k.stack_bytes,
            k.spill_store_bytes,
            k.spill_load_bytes,
            k.shared_bytes
        );
        let (stores, loads) = SPILL_BUDGETS
            .iter()
            .find(|(n, _, _)| *n == k.name)
            .map_or((0, 0), |&(_, s, l)| (s, l));
        if k.spill_store_bytes > stores || k.spill_load_bytes > loads {
            over.push(format!(
                "{}: {} / {} bytes of spill stores / loads (budget {stores} / {loads})",
                k.name, k.spill_store_bytes, k.spill_load_bytes
            ));
        }
    }
    assert!(
        over.is_empty(),
        "kernels spilling past their budgets:\n{}",
        over.join("\n")
    );
}
