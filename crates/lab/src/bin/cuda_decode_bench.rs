//! Decode benchmark of the CUDA backend at real Laguna geometry with SYNTHETIC weights: a real
//! `Decoder<CudaBackend>` made resident through the backend's loading calls, timing the
//! production step (`fp4forge_engine::forward`, one sequence, one token; see
//! `fp4forge_lab::decode_bench`).
//!
//! ```text
//! cuda_decode_bench [--stock CONFIG] [--lean CONFIG] [--contexts 2048,16384,65536]
//!                   [--reps 50] [--json OUT.json] [--bytes-stock 9.906e9] [--bytes-lean 5.890e9]
//!                   [--probe] [--probe-only]
//! ```
//!
//! `--probe` first runs the decode-stream probe (`fp4forge_lab::stream_probe`: the step's bytes
//! and dependencies in three kernel organisations, with trivial compute, an upper bound per
//! organisation, and with the backend's own per-byte arithmetic); `--probe-only` runs only that.
//!
//! Defaults: the Laguna-S-2.1 configs under `crates/builder/tests/fixtures/`. Bytes per token
//! default to `fp4forge inspect`'s figures for those builds (weights only); the table also shows
//! the bytes the step actually reads (weights + KV at that context). The copy bandwidth is a
//! `cuMemcpyDtoD` of a 4 GiB buffer (read + write bytes), measured in the same run.

use std::path::PathBuf;

use fp4forge_engine::CudaBackend;
use fp4forge_lab::decode_bench::laguna_decode;
use fp4forge_lab::gpu::Gpu;
use fp4forge_lab::stream_probe::decode_stream_probe;

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
        if !args[i].starts_with("--probe") && i + 1 >= args.len() {
            return Err(format!("{} needs a value", args[i]).into());
        }
        match args[i].as_str() {
            "--probe" | "--probe-only" => {
                probe = true;
                bench = args[i] == "--probe";
                i += 1;
                continue;
            }
            "--stock" => stock = v.into(),
            "--lean" => lean = v.into(),
            "--contexts" => {
                contexts = v
                    .split(',')
                    .map(|s| s.trim().parse())
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("--contexts {v}: {e}"))?
            }
            "--reps" => reps = v.parse().map_err(|e| format!("--reps {v}: {e}"))?,
            "--json" => json = Some(v.into()),
            "--bytes-stock" => {
                b_stock = v.parse().map_err(|e| format!("--bytes-stock {v}: {e}"))?
            }
            "--bytes-lean" => b_lean = v.parse().map_err(|e| format!("--bytes-lean {v}: {e}"))?,
            other => return Err(format!("unknown argument {other}").into()),
        }
        i += 2;
    }
    if reps == 0 || contexts.is_empty() {
        return Err("--reps and --contexts need at least one".into());
    }
    let b = CudaBackend::new(0)?;
    let gpu = Gpu::new(&b)?;
    println!("device: {}", fp4forge_engine::Backend::name(&b));
    let copy = gpu.copy_bandwidth(4 << 30, 20)?;
    println!(
        "device-to-device copy bandwidth (4 GiB, read+write): {:.0} GB/s",
        copy
    );
    let mut probe_rows = Vec::new();
    if probe {
        let builds = [("stock", stock.as_path()), ("lean", lean.as_path())];
        probe_rows = decode_stream_probe(&gpu, &builds, &contexts, copy, reps)?;
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
        rows.extend(laguna_decode(
            &gpu, cfg, label, &contexts, bytes, copy, reps,
        )?);
    }
    println!();
    println!(
        "Laguna-S-2.1 geometry, SYNTHETIC weights, batch 1, bf16 KV, the production step \
         (forward, one sequence, one token; eager launches)"
    );
    println!(
        "| build | context | tok/s | ms/token | GB/token (inspect) | GB/s achieved | % of copy BW | GB/token read incl. KV | GB/s incl. KV | fused steps | fused vs generic |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {:.1} | {:.3} | {:.3} | {:.0} | {:.1}% | {:.3} | {:.0} | {}/{} | {:.1e} |",
            r.build,
            r.context,
            r.tok_s,
            r.ms_per_token,
            r.bytes_per_token / 1e9,
            r.achieved_gbs,
            100.0 * r.fraction_of_copy,
            (r.weight_bytes_read + r.kv_bytes_read) / 1e9,
            r.achieved_incl_kv_gbs,
            r.fused_steps,
            r.steps,
            r.fused_vs_generic_rel
        );
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
            "step": "fp4forge_engine::forward, one sequence, one token, Want::Last (eager)",
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
