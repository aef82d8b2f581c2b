//! Build check of the CUDA kernels without a GPU: NVRTC (only the library; no driver, no device)
//! compiles the kernel source for every architecture the backend supports, and every kernel the
//! backend loads is in the PTX. Run by CI with the NVRTC library `scripts/fetch-nvrtc.sh` fetches:
//!
//! ```text
//! LD_LIBRARY_PATH=$(scripts/fetch-nvrtc.sh) cargo test -p fp4forge-engine --features cuda \
//!     --test nvrtc -- --ignored
//! ```
#![cfg(feature = "cuda")]

use fp4forge_engine::backend::cuda::{compile_kernels, kernel_entries};

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
