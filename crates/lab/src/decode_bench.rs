//! The CUDA decode benchmark at real Laguna geometry with SYNTHETIC weights, timing the
//! production step.
//!
//! From a Laguna `config.json` (stock: routed experts NVFP4, everything else BF16; lean: q/k/v/o
//! NVFP4 too, read from `quantization_config`) it builds a real `Decoder<CudaBackend>` (the
//! `ir` types every model family fills) and makes it resident through the backend's production
//! loading calls (`load_linear`, `load_experts`, `load_rope`, `upload`): every weight is a slice
//! of one shared pseudo-random host buffer (bytes that are finite as bf16 and as fp8 scales), so
//! host memory stays at about the largest tensor while the device holds the whole model. The KV
//! cache at context `L` is not prefilled: [`CudaBackend::kv_assume_filled`] gives every layer
//! `L` positions of synthetic values.
//!
//! The measured step is `fp4forge_engine::forward` with one sequence, one token, `Want::Last`:
//! what a session's decode step runs (on CUDA the backend's fused launch sequence, eager, no
//! graph). The position advances from step to step (a real decode from context `L`), the token
//! ids vary, so the routed experts do too. tok/s is steps over wall time, synchronised at both
//! ends.

use std::path::Path;

use fp4forge_engine::backend::cuda::CudaKvLayer;
use fp4forge_engine::ir::{
    Attention, AttentionParams, Decoder, KvDtype, KvLayerSpec, Layer, Mlp, Moe, RouterParams,
    RouterScoring, SwiGlu,
};
use fp4forge_engine::rope::RopeSpec;
use fp4forge_engine::{
    forward, Backend, Bytes, CudaBackend, ExpertWeights, LinearWeight, Result, SeqChunk, Want,
};

use crate::geometry::{read_geometry, Geometry};
use crate::gpu::Gpu;

/// One measured row of the benchmark.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchRow {
    /// Build label (`stock`, `lean`).
    pub build: String,
    /// Context length (positions in the KV cache before the first measured step).
    pub context: usize,
    /// Decode steps per second.
    pub tok_s: f64,
    /// Milliseconds per step.
    pub ms_per_token: f64,
    /// Weight bytes per token used for the bandwidth figure (inspect's arithmetic, if given).
    pub bytes_per_token: f64,
    /// Weight bytes per token the step reads (from the geometry: every non-expert weight, the
    /// top-k routed experts, the lm_head, one embedding row).
    pub weight_bytes_read: f64,
    /// KV-cache bytes read per token, averaged over the measured steps' positions.
    pub kv_bytes_read: f64,
    /// `bytes_per_token × tok/s`, GB/s.
    pub achieved_gbs: f64,
    /// `(weight_bytes_read + kv_bytes_read) × tok/s`, GB/s.
    pub achieved_incl_kv_gbs: f64,
    /// Device-to-device copy bandwidth measured in the same run (read + write), GB/s.
    pub copy_gbs: f64,
    /// `achieved_gbs / copy_gbs`.
    pub fraction_of_copy: f64,
    /// Steps (warm-up and measured) that ran on the backend's fused launch sequence; less than
    /// `steps` means the fused step declined this decoder and the generic ops were timed.
    pub fused_steps: usize,
    /// Steps run (warm-up and measured).
    pub steps: usize,
    /// Largest |logit difference| between the fused step and the generic ops (the fused step
    /// switched off) from the same cache, relative to the largest |logit|.
    pub fused_vs_generic_rel: f64,
}

/// Warm-up steps before each measurement.
const WARMUP: usize = 3;

/// The bytes every weight is cut from: each is finite as a bf16 high byte (|x| in 2^-9..2^-3),
/// as an fp8 e4m3 scale (±1.375..1.625) and as a pair of NVFP4 codes.
const BYTES: [u8; 6] = [0x3b, 0x3c, 0x3d, 0xbb, 0xbc, 0xbd];

/// One shared pseudo-random host buffer, sliced (zero copy) into every synthetic weight.
struct Source {
    buf: Bytes,
    state: u64,
}

impl Source {
    /// A buffer of `len` bytes (at least the largest weight).
    fn new(len: usize) -> Self {
        let mut state = 0x5eed_u64;
        let v = (0..len)
            .map(|_| BYTES[(xorshift(&mut state) % BYTES.len() as u64) as usize])
            .collect();
        Self {
            buf: Bytes::from_vec(v),
            state,
        }
    }

    /// `n` bytes at a pseudo-random 16-byte-aligned offset.
    fn take(&mut self, n: usize) -> Bytes {
        let room = (self.buf.len() - n) / 16;
        let off = if room == 0 {
            0
        } else {
            16 * (xorshift(&mut self.state) as usize % room)
        };
        self.buf.slice(off..off + n)
    }

    /// A `rows × cols` weight: NVFP4 (codes, fp8 scales, a global scale) or bf16.
    fn linear(&mut self, rows: usize, cols: usize, nvfp4: bool) -> LinearWeight {
        if nvfp4 {
            LinearWeight::Nvfp4 {
                packed: self.take(rows * cols / 2),
                scales: self.take(rows * cols / 16),
                global_scale: 2688.0,
                input_global_scale: None,
                rows,
                cols,
            }
        } else {
            LinearWeight::Bf16 {
                data: self.take(rows * cols * 2),
                rows,
                cols,
            }
        }
    }

    /// `n` f32 values in `±amp`.
    fn values(&mut self, n: usize, amp: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let u = (xorshift(&mut self.state) >> 40) as f32 / (1u64 << 24) as f32;
                (2.0 * u - 1.0) * amp
            })
            .collect()
    }
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Bytes of a `rows × cols` weight as stored.
fn weight_bytes(rows: usize, cols: usize, nvfp4: bool) -> usize {
    if nvfp4 {
        rows * cols / 2 + rows * cols / 16
    } else {
        rows * cols * 2
    }
}

/// Weight bytes one decode step reads at geometry `g` (the old benchmark's arithmetic).
pub fn step_weight_bytes(g: &Geometry) -> f64 {
    let h = g.hidden;
    let d = g.head_dim;
    let kvw = g.kv_heads * d;
    let mut bytes = (weight_bytes(g.vocab, h, false) + h * 2 + h * 4) as f64;
    for i in 0..g.layers {
        let heads = g.heads[i];
        let a = g.attn_nvfp4;
        bytes += (weight_bytes(heads * d, h, a)
            + 2 * weight_bytes(kvw, h, a)
            + weight_bytes(h, heads * d, a)
            + weight_bytes(heads, h, false)) as f64;
        bytes += if g.dense_layers[i] {
            (3 * g.dense_inter * h * 2) as f64
        } else {
            let per_expert = 3 * weight_bytes(g.moe_inter, h, g.experts_nvfp4);
            (weight_bytes(g.experts, h, false)
                + g.experts * 4
                + g.top_k * per_expert
                + 2 * weight_bytes(g.shared_inter, h, false)
                + weight_bytes(h, g.shared_inter, false)) as f64
        };
    }
    bytes
}

/// KV-cache bytes (bf16 K and V) a step at position `pos` reads.
fn step_kv_bytes(g: &Geometry, pos: usize) -> f64 {
    let kvw = g.kv_heads * g.head_dim;
    (0..g.layers)
        .map(|i| {
            let keys = if g.full[i] {
                pos + 1
            } else {
                g.window.min(pos + 1)
            };
            (2 * keys * kvw * 2) as f64
        })
        .sum()
}

/// A resident `Decoder<CudaBackend>` of geometry `g` with synthetic weights, through the
/// backend's loading calls.
pub fn synthetic_decoder(b: &CudaBackend, g: &Geometry) -> Result<Decoder<CudaBackend>> {
    let (h, d) = (g.hidden, g.head_dim);
    let kvw = g.kv_heads * d;
    let largest = [
        weight_bytes(g.vocab, h, false),
        weight_bytes(g.dense_inter, h, false),
        weight_bytes(g.heads.iter().copied().max().unwrap_or(0) * d, h, false),
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    let mut src = Source::new(largest + (64 << 20));
    let ones = |n: usize| b.upload(1, n, &vec![1.0; n]);
    let ropes = vec![
        b.load_rope(&RopeSpec::from_arch(&g.rope_full))?,
        b.load_rope(&RopeSpec::from_arch(&g.rope_sliding))?,
    ];
    let mut layers = Vec::with_capacity(g.layers);
    for i in 0..g.layers {
        let heads = g.heads[i];
        let a = g.attn_nvfp4;
        let name = |w: &str| format!("model.layers.{i}.{w}");
        let lin = |src: &mut Source, w: &str, rows, cols, nv| {
            b.load_linear(&name(w), src.linear(rows, cols, nv))
        };
        let attn = Attention {
            q: lin(&mut src, "self_attn.q_proj", heads * d, h, a)?,
            k: lin(&mut src, "self_attn.k_proj", kvw, h, a)?,
            v: lin(&mut src, "self_attn.v_proj", kvw, h, a)?,
            o: lin(&mut src, "self_attn.o_proj", h, heads * d, a)?,
            q_bias: None,
            k_bias: None,
            v_bias: None,
            o_bias: None,
            q_norm: Some(ones(d)?),
            k_norm: Some(ones(d)?),
            gate: Some(lin(&mut src, "self_attn.g_proj", heads, h, false)?),
            rope: usize::from(!g.full[i]),
            params: AttentionParams {
                heads,
                kv_heads: g.kv_heads,
                head_dim: d,
                scale: 1.0 / (d as f32).sqrt(),
            },
            kv: KvLayerSpec {
                kv_heads: g.kv_heads,
                head_dim: d,
                window: (!g.full[i]).then_some(g.window),
                dtype: KvDtype::Bf16,
                k_scale: 1.0,
                v_scale: 1.0,
            },
        };
        let swiglu = |src: &mut Source, pre: &str, inter: usize| -> Result<SwiGlu<CudaBackend>> {
            Ok(SwiGlu {
                gate: lin(src, &format!("{pre}.gate_proj"), inter, h, false)?,
                up: lin(src, &format!("{pre}.up_proj"), inter, h, false)?,
                down: lin(src, &format!("{pre}.down_proj"), h, inter, false)?,
            })
        };
        let mlp = if g.dense_layers[i] {
            Mlp::Dense(swiglu(&mut src, "mlp", g.dense_inter)?)
        } else {
            let nv = g.experts_nvfp4;
            let experts = (0..g.experts)
                .map(|_| ExpertWeights {
                    gate: src.linear(g.moe_inter, h, nv),
                    up: src.linear(g.moe_inter, h, nv),
                    down: src.linear(h, g.moe_inter, nv),
                })
                .collect();
            Mlp::Moe(Moe {
                router: lin(&mut src, "mlp.gate", g.experts, h, false)?,
                selection_bias: Some(b.upload(1, g.experts, &src.values(g.experts, 0.01))?),
                experts: b.load_experts(&name("mlp.experts"), experts)?,
                shared: Some(swiglu(&mut src, "mlp.shared_expert", g.shared_inter)?),
                params: RouterParams {
                    top_k: g.top_k,
                    scoring: RouterScoring::Sigmoid,
                    normalize: true,
                    logit_softcap: 0.0,
                },
                routed_scale: g.routed_scale,
            })
        };
        layers.push(Layer {
            input_norm: ones(h)?,
            post_norm: ones(h)?,
            attn,
            mlp,
        });
    }
    Ok(Decoder {
        embed: b.load_linear("model.embed_tokens", src.linear(g.vocab, h, false))?,
        lm_head: Some(b.load_linear("lm_head", src.linear(g.vocab, h, false))?),
        norm: ones(h)?,
        eps: g.eps,
        hidden: h,
        layers,
        ropes,
    })
}

/// The token of step `pos` (varies, so the routed experts do).
fn token(pos: usize, vocab: usize) -> u32 {
    let mut s = pos as u64 ^ 0x9e37_79b9_7f4a_7c15;
    (xorshift(&mut s) % vocab.max(1) as u64) as u32
}

/// Every layer of `kv` holding `len` positions (synthetic values).
fn set_context(b: &CudaBackend, kv: &mut [CudaKvLayer], len: usize) -> Result<()> {
    kv.iter_mut().try_for_each(|c| b.kv_assume_filled(c, len))
}

/// One production step at position `pos`: `forward` with one sequence, one token, its logits.
fn step(
    b: &CudaBackend,
    net: &Decoder<CudaBackend>,
    kv: &mut [CudaKvLayer],
    pos: usize,
    vocab: usize,
) -> Result<Vec<f32>> {
    let ids = [token(pos, vocab)];
    let mut seqs = [SeqChunk {
        kv,
        ids: &ids,
        pos0: pos,
        want: Want::Last,
    }];
    let out = forward(b, net, &mut seqs)?;
    match out.into_iter().next().flatten() {
        Some(t) => b.download(&t),
        None => Ok(Vec::new()),
    }
}

/// Runs the benchmark for one build (config) at each context; `bytes_per_token` is inspect's
/// figure for the build (0 = use the computed weight bytes).
pub fn laguna_decode(
    gpu: &Gpu,
    config: &Path,
    build: &str,
    contexts: &[usize],
    bytes_per_token: f64,
    copy_gbs: f64,
    reps: usize,
) -> Result<Vec<BenchRow>> {
    let b = &gpu.backend;
    let g = read_geometry(config).map_err(|e| gpu.err(e))?;
    let t = std::time::Instant::now();
    let net = synthetic_decoder(b, &g)?;
    gpu.synchronize()?;
    eprintln!(
        "  {build}: decoder resident in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let mut kv = net
        .layers
        .iter()
        .map(|l| b.new_kv_layer(&l.attn.kv))
        .collect::<Result<Vec<_>>>()?;
    let weight_bytes = step_weight_bytes(&g);
    let mut rows = Vec::new();
    for &ctx in contexts {
        // Room for every step of the run first (no growth inside the timed steps).
        set_context(b, &mut kv, ctx + WARMUP + reps + 1)?;
        // The fused step against the generic ops from the same cache and token.
        set_context(b, &mut kv, ctx)?;
        let fused = step(b, &net, &mut kv, ctx, g.vocab)?;
        set_context(b, &mut kv, ctx)?;
        b.set_fused_decode(false);
        let generic = step(b, &net, &mut kv, ctx, g.vocab);
        b.set_fused_decode(true);
        let generic = generic?;
        let top = generic.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
        let diff = generic
            .iter()
            .zip(&fused)
            .fold(0f32, |m, (p, q)| m.max((p - q).abs()));
        let fused_vs_generic_rel = f64::from(diff / top);
        eprintln!(
            "  {build} ctx {ctx}: fused step vs generic ops: max |Δ logit| {diff:.3e} \
             ({fused_vs_generic_rel:.2e} of max |logit| {top:.3})"
        );
        if fused_vs_generic_rel.is_nan() || fused_vs_generic_rel > 1e-2 {
            eprintln!("  {build} ctx {ctx}: WARNING: the fused step and the generic ops disagree");
        }
        // Measured steps at positions ctx .. ctx + reps, after WARMUP steps before them.
        let start = ctx.saturating_sub(WARMUP);
        set_context(b, &mut kv, start)?;
        let mut pos = start;
        let fused_before = b.fused_decode_steps();
        let secs = gpu.time_calls(ctx - start, reps, || {
            let ids = [token(pos, g.vocab)];
            let mut seqs = [SeqChunk {
                kv: &mut kv,
                ids: &ids,
                pos0: pos,
                want: Want::Last,
            }];
            forward(b, &net, &mut seqs)?;
            pos += 1;
            Ok(())
        })?;
        let steps = ctx - start + reps;
        let fused_steps = b.fused_decode_steps() - fused_before;
        let kv_bytes =
            (ctx..ctx + reps).map(|p| step_kv_bytes(&g, p)).sum::<f64>() / reps.max(1) as f64;
        let bpt = if bytes_per_token > 0.0 {
            bytes_per_token
        } else {
            weight_bytes
        };
        let tok_s = 1.0 / secs;
        eprintln!(
            "  {build} ctx {ctx}: {:.3} ms/token, {fused_steps} of {steps} steps on the fused path",
            secs * 1e3
        );
        rows.push(BenchRow {
            build: build.to_string(),
            context: ctx,
            tok_s,
            ms_per_token: secs * 1e3,
            bytes_per_token: bpt,
            weight_bytes_read: weight_bytes,
            kv_bytes_read: kv_bytes,
            achieved_gbs: bpt * tok_s / 1e9,
            achieved_incl_kv_gbs: (weight_bytes + kv_bytes) * tok_s / 1e9,
            copy_gbs,
            fraction_of_copy: bpt * tok_s / 1e9 / copy_gbs,
            fused_steps,
            steps,
            fused_vs_generic_rel,
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::read_geometry;

    fn fixture(build: &str) -> Geometry {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../builder/tests/fixtures")
            .join(build)
            .join("config.json");
        read_geometry(&path).expect("fixture geometry")
    }

    /// The step's weight bytes are `fp4forge inspect`'s bytes per token of the Laguna-S-2.1
    /// builds (9.906 GB stock, 5.890 GB lean) within 0.1%.
    #[test]
    fn step_weight_bytes_match_inspect() {
        for (build, inspect) in [("laguna-s-2.1", 9.906e9), ("laguna-s-2.1-lean", 5.890e9)] {
            let w = step_weight_bytes(&fixture(build));
            assert!(
                (w / inspect - 1.0).abs() < 1e-3,
                "{build}: {w} vs {inspect}"
            );
        }
    }

    /// Every byte of the synthetic buffer is a finite bf16 high byte and a finite fp8 scale.
    #[test]
    fn synthetic_bytes_are_finite() {
        for b in BYTES {
            let bf16 = f32::from_bits(u32::from(b) << 24 | u32::from(b) << 16);
            assert!(bf16.is_finite() && bf16.abs() < 0.1, "{b:#x}: {bf16}");
            // e4m3: NaN only at exponent and mantissa all ones
            assert_ne!(b & 0x7f, 0x7f);
        }
        let mut s = Source::new(1 << 12);
        assert_eq!(s.take(1000).len(), 1000);
        assert_eq!(s.take(1 << 12).len(), 1 << 12);
    }
}
