//! A synthetic decode benchmark at real Laguna geometry (SYNTHETIC weights, real byte counts).
//!
//! From a Laguna `config.json` (stock: routed experts NVFP4, everything else BF16; lean: q/k/v/o
//! NVFP4 too, read from `quantization_config`), every weight is allocated on the device at its
//! real size and filled with seeded pseudo-random values by a kernel (nothing crosses PCIe, no
//! files). The KV cache is filled with synthetic bf16 values for `context` positions (full
//! layers; sliding layers hold their 512-slot ring), then one decode step at position `context`
//! (embedding → 48 layers → lm_head) is captured in a CUDA graph and replayed. Every replay reads
//! the bytes a real decode step at that context reads (all layer weights, the router's 10
//! selected experts, the KV cache up to `context`) and writes the new KV row at the same slot, so
//! tok/s is the replay rate; the position does not advance between replays.
//!
//! Launches per layer (8-9): q/k/v/g in one GEMV launch, attention with the per-head norms,
//! rope and KV append inside (`AttnPrep`; a launch of its own where the decode kernel does not
//! apply) (+ split merge with the softplus gate), o_proj with the residual, rmsnorm and router
//! GEMV (one launch, `norm_gemv_bf16`), experts gate/up (the router's top-k, then routed + shared, one launch), experts down
//! (routed + shared, one launch), their ordered sum with the residual (whose last block then
//! computes the next layer's input rmsnorm, or the final norm). Where the persistent MoE kernels
//! do not apply, the top-k is a launch of its own.
//!
//! [`kernel_microbench`] times single kernels at the same shapes.

use cudarc::driver::CudaSlice;
use serde_json::Value;

use super::ops::{self, DevPtr};
use super::{AttnCall, Gemv, NormGemv, QkNormRope, QkNorms, RopeDev};
use super::{
    AttnPrep, CudaBackend, CudaExperts, CudaKvLayer, CudaLinear, CudaOptions, Epi, ExpertArena,
    MoeBuffers, MultiLinear, Route, SharedExpert, GEMV_WARPS,
};
use crate::backend::{AttentionParams, Backend, RouterParams, RouterScoring};
use crate::error::Result;
use crate::kv_cache::{KvDtype, KvLayerSpec};

/// One measured row of the benchmark.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchRow {
    /// Build label (`stock`, `lean`).
    pub build: String,
    /// Context length (positions in the KV cache before the measured step).
    pub context: usize,
    /// Decode steps per second (graph replays).
    pub tok_s: f64,
    /// Milliseconds per step.
    pub ms_per_token: f64,
    /// Weight bytes per token used for the bandwidth figure (inspect's arithmetic, if given).
    pub bytes_per_token: f64,
    /// Weight bytes per token the kernels actually read (computed from the allocated shapes).
    pub weight_bytes_read: f64,
    /// KV-cache bytes read per token at this context.
    pub kv_bytes_read: f64,
    /// `bytes_per_token × tok/s`, GB/s.
    pub achieved_gbs: f64,
    /// `(weight_bytes_read + kv_bytes_read) × tok/s`, GB/s.
    pub achieved_incl_kv_gbs: f64,
    /// Device-to-device copy bandwidth measured in the same run (read + write), GB/s.
    pub copy_gbs: f64,
    /// `achieved_gbs / copy_gbs`.
    pub fraction_of_copy: f64,
    /// Kernel launches (nodes) in the captured graph.
    pub kernels: usize,
    /// Largest |logit difference| between the step as measured (the input norms fused into the
    /// kernel before them, one token's experts on the persistent kernels) and the same step with
    /// separate norm launches and the per-item expert kernels, relative to the largest |logit|
    /// (the bench fails above 1e-2).
    pub fused_vs_separate_rel: f64,
    /// GPU time per stage of one eager (not captured) step, µs, in launch order: events between
    /// the stages, so each figure includes the stage's launch gaps.
    pub stages_us: Vec<(String, f64)>,
}

/// Events recorded between the stages of an eager step; resolved after a synchronize.
struct StageTimer<'a> {
    b: &'a CudaBackend,
    on: bool,
    pending: Vec<(&'static str, cudarc::driver::CudaEvent)>,
    totals: Vec<(&'static str, f64)>,
}

impl<'a> StageTimer<'a> {
    fn new(b: &'a CudaBackend) -> Self {
        Self {
            b,
            on: false,
            pending: Vec::new(),
            totals: Vec::new(),
        }
    }

    /// Marks the end of stage `name` (the time since the previous mark is charged to it).
    fn mark(&mut self, name: &'static str) -> Result<()> {
        if !self.on {
            return Ok(());
        }
        let e = self
            .b
            .inner
            .stream
            .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| self.b.err(format!("event: {e:?}")))?;
        self.pending.push((name, e));
        Ok(())
    }

    /// Charges the recorded intervals to their stages (call after a synchronize).
    fn resolve(&mut self) -> Result<()> {
        for w in self.pending.windows(2) {
            let us = 1e3
                * w[0]
                    .1
                    .elapsed_ms(&w[1].1)
                    .map_err(|e| self.b.err(format!("event: {e:?}")))? as f64;
            match self.totals.iter_mut().find(|(n, _)| *n == w[1].0) {
                Some(t) => t.1 += us,
                None => self.totals.push((w[1].0, us)),
            }
        }
        self.pending.clear();
        Ok(())
    }
}

/// Device-to-device copy bandwidth (bytes read + written per second, GB/s) of a `bytes` buffer.
pub fn copy_bandwidth(b: &CudaBackend, bytes: usize, reps: usize) -> Result<f64> {
    let src = b.alloc::<u8>(bytes)?;
    let mut dst = b.alloc::<u8>(bytes)?;
    let e = |x: cudarc::driver::DriverError| b.err(format!("{x:?}"));
    let secs = b.time_calls(1, reps, || {
        b.inner.stream.memcpy_dtod(&src, &mut dst).map_err(e)
    })?;
    Ok(2.0 * bytes as f64 / secs / 1e9)
}

/// The shapes of a Laguna config that the benchmark and the stream probe lay out.
pub(super) struct Geometry {
    pub(super) hidden: usize,
    pub(super) layers: usize,
    pub(super) full: Vec<bool>,
    pub(super) heads: Vec<usize>,
    pub(super) kv_heads: usize,
    pub(super) head_dim: usize,
    pub(super) window: usize,
    pub(super) experts: usize,
    pub(super) top_k: usize,
    pub(super) moe_inter: usize,
    pub(super) shared_inter: usize,
    pub(super) dense_inter: usize,
    pub(super) dense_layers: Vec<bool>,
    pub(super) vocab: usize,
    pub(super) attn_nvfp4: bool,
    pub(super) experts_nvfp4: bool,
    pub(super) theta_full: f64,
    pub(super) theta_sliding: f64,
    pub(super) partial_full: f64,
    pub(super) eps: f32,
    pub(super) routed_scale: f32,
}

/// Reads the [`Geometry`] of the Laguna `config.json` at `config`; errors name the file.
pub(super) fn read_geometry(b: &CudaBackend, config: &std::path::Path) -> Result<Geometry> {
    let at = |e: String| b.err(format!("{}: {e}", config.display()));
    let text = std::fs::read_to_string(config).map_err(|e| at(e.to_string()))?;
    let cfg: Value = serde_json::from_str(&text).map_err(|e| at(e.to_string()))?;
    geometry(&cfg).map_err(at)
}

/// Reads the [`Geometry`] of a Laguna `config.json`.
pub(super) fn geometry(cfg: &Value) -> std::result::Result<Geometry, String> {
    let u = |k: &str| {
        cfg.get(k)
            .and_then(Value::as_u64)
            .map(|v| v as usize)
            .ok_or(format!("config: no `{k}`"))
    };
    let layers = u("num_hidden_layers")?;
    // A per-layer list of strings (empty when absent).
    let strs = |k: &str| -> Vec<String> {
        cfg.get(k)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let types = strs("layer_types");
    let full: Vec<bool> = (0..layers)
        .map(|i| !matches!(types.get(i), Some(t) if t != "full_attention"))
        .collect();
    let heads: Vec<usize> = match cfg
        .get("num_attention_heads_per_layer")
        .and_then(Value::as_array)
    {
        Some(a) => a.iter().map(|v| v.as_u64().unwrap_or(0) as usize).collect(),
        None => vec![u("num_attention_heads")?; layers],
    };
    let mlp_types = strs("mlp_layer_types");
    let dense_layers = (0..layers)
        .map(|i| mlp_types.get(i).is_some_and(|t| t == "dense"))
        .collect();
    let targets: Vec<String> = cfg
        .pointer("/quantization_config/config_groups")
        .and_then(Value::as_object)
        .map(|g| {
            g.values()
                .filter_map(|v| v.get("targets").and_then(Value::as_array))
                .flatten()
                .filter_map(|t| t.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let rp = |path: &str| cfg.pointer(path).and_then(Value::as_f64);
    Ok(Geometry {
        hidden: u("hidden_size")?,
        layers,
        full,
        heads,
        kv_heads: u("num_key_value_heads")?,
        head_dim: u("head_dim")?,
        window: u("sliding_window")?,
        experts: u("num_experts")?,
        top_k: u("num_experts_per_tok")?,
        moe_inter: u("moe_intermediate_size")?,
        shared_inter: u("shared_expert_intermediate_size")?,
        dense_inter: u("intermediate_size")?,
        dense_layers,
        vocab: u("vocab_size")?,
        attn_nvfp4: targets.iter().any(|t| t.contains("self_attn")),
        experts_nvfp4: targets.iter().any(|t| t.contains("experts")),
        theta_full: rp("/rope_parameters/full_attention/rope_theta").unwrap_or(500000.0),
        theta_sliding: rp("/rope_parameters/sliding_attention/rope_theta").unwrap_or(10000.0),
        partial_full: rp("/rope_parameters/full_attention/partial_rotary_factor").unwrap_or(1.0),
        eps: cfg
            .get("rms_norm_eps")
            .and_then(Value::as_f64)
            .unwrap_or(1e-6) as f32,
        routed_scale: cfg
            .get("moe_routed_scaling_factor")
            .and_then(Value::as_f64)
            .unwrap_or(1.0) as f32,
    })
}

struct Layer {
    in_norm: CudaSlice<f32>,
    post_norm: CudaSlice<f32>,
    q: CudaLinear,
    k: CudaLinear,
    v: CudaLinear,
    o: CudaLinear,
    g: CudaLinear,
    qn: CudaSlice<f32>,
    kn: CudaSlice<f32>,
    heads: usize,
    full: bool,
    kv: CudaKvLayer,
    mlp: Mlp,
}

// One per layer, built once: the variants' size difference does not matter.
#[allow(clippy::large_enum_variant)]
enum Mlp {
    Dense(CudaExperts),
    Moe {
        router: CudaLinear,
        bias: CudaSlice<f32>,
        experts: CudaExperts,
        shared: [CudaLinear; 3],
    },
}

struct Synth<'a> {
    b: &'a CudaBackend,
    seed: u64,
    bytes: f64,
}

impl Synth<'_> {
    fn next(&mut self) -> u64 {
        self.seed += 1;
        self.seed
    }

    fn linear(&mut self, rows: usize, cols: usize, nvfp4: bool) -> Result<CudaLinear> {
        let b = self.b;
        if nvfp4 {
            let data = b.alloc::<u8>(rows * cols / 2)?;
            let scales = b.alloc::<u8>(rows * cols / 16)?;
            let s = self.next();
            b.fill(b.ptr(&data), rows * cols / 2, s, 0, 0.0)?;
            let s = self.next();
            b.fill(b.ptr(&scales), rows * cols / 16, s, 2, 0.0)?;
            Ok(CudaLinear {
                fmt: 3,
                data,
                scales: Some(scales),
                inv_g: 1.0 / 2688.0,
                rows,
                cols,
                name: "synthetic".into(),
            })
        } else {
            let data = b.alloc::<u8>(rows * cols * 2)?;
            let s = self.next();
            b.fill(b.ptr(&data), rows * cols, s, 1, 0.02)?;
            Ok(CudaLinear {
                fmt: 2,
                data,
                scales: None,
                inv_g: 1.0,
                rows,
                cols,
                name: "synthetic".into(),
            })
        }
    }

    fn arena(&mut self, n: usize, rows: usize, cols: usize, nvfp4: bool) -> Result<ExpertArena> {
        let l = self.linear(n * rows, cols, nvfp4)?;
        Ok(ExpertArena {
            fmt: l.fmt,
            data: l.data,
            scales: l.scales,
            inv_g: self
                .b
                .inner
                .stream
                .clone_htod(&vec![l.inv_g; n])
                .map_err(|e| self.b.err(format!("{e:?}")))?,
        })
    }

    fn experts(
        &mut self,
        n: usize,
        inter: usize,
        hidden: usize,
        nvfp4: bool,
    ) -> Result<CudaExperts> {
        Ok(CudaExperts {
            gate: self.arena(n, inter, hidden, nvfp4)?,
            up: self.arena(n, inter, hidden, nvfp4)?,
            down: self.arena(n, hidden, inter, nvfp4)?,
            n,
            inter,
            hidden,
        })
    }

    fn vector(&mut self, n: usize, amp: f32) -> Result<CudaSlice<f32>> {
        let v = self.b.alloc::<f32>(n)?;
        let s = self.next();
        self.b.fill(self.b.ptr(&v), n, s, 3, amp)?;
        Ok(v)
    }
}

fn wbytes(l: &CudaLinear) -> f64 {
    l.bytes() as f64
}

/// Runs the synthetic decode benchmark for one build (config) at each context; `bytes_per_token`
/// is inspect's figure for the build (0 = use the computed weight bytes).
pub fn synthetic_laguna_decode(
    b: &CudaBackend,
    config: &std::path::Path,
    build: &str,
    contexts: &[usize],
    bytes_per_token: f64,
    copy_gbs: f64,
    reps: usize,
) -> Result<Vec<BenchRow>> {
    let g = read_geometry(b, config)?;
    let max_ctx = contexts.iter().copied().max().unwrap_or(0);
    let (h, d) = (g.hidden, g.head_dim);
    let kvw = g.kv_heads * d;
    let mut s = Synth {
        b,
        seed: 0x5eed,
        bytes: 0.0,
    };
    let embed = s.linear(g.vocab, h, false)?;
    let lm_head = s.linear(g.vocab, h, false)?;
    let final_norm = s.vector(h, 1.0)?;
    s.bytes += wbytes(&lm_head) + (h * 2) as f64 + (h * 4) as f64;
    let mut layers = Vec::with_capacity(g.layers);
    for i in 0..g.layers {
        let heads = g.heads[i];
        let q = s.linear(heads * d, h, g.attn_nvfp4)?;
        let k = s.linear(kvw, h, g.attn_nvfp4)?;
        let v = s.linear(kvw, h, g.attn_nvfp4)?;
        let o = s.linear(h, heads * d, g.attn_nvfp4)?;
        let gp = s.linear(heads, h, false)?;
        s.bytes += wbytes(&q) + wbytes(&k) + wbytes(&v) + wbytes(&o) + wbytes(&gp);
        let mlp = if g.dense_layers[i] {
            let e = s.experts(1, g.dense_inter, h, false)?;
            s.bytes += (3 * g.dense_inter * h * 2) as f64;
            Mlp::Dense(e)
        } else {
            let router = s.linear(g.experts, h, false)?;
            let bias = s.vector(g.experts, 0.01)?;
            let experts = s.experts(g.experts, g.moe_inter, h, g.experts_nvfp4)?;
            let shared = [
                s.linear(g.shared_inter, h, false)?,
                s.linear(g.shared_inter, h, false)?,
                s.linear(h, g.shared_inter, false)?,
            ];
            let per_expert =
                3.0 * (g.moe_inter * h) as f64 * if g.experts_nvfp4 { 0.5625 } else { 2.0 };
            s.bytes += wbytes(&router)
                + (g.experts * 4) as f64
                + g.top_k as f64 * per_expert
                + shared.iter().map(wbytes).sum::<f64>();
            Mlp::Moe {
                router,
                bias,
                experts,
                shared,
            }
        };
        let spec = KvLayerSpec {
            kv_heads: g.kv_heads,
            head_dim: d,
            window: if g.full[i] { None } else { Some(g.window) },
            dtype: KvDtype::Bf16,
            k_scale: 1.0,
            v_scale: 1.0,
        };
        let mut kv = b.new_kv_layer(&spec)?;
        let cap = if g.full[i] { max_ctx + 1 } else { g.window };
        b.kv_grow(&mut kv, cap)?;
        let n = kv.cap * kvw;
        let s1 = s.next();
        b.fill(b.ptr(&kv.k), n, s1, 1, 1.0)?;
        let s2 = s.next();
        b.fill(b.ptr(&kv.v), n, s2, 1, 1.0)?;
        layers.push(Layer {
            in_norm: s.vector(h, 1.0)?,
            post_norm: s.vector(h, 1.0)?,
            q,
            k,
            v,
            o,
            g: gp,
            qn: s.vector(d, 1.0)?,
            kn: s.vector(d, 1.0)?,
            heads,
            full: g.full[i],
            kv,
            mlp,
        });
    }
    let inv = |theta: f64, rdim: usize| -> Vec<f32> {
        (0..rdim / 2)
            .map(|i| theta.powf(-2.0 * i as f64 / rdim as f64) as f32)
            .collect()
    };
    let rdim_full = ((d as f64) * g.partial_full) as usize;
    let inv_full = b
        .inner
        .stream
        .clone_htod(&inv(g.theta_full, rdim_full))
        .map_err(|e| b.err(format!("{e:?}")))?;
    let inv_sliding = b
        .inner
        .stream
        .clone_htod(&inv(g.theta_sliding, d))
        .map_err(|e| b.err(format!("{e:?}")))?;

    // Persistent activations (fixed addresses for the graph).
    let max_heads = g.heads.iter().copied().max().unwrap_or(1);
    let x = b.alloc::<f32>(h)?;
    let a = b.alloc::<f32>(h)?;
    let qb = b.alloc::<f32>(max_heads * d)?;
    let kb = b.alloc::<f32>(kvw)?;
    let vb = b.alloc::<f32>(kvw)?;
    let gb = b.alloc::<f32>(max_heads)?;
    let ob = b.alloc::<f32>(max_heads * d)?;
    let rl = b.alloc::<f32>(g.experts.max(1))?;
    let sel = b.alloc::<i32>(g.top_k)?;
    let wts = b.alloc::<f32>(g.top_k)?;
    let dsel = b.alloc::<i32>(1)?;
    let dwts = b
        .inner
        .stream
        .clone_htod(&[1.0f32])
        .map_err(|e| b.err(format!("{e:?}")))?;
    let hw = ((g.top_k + 1) * g.moe_inter.max(g.shared_inter)).max(g.dense_inter);
    let hb = b.alloc::<f32>(hw)?;
    let logits = b.alloc::<f32>(g.vocab)?;
    let part = b.alloc::<f32>((g.top_k + 1) * h)?;
    let ids = b
        .inner
        .stream
        .clone_htod(&[1u32])
        .map_err(|e| b.err(format!("{e:?}")))?;
    let one = |v: f32| {
        b.inner
            .stream
            .clone_htod(&[v])
            .map_err(|e| b.err(format!("{e:?}")))
    };
    let shared_inv: Vec<[CudaSlice<f32>; 3]> = layers
        .iter()
        .map(|l| match &l.mlp {
            Mlp::Moe { shared, .. } => Ok([
                one(shared[0].inv_g)?,
                one(shared[1].inv_g)?,
                one(shared[2].inv_g)?,
            ]),
            Mlp::Dense(_) => Ok([one(1.0)?, one(1.0)?, one(1.0)?]),
        })
        .collect::<Result<_>>()?;
    let max_splits = super::MAX_SPLITS;
    let part_o = b.alloc::<f32>(max_heads * max_splits * d)?;
    let part_ml = b.alloc::<f32>(max_heads * max_splits * 2)?;
    b.fill(b.ptr(&x), h, 99, 3, 1.0)?;
    b.synchronize()?;
    let weight_bytes = s.bytes;
    let total_mem = layers.len();
    let _ = total_mem;

    let mut rows = Vec::new();
    for &ctx in contexts {
        for l in layers.iter_mut() {
            l.kv.len = ctx;
        }
        let kv_bytes: f64 = layers
            .iter()
            .map(|l| {
                let keys = if l.full {
                    ctx + 1
                } else {
                    g.window.min(ctx + 1)
                };
                (2 * keys * kvw * 2) as f64
            })
            .sum();
        let mut step = |tm: &mut StageTimer, fuse: bool| -> Result<()> {
            let bp = |s: &CudaSlice<f32>| b.ptr(s);
            tm.mark("start")?;
            ops::prefill::EmbedArgs {
                fmt: embed.fmt,
                w: b.ptr(&embed.data),
                scales: DevPtr::NULL,
                inv_g: 1.0,
                ids: b.ptr(&ids),
                y: bp(&x),
                k: h as i32,
            }
            .launch(b, (1, 1, 1), (256, 1, 1))?;
            tm.mark("embed")?;
            ops::elementwise::RmsNormArgs {
                x: bp(&x),
                w: bp(&layers[0].in_norm),
                y: bp(&a),
                width: h as i32,
                eps: g.eps,
            }
            .launch(b, (1, 1, 1), (512, 1, 1))?;
            tm.mark("input rmsnorm")?;
            let nl = layers.len();
            for li in 0..nl {
                // The next layer's input norm (or the final norm) is fused into this layer's
                // last kernel (the experts' ordered sum).
                let next_norm = if li + 1 < nl {
                    bp(&layers[li + 1].in_norm)
                } else {
                    bp(&final_norm)
                };
                let next = Epi::norm(b, bp(&x), next_norm, bp(&a), h, g.eps);
                let l = &mut layers[li];
                let qkvg = MultiLinear::new(
                    b,
                    &[
                        (&l.q, bp(&qb)),
                        (&l.k, bp(&kb)),
                        (&l.v, bp(&vb)),
                        (&l.g, bp(&gb)),
                    ],
                    h,
                )?;
                b.linear_multi_raw(&qkvg, bp(&a))?;
                tm.mark("q/k/v/g projections (one launch)")?;
                let (invf, rdim, theta_af) = if l.full {
                    (&inv_full, rdim_full, 1.0f32)
                } else {
                    (&inv_sliding, d, 1.0f32)
                };
                // The new k (rotated) and v rows go into the cache slot of position `ctx` in the
                // same launch (the benchmark's position does not advance: every replay rewrites
                // the same slot; attention reads the new row from kb/vb, not the cache).
                let slot = if l.full { ctx } else { ctx % g.window };
                // With `fuse`, the decode attention kernel does the norms, rope and append itself.
                let norms = QkNorms {
                    q: bp(&l.qn),
                    k: bp(&l.kn),
                    eps: g.eps,
                };
                let rope = RopeDev {
                    inv_freq: bp(invf),
                    rdim,
                    attn_factor: theta_af,
                };
                let prep = (fuse && CudaBackend::dec_attention_applies(&l.kv, d, 1))
                    .then(|| AttnPrep::new(b, &l.kv, slot, norms, rope));
                if prep.is_none() {
                    b.qk_norm_rope_raw(
                        &l.kv,
                        QkNormRope {
                            q: bp(&qb),
                            k: bp(&kb),
                            v: bp(&vb),
                            heads: l.heads,
                            pos: ctx,
                            slot,
                            norms,
                            rope,
                        },
                    )?;
                    tm.mark("q/k norms + rope + kv append")?;
                }
                let p = AttentionParams {
                    heads: l.heads,
                    kv_heads: g.kv_heads,
                    head_dim: d,
                    scale: 1.0 / (d as f32).sqrt(),
                };
                let keys = if l.full {
                    ctx + 1
                } else {
                    g.window.min(ctx + 1)
                };
                let splits = b.splits_for(keys, &p, 1);
                let pos0 = l.kv.len;
                b.attention_raw(
                    &l.kv,
                    &p,
                    AttnCall {
                        q: bp(&qb),
                        k: bp(&kb),
                        v: bp(&vb),
                        pos0,
                        t: 1,
                        out: bp(&ob),
                        gate: bp(&gb),
                        splits,
                        scratch: Some((bp(&part_o), bp(&part_ml))),
                        prep,
                    },
                )?;
                tm.mark(match (l.full, prep.is_some()) {
                    (true, false) => "attention full (+ merge, gate)",
                    (false, false) => "attention sliding (+ merge, gate)",
                    (true, true) => "attention full (+ q/k norms, rope, append, merge, gate)",
                    (false, true) => "attention sliding (+ q/k norms, rope, append, merge, gate)",
                })?;
                b.gemv_raw(&l.o, Gemv::token_resid(bp(&ob), bp(&x), bp(&x)))?;
                tm.mark("o projection")?;
                // With `fuse`, a MoE layer's post-attention norm runs inside the router's launch.
                let norm_in_router = fuse
                    && matches!(&l.mlp, Mlp::Moe { router, .. } if CudaBackend::norm_gemv_applies(router));
                if !norm_in_router {
                    ops::elementwise::RmsNormArgs {
                        x: bp(&x),
                        w: bp(&l.post_norm),
                        y: bp(&a),
                        width: h as i32,
                        eps: g.eps,
                    }
                    .launch(b, (1, 1, 1), (512, 1, 1))?;
                    tm.mark("post rmsnorm")?;
                }
                match &l.mlp {
                    Mlp::Dense(e) => {
                        b.experts_raw(
                            e,
                            None,
                            MoeBuffers {
                                sel: &dsel,
                                wts: &dwts,
                                top_k: 1,
                                tokens: 1,
                                x: bp(&a),
                                h: bp(&hb),
                                part: bp(&part),
                                out: bp(&x),
                                resid: bp(&x),
                            },
                            if fuse { next } else { Epi::default() },
                            None,
                        )?;
                        if !fuse {
                            b.epilogue_launch(&next, 1)?;
                        }
                        tm.mark("dense mlp (+ next norm)")?;
                    }
                    Mlp::Moe {
                        router,
                        bias,
                        experts,
                        shared,
                    } => {
                        if norm_in_router {
                            b.norm_gemv_raw(
                                router,
                                NormGemv {
                                    x: bp(&x),
                                    norm_w: bp(&l.post_norm),
                                    eps: g.eps,
                                    xn: bp(&a),
                                    y: bp(&rl),
                                },
                            )?;
                            tm.mark("post rmsnorm + router gemv")?;
                        } else {
                            b.gemv_raw(router, Gemv::token(bp(&a), bp(&rl)))?;
                            tm.mark("router gemv")?;
                        }
                        let params = RouterParams {
                            top_k: g.top_k,
                            scoring: RouterScoring::Sigmoid,
                            normalize: true,
                            logit_softcap: 0.0,
                        };
                        let route =
                            Route::new(bp(&rl), bp(bias), g.experts, &params, g.routed_scale);
                        let sh = SharedExpert {
                            gate: &shared[0],
                            up: &shared[1],
                            down: &shared[2],
                        };
                        let inv = &shared_inv[li];
                        b.experts_raw(
                            experts,
                            Some((&sh, [b.ptr(&inv[0]), b.ptr(&inv[1]), b.ptr(&inv[2])])),
                            MoeBuffers {
                                sel: &sel,
                                wts: &wts,
                                top_k: g.top_k,
                                tokens: 1,
                                x: bp(&a),
                                h: bp(&hb),
                                part: bp(&part),
                                out: bp(&x),
                                resid: bp(&x),
                            },
                            if fuse { next } else { Epi::default() },
                            Some(&route),
                        )?;
                        if !fuse {
                            b.epilogue_launch(&next, 1)?;
                        }
                        tm.mark("experts (top-k, routed + shared, + next norm)")?;
                    }
                }
            }
            b.gemv_raw(&lm_head, Gemv::token(b.ptr(&a), b.ptr(&logits)))?;
            tm.mark("lm_head")?;
            Ok(())
        };
        // Eager run once (checks every launch) with the epilogues fused and the persistent MoE
        // kernels, once with separate launches and the per-item MoE kernels (same logits
        // expected), then timed per stage, then capture.
        let mut tm = StageTimer::new(b);
        let keep = b.options();
        b.set_options(CudaOptions {
            persistent_moe: false,
            ..keep.clone()
        });
        let r = step(&mut tm, false);
        b.set_options(keep);
        r?;
        let separate = b
            .inner
            .stream
            .clone_dtoh(&logits)
            .map_err(|e| b.err(format!("{e:?}")))?;
        step(&mut tm, true)?;
        let fused = b
            .inner
            .stream
            .clone_dtoh(&logits)
            .map_err(|e| b.err(format!("{e:?}")))?;
        let top = separate.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
        let diff = separate
            .iter()
            .zip(&fused)
            .fold(0f32, |m, (p, q)| m.max((p - q).abs()));
        let fused_vs_separate_rel = f64::from(diff / top);
        eprintln!(
            "  {build} ctx {ctx}: fused epilogues + persistent MoE vs separate launches + per-item \
             MoE: max |Δ logit| {diff:.3e} \
             ({fused_vs_separate_rel:.2e} of max |logit| {top:.3})"
        );
        if fused_vs_separate_rel.is_nan() || fused_vs_separate_rel > 1e-2 {
            return Err(b.err(format!(
                "{build} ctx {ctx}: fused epilogues / persistent MoE change the logits by {fused_vs_separate_rel:.2e} \
                 of their range"
            )));
        }
        tm.on = true;
        const PROFILED: usize = 3;
        for _ in 0..PROFILED {
            step(&mut tm, true)?;
            b.synchronize()?;
            tm.resolve()?;
        }
        tm.on = false;
        let stages_us: Vec<(String, f64)> = tm
            .totals
            .iter()
            .map(|(n, us)| (n.to_string(), us / PROFILED as f64))
            .collect();
        let eager_ms = b.time_calls(0, 3, || step(&mut tm, true))? * 1e3;
        let graph = b.capture_graph(|| step(&mut tm, true))?;
        let mut kernels = 0usize;
        // SAFETY: a valid captured graph; a null node array asks for the count only.
        unsafe {
            cudarc::driver::sys::cuGraphGetNodes(
                graph.cu_graph(),
                std::ptr::null_mut(),
                &mut kernels,
            )
        }
        .result()
        .map_err(|e| b.err(format!("graph nodes: {e:?}")))?;
        let secs = b.time_graph(&graph, reps)?;
        if let Ok(list) = std::env::var("FP4FORGE_BENCH_SPLIT_SWEEP") {
            let keep = b.options();
            for item in list.split(',') {
                let mut it = item.split(':').filter_map(|v| v.trim().parse::<u32>().ok());
                let (Some(mk), Some(ps)) = (it.next(), it.next()) else {
                    continue;
                };
                b.set_options(CudaOptions {
                    attn_split_min_keys: mk,
                    attn_split_blocks_per_sm: ps,
                    ..keep.clone()
                });
                let g2 = b.capture_graph(|| step(&mut tm, true))?;
                let ms = b.time_graph(&g2, reps)? * 1e3;
                eprintln!(
                    "  {build} ctx {ctx}: split keys {mk} blocks/SM {ps}: graph {ms:.3} ms/token"
                );
            }
            b.set_options(keep);
        }
        let bpt = if bytes_per_token > 0.0 {
            bytes_per_token
        } else {
            weight_bytes
        };
        let tok_s = 1.0 / secs;
        eprintln!(
            "  {build} ctx {ctx}: graph {:.3} ms/token, eager {eager_ms:.3} ms/token, {kernels} kernels",
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
            kernels,
            fused_vs_separate_rel,
            stages_us,
        });
    }
    Ok(rows)
}

/// Times single kernels at Laguna-S shapes (synthetic data): `(name, µs per call, GB/s of the
/// bytes it must read)`.
pub fn kernel_microbench(b: &CudaBackend) -> Result<Vec<(String, f64, f64)>> {
    let mut s = Synth {
        b,
        seed: 77,
        bytes: 0.0,
    };
    let reps = 30;
    let mut out = Vec::new();
    let x = s.vector(100352, 1.0)?;
    let y = b.alloc::<f32>(100352)?;
    let time =
        |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> { Ok(b.time_calls(1, reps, f)? * 1e6) };
    for (rows, cols, nv) in [
        (9216, 3072, true),
        (9216, 3072, false),
        (3072, 9216, true),
        (1024, 3072, true),
        (100352, 3072, false),
        (12288, 3072, false),
    ] {
        let w = s.linear(rows, cols, nv)?;
        let bytes = w.bytes() as f64;
        let us = time(&mut || b.gemv_raw(&w, Gemv::token(b.ptr(&x), b.ptr(&y))))?;
        let name = format!("gemv {} {rows}x{cols}", if nv { "nvfp4" } else { "bf16" });
        out.push((name.clone(), us, bytes / us / 1e3));
        let us = time(&mut || {
            ops::gemv::LinearArgs {
                fmt: w.fmt,
                w: b.ptr(&w.data),
                scales: w.scales_ptr(b),
                inv_g: w.inv_g,
                x: b.ptr(&x),
                y: b.ptr(&y),
                bias: DevPtr::NULL,
                resid: DevPtr::NULL,
                n: rows as i32,
                k: cols as i32,
                t: 1,
            }
            .launch(
                b,
                ((rows as u32).div_ceil(GEMV_WARPS), 1, 1),
                (32 * GEMV_WARPS, 1, 1),
            )
        })?;
        out.push((format!("{name} (1 row/warp)"), us, bytes / us / 1e3));
    }
    // One MoE layer's experts: 10 routed NVFP4 + shared bf16.
    let (hid, inter, k) = (3072usize, 1024usize, 10usize);
    let e = s.experts(256, inter, hid, true)?;
    let sh = [
        s.linear(inter, hid, false)?,
        s.linear(inter, hid, false)?,
        s.linear(hid, inter, false)?,
    ];
    let one = b
        .inner
        .stream
        .clone_htod(&[1.0f32])
        .map_err(|e| b.err(format!("{e:?}")))?;
    let sel: Vec<i32> = (0..k as i32).map(|i| i * 25 + 3).collect();
    let sel = b
        .inner
        .stream
        .clone_htod(&sel)
        .map_err(|e| b.err(format!("{e:?}")))?;
    let wts = b
        .inner
        .stream
        .clone_htod(&[0.1f32; 10])
        .map_err(|e| b.err(format!("{e:?}")))?;
    let hb = b.alloc::<f32>((k + 1) * inter)?;
    let part = b.alloc::<f32>((k + 1) * hid)?;
    let sx = SharedExpert {
        gate: &sh[0],
        up: &sh[1],
        down: &sh[2],
    };
    let bytes = k as f64 * 3.0 * (inter * hid) as f64 * 0.5625 + 3.0 * (inter * hid * 2) as f64;
    let us = time(&mut || {
        b.experts_raw(
            &e,
            Some((&sx, [b.ptr(&one); 3])),
            MoeBuffers {
                sel: &sel,
                wts: &wts,
                top_k: k,
                tokens: 1,
                x: b.ptr(&x),
                h: b.ptr(&hb),
                part: b.ptr(&part),
                out: b.ptr(&y),
                resid: DevPtr::NULL,
            },
            Epi::default(),
            None,
        )
    })?;
    out.push((
        "experts 10 nvfp4 + shared bf16 (3 launches)".into(),
        us,
        bytes / us / 1e3,
    ));
    // Attention over bf16 caches.
    for (label, window, ctx, heads) in [
        ("full", None, 2048usize, 48usize),
        ("full", None, 65536, 48),
        ("sliding", Some(512usize), 2048, 72),
    ] {
        let spec = KvLayerSpec {
            kv_heads: 8,
            head_dim: 128,
            window,
            dtype: KvDtype::Bf16,
            k_scale: 1.0,
            v_scale: 1.0,
        };
        let mut kv = b.new_kv_layer(&spec)?;
        b.kv_grow(&mut kv, ctx + 1)?;
        let n = kv.cap * 1024;
        b.fill(b.ptr(&kv.k), n, 5, 1, 1.0)?;
        b.fill(b.ptr(&kv.v), n, 6, 1, 1.0)?;
        kv.len = ctx;
        let p = AttentionParams {
            heads,
            kv_heads: 8,
            head_dim: 128,
            scale: 0.088,
        };
        let keys = window.unwrap_or(ctx + 1).min(ctx + 1);
        let splits = b.splits_for(keys, &p, 1);
        let po = b.alloc::<f32>(heads * super::MAX_SPLITS * 128)?;
        let pml = b.alloc::<f32>(heads * super::MAX_SPLITS * 2)?;
        let us = time(&mut || {
            b.attention_raw(
                &kv,
                &p,
                AttnCall {
                    q: b.ptr(&x),
                    k: b.ptr(&x),
                    v: b.ptr(&x),
                    pos0: ctx,
                    t: 1,
                    out: b.ptr(&y),
                    gate: b.ptr(&x),
                    splits,
                    scratch: Some((b.ptr(&po), b.ptr(&pml))),
                    prep: None,
                },
            )
        })?;
        let bytes = (keys * 1024 * 2 * 2) as f64;
        out.push((
            format!("attention {label} ctx {ctx} ({splits} splits)"),
            us,
            bytes / us / 1e3,
        ));
    }
    Ok(out)
}
