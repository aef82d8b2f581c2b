//! Build check of the stream probe's kernels without a GPU: NVRTC (only the library; no driver,
//! no device) compiles the probe's source (the backend's kernels, then `stream_probe.cu`) for
//! sm_90, and every kernel the probe loads is in the PTX. Run by CI with the NVRTC library
//! `scripts/fetch-nvrtc.sh` fetches:
//!
//! ```text
//! LD_LIBRARY_PATH=$(scripts/fetch-nvrtc.sh) cargo test -p fp4forge-lab --features cuda \
//!     --test nvrtc -- --ignored
//! ```
#![cfg(feature = "cuda")]

use fp4forge_lab::stream_probe::{compile_stream_probe, STREAM_PROBE_KERNELS};

#[test]
#[ignore = "needs the NVRTC library (scripts/fetch-nvrtc.sh)"]
fn stream_probe_compiles_for_sm_90() {
    let ptx = compile_stream_probe("sm_90")
        .unwrap_or_else(|e| panic!("{e}"))
        .to_src();
    for name in STREAM_PROBE_KERNELS {
        assert!(ptx.contains(&format!(".entry {name}(")), "`{name}` missing");
    }
}
