//! Decode benchmark of the CUDA backend at real Laguna geometry with SYNTHETIC weights
//! (generated in GPU memory from the config: same shapes and byte counts as the real model).
//!
//! ```text
//! cuda_decode_bench [--stock CONFIG] [--lean CONFIG] [--contexts 2048,16384,65536]
//!                   [--reps 50] [--json OUT.json] [--bytes-stock 9.906e9] [--bytes-lean 5.890e9]
//!                   [--probe] [--probe-only]
//! ```
//!
//! `--probe` first runs the decode-stream probe (`backend::cuda::stream_probe`: the step's bytes
//! and dependencies in three kernel organisations, with trivial compute, an upper bound per
//! organisation, and with the backend's own per-byte arithmetic); `--probe-only` runs only that.
//!
//! Defaults: the Laguna-S-2.1 configs under `crates/builder/tests/fixtures/`. Bytes per token
//! default to `fp4forge inspect`'s figures for those builds (weights only); the table also shows
//! the bytes the kernels actually read (weights + KV at that context). The copy bandwidth is a
//! `cuMemcpyDtoD` of a 4 GiB buffer (read + write bytes), measured in the same run.

use std::path::PathBuf;

use fp4forge_engine::backend::cuda::bench::{copy_bandwidth, synthetic_laguna_decode};
use fp4forge_engine::backend::cuda::stream_probe::decode_stream_probe;

use fp4forge_engine::CudaBackend;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../builder/tests/fixtures");
    let mut stock = root.join("laguna-s-2.1/config.json");
    let mut lean = root.join("laguna-s-2.1-lean/config.json");
    let mut contexts = vec![2048usize, 16384, 65536];
    let mut reps = 50usize;
    let mut json: Option<PathBuf> = None;
    let (mut probe, mut bench) = (false, true);
    let (mut b_stock, mut b_lean) = (9.906e9f64, 5.890e9f64);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--probe" | "--probe-only" => {
                probe = true;
                bench = args[i] == "--probe";
                i += 1;
                continue;
            }
            "--stock" => stock = v.into(),
            "--lean" => lean = v.into(),
            "--contexts" => contexts = v.split(',').map(|s| s.parse()).collect::<Result<_, _>>()?,
            "--reps" => reps = v.parse()?,
            "--json" => json = Some(v.into()),
            "--bytes-stock" => b_stock = v.parse()?,
            "--bytes-lean" => b_lean = v.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
        i += 2;
    }
    let b = CudaBackend::new(0)?;
    println!("device: {}", fp4forge_engine::Backend::name(&b));
    let copy = copy_bandwidth(&b, 4 << 30, 20)?;
    if std::env::var_os("FP4FORGE_MICROBENCH").is_some() {
        println!("| kernel (Laguna-S shapes, synthetic) | µs | GB/s |\n|---|---:|---:|");
        for (name, us, gbs) in fp4forge_engine::backend::cuda::bench::kernel_microbench(&b)? {
            println!("| {name} | {us:.1} | {gbs:.0} |");
        }
        if std::env::var("FP4FORGE_MICROBENCH").as_deref() == Ok("only") {
            return Ok(());
        }
    }
    println!(
        "device-to-device copy bandwidth (4 GiB, read+write): {:.0} GB/s",
        copy
    );
    let mut probe_rows = Vec::new();
    if probe {
        let builds = [("stock", stock.as_path()), ("lean", lean.as_path())];
        probe_rows = decode_stream_probe(&b, &builds, &contexts, copy, reps)?;
        println!();
        println!(
            "Decode-stream probe: the step's bytes and dependencies, trivial compute (upper bounds) \
             or the backend's arithmetic (`real arithmetic` rows)"
        );
        println!(
            "| build | context | stages/layer | organisation | ms/token | µs/stage | tok/s | GB/token | GB/s | % of copy BW |"
        );
        println!("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|");
        for r in &probe_rows {
            println!(
                "| {} | {} | {} | {} | {:.3} | {:.2} | {:.1} | {:.3} | {:.0} | {:.1}% |",
                r.build,
                r.context,
                r.stages_per_layer,
                r.organisation,
                r.ms_per_token,
                1e3 * r.ms_per_token / r.stages.max(1) as f64,
                r.tok_s,
                r.bytes_per_token / 1e9,
                r.gbs,
                100.0 * r.fraction_of_copy
            );
        }
    }
    let mut rows = Vec::new();
    for (label, cfg, bytes) in [("stock", &stock, b_stock), ("lean", &lean, b_lean)] {
        if !bench {
            break;
        }
        eprintln!("{label}: {}", cfg.display());
        rows.extend(synthetic_laguna_decode(
            &b, cfg, label, &contexts, bytes, copy, reps,
        )?);
    }
    println!();
    println!("Laguna-S-2.1 geometry, SYNTHETIC weights, batch 1, bf16 KV, CUDA graph replay");
    println!(
        "| build | context | tok/s | ms/token | GB/token (inspect) | GB/s achieved | % of copy BW | GB/token read incl. KV | GB/s incl. KV | kernels |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {:.1} | {:.3} | {:.3} | {:.0} | {:.1}% | {:.3} | {:.0} | {} |",
            r.build,
            r.context,
            r.tok_s,
            r.ms_per_token,
            r.bytes_per_token / 1e9,
            r.achieved_gbs,
            100.0 * r.fraction_of_copy,
            (r.weight_bytes_read + r.kv_bytes_read) / 1e9,
            r.achieved_incl_kv_gbs,
            r.kernels
        );
    }
    for r in &rows {
        println!();
        println!(
            "{} ctx {}: GPU time per stage of one eager step (events between stages)",
            r.build, r.context
        );
        println!("| stage | µs/token | share |\n|---|---:|---:|");
        let total: f64 = r.stages_us.iter().map(|(_, us)| us).sum();
        for (name, us) in &r.stages_us {
            println!("| {name} | {us:.0} | {:.1}% |", 100.0 * us / total);
        }
        println!("| total (eager) | {total:.0} | |");
    }
    println!();
    for &c in &contexts {
        let s = rows.iter().find(|r| r.build == "stock" && r.context == c);
        let l = rows.iter().find(|r| r.build == "lean" && r.context == c);
        if let (Some(s), Some(l)) = (s, l) {
            println!("context {c}: lean/stock speed-up {:.2}x", l.tok_s / s.tok_s);
        }
    }
    if let Some(p) = json {
        let doc = serde_json::json!({
            "synthetic": true,
            "device": fp4forge_engine::Backend::name(&b),
            "copy_bandwidth_gbs": copy,
            "rows": rows,
            "stream_probe": probe_rows,
        });
        std::fs::write(&p, serde_json::to_vec_pretty(&doc)?)?;
        println!("wrote {}", p.display());
    }
    Ok(())
}
