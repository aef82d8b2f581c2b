//! Decode-stream probe: how close to the copy bandwidth can a batch-1 decode step get, given only
//! its byte stream and its dependencies, in each kernel organisation?
//!
//! From a Laguna `config.json` the probe lays out the bytes one decode step reads at real sizes
//! (per layer: q/k/v/g, the KV cache up to the context, o, the router, the shared expert and the
//! top-k routed experts out of a full arena of experts, the dense layer's MLP, the lm_head; NVFP4
//! tensors as codes + scales, as the config's quantization targets say) and streams them with
//! trivial compute (`stream_probe.cu`: each block folds its slice into one word), in the order
//! and with the waits of the real step: a stage consumes only once the stage it depends on is
//! complete, and the routed experts' addresses come from the router stage's outputs. Each block
//! reads a contiguous slice of a stage's concatenated regions (row ranges, as a GEMV block does),
//! with 8 loads per thread in flight. The plan comes with 6 dependent stages per MoE layer (the
//! backend's kernels) and with 4 (attention + o and gate/up + down fused by split-K partial sums).
//! Three organisations are timed on each plan:
//!
//! - `chain`: one launch per stage with programmatic dependent launch, captured in a CUDA graph
//!   (the organisation of the backend's decode step, without its arithmetic);
//! - `persistent`: one launch per step, stages ordered by counters in global memory;
//! - `ring`: one launch per step, a producer warp per SM streaming through shared-memory slots
//!   with bulk copies ahead of the stage boundaries (weights do not depend on activations).
//!
//! Consumers fold their bytes with trivial integer arithmetic (optionally 24 extra instructions
//! per 16 bytes), or, in the `real` rows, do the backend's own per-byte arithmetic (NVFP4 codes
//! through the tensor-core decode, bf16 weights and KV entries through the f32 dot product; the
//! probe's source is compiled after the backend's `common.cu`, `gemv.cu` and `elementwise.cu`).
//! The trivial rows are upper bounds for each organisation; the `real` rows add what the
//! arithmetic costs when it is the backend's and the organisation is the probe's.

use std::path::Path;

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

use fp4forge_engine::backend::cuda::KERNELS_CU;
use fp4forge_engine::Result;

use crate::geometry::{read_geometry, Geometry};
use crate::gpu::Gpu;

/// The probe's kernel source: the backend's kernels (`KERNELS_CU`: the probe borrows the
/// arithmetic of `common.cu`, `gemv.cu` and `elementwise.cu`), then `stream_probe.cu`.
pub fn stream_probe_cu() -> String {
    format!("{KERNELS_CU}\n{}", include_str!("stream_probe.cu"))
}

/// The probe's kernels (`extern "C"` entries of `stream_probe.cu`), in the order
/// `decode_stream_probe` loads them into `ProbeFns`.
pub const STREAM_PROBE_KERNELS: [&str; 6] = [
    "probe_stage",
    "probe_stage_real",
    "probe_persistent",
    "probe_ring",
    "probe_ring_real",
    "probe_ring_real16",
];

/// Compiles the probe's kernels for `arch` (`sm_90` or later: bulk copies and mbarriers) with
/// NVRTC. Needs only the NVRTC library (no GPU): a build check.
pub fn compile_stream_probe(arch: &'static str) -> std::result::Result<Ptx, String> {
    let opts = CompileOptions {
        arch: Some(arch),
        options: vec!["-std=c++17".into(), "-default-device".into()],
        ..Default::default()
    };
    compile_ptx_with_opts(stream_probe_cu(), opts).map_err(|x| format!("NVRTC (stream probe): {x}"))
}

/// One timed organisation of one build at one context.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProbeRow {
    /// Build label (`stock`, `lean`).
    pub build: String,
    /// Context length (KV positions read by the full-attention layers).
    pub context: usize,
    /// Dependent stages per MoE layer: 6 (the backend's kernels: q/k/v/g, attention, o, router,
    /// gate/up, down) or 4 (attention + o and gate/up + down fused; see `plan`).
    pub stages_per_layer: usize,
    /// Kernel organisation (`chain`, `persistent`, `ring 12x16K`, ...) and its consumers'
    /// arithmetic (`+24 instr/16 B`, `real arithmetic`; none: a trivial fold); `no bytes: ...`
    /// for the plan with every region empty (the dependencies alone).
    pub organisation: String,
    /// Stages of the step (each waits for its predecessor).
    pub stages: usize,
    /// Milliseconds per step.
    pub ms_per_token: f64,
    /// Steps per second.
    pub tok_s: f64,
    /// Bytes the step reads (weights + KV).
    pub bytes_per_token: f64,
    /// `bytes_per_token / time`, GB/s.
    pub gbs: f64,
    /// `gbs` over the copy bandwidth measured in the same run.
    pub fraction_of_copy: f64,
}

/// `#[repr(C)]` mirror of `Region` in stream_probe.cu.
#[repr(C)]
#[derive(Clone, Copy)]
struct Region {
    ptr: u64,
    bytes: u64,
    stride: u64,
    routed: i32,
    kind: i32,
}

/// `Region::kind`: what the bytes are (`REGION_*` in stream_probe.cu).
const REGION_BF16: i32 = 0;
const REGION_CODES: i32 = 1;
const REGION_SCALES: i32 = 2;

/// Floats of a stage's input the real consumers stage (`PROBE_XS` in stream_probe.cu).
const PROBE_XS: usize = 9216;

/// `#[repr(C)]` mirror of `Stage` in stream_probe.cu.
#[repr(C)]
#[derive(Clone, Copy)]
struct Stage {
    first_region: i32,
    n_regions: i32,
    wait: i32,
    select: i32,
    x_len: i32,
    pad: i32,
}

/// The step's stages and regions, laid out before any allocation: a region's `ptr` holds the
/// index of its buffer in `buffers` (sizes in bytes) until [`Plan::allocate`] makes it an address.
struct Plan {
    buffers: Vec<u64>,
    regions: Vec<Region>,
    stages: Vec<Stage>,
    /// Bytes the step reads: weights, and (of those) KV-cache entries.
    bytes: u64,
    kv_bytes: u64,
}

impl Plan {
    fn buffer(&mut self, bytes: u64) -> u64 {
        self.buffers.push(bytes);
        self.buffers.len() as u64 - 1
    }

    /// Regions of a `rows × cols` weight (NVFP4: codes and per-16 fp8 scales; else bf16).
    fn weight(&mut self, rows: usize, cols: usize, nvfp4: bool) -> Vec<Region> {
        parts(rows, cols, nvfp4)
            .into_iter()
            .map(|(n, kind)| Region {
                ptr: self.buffer(n),
                bytes: n,
                stride: 0,
                routed: -1,
                kind,
            })
            .collect()
    }

    /// Regions of the top-k experts out of an arena of `experts` weights of `rows × cols`.
    fn routed(
        &mut self,
        experts: usize,
        top_k: usize,
        rows: usize,
        cols: usize,
        nvfp4: bool,
    ) -> Vec<Region> {
        let mut out = Vec::new();
        for (stride, kind) in parts(rows, cols, nvfp4) {
            let base = self.buffer(stride * experts as u64);
            out.extend((0..top_k).map(|j| Region {
                ptr: base,
                bytes: stride,
                stride,
                routed: j as i32,
                kind,
            }));
        }
        out
    }

    /// A stage reading `regions` once stage `wait` is complete, its routed regions picked by
    /// stage `select`, its input vector `x_len` values wide.
    fn stage(
        &mut self,
        regions: Vec<Region>,
        wait: Option<usize>,
        select: Option<usize>,
        x_len: usize,
    ) -> usize {
        self.bytes += regions.iter().map(|r| r.bytes).sum::<u64>();
        self.stages.push(Stage {
            first_region: self.regions.len() as i32,
            n_regions: regions.len() as i32,
            wait: wait.map_or(-1, |w| w as i32),
            select: select.map_or(-1, |s| s as i32),
            x_len: x_len as i32,
            pad: 0,
        });
        self.regions.extend(regions);
        self.stages.len() - 1
    }

    /// Allocates the buffers on `b` and points the regions at them; the buffers live as long
    /// as the returned vector.
    fn allocate(&mut self, b: &Gpu) -> Result<Vec<CudaSlice<u8>>> {
        let bufs = self
            .buffers
            .iter()
            .map(|&n| b.alloc::<u8>(n as usize))
            .collect::<Result<Vec<_>>>()?;
        for r in &mut self.regions {
            r.ptr = b.ptr(&bufs[r.ptr as usize]);
        }
        Ok(bufs)
    }
}

/// Bytes (each rounded up to 16) and kinds of the parts of a `rows × cols` weight: NVFP4 codes
/// and fp8 scales, or bf16.
fn parts(rows: usize, cols: usize, nvfp4: bool) -> Vec<(u64, i32)> {
    let n = if nvfp4 {
        vec![
            (rows * cols / 2, REGION_CODES),
            (rows * cols / 16, REGION_SCALES),
        ]
    } else {
        vec![(rows * cols * 2, REGION_BF16)]
    };
    n.into_iter()
        .map(|(n, kind)| ((n as u64).div_ceil(16) * 16, kind))
        .collect()
}

/// Lays out one decode step at `context` for the geometry `g` (bf16 KV cache). With `fused`, a
/// layer is 4 dependent stages instead of 6: attention and the o projection form one stage (the
/// block that has a head's attention output multiplies it into the o columns of that head and
/// adds its partial sums atomically), and so do gate/up and down (a block multiplies its slice of
/// the intermediate rows into the matching down columns); q/k/v/g and the router stay stages of
/// their own, as their inputs (the normalised residual) need the whole previous stage.
fn plan(g: &Geometry, context: usize, fused: bool) -> Plan {
    let mut p = Plan {
        buffers: Vec::new(),
        regions: Vec::new(),
        stages: Vec::new(),
        bytes: 0,
        kv_bytes: 0,
    };
    let h = g.hidden;
    let kv_row = g.kv_heads * g.head_dim;
    let mut prev: Option<usize> = None;
    for l in 0..g.layers {
        let heads = g.heads[l];
        let q = heads * g.head_dim;
        let mut r = p.weight(q, h, g.attn_nvfp4);
        r.extend(p.weight(kv_row, h, g.attn_nvfp4));
        r.extend(p.weight(kv_row, h, g.attn_nvfp4));
        r.extend(p.weight(heads, h, false));
        let qkv = p.stage(r, prev, None, h);
        let keys = if g.full[l] {
            context
        } else {
            g.window.min(context)
        };
        let mut r = p.weight(keys, kv_row, false);
        r.extend(p.weight(keys, kv_row, false));
        p.kv_bytes += r.iter().map(|r| r.bytes).sum::<u64>();
        let o_w = p.weight(h, q, g.attn_nvfp4);
        // An attention block reads the queries of its KV head's group; the o projection the
        // whole attention output (fused: a block's own heads, split-K).
        let group = q / g.kv_heads;
        let o = if fused {
            r.extend(o_w);
            p.stage(r, Some(qkv), None, group)
        } else {
            let attn = p.stage(r, Some(qkv), None, group);
            p.stage(o_w, Some(attn), None, q)
        };
        if g.dense_layers[l] {
            let mut r = p.weight(g.dense_inter, h, false);
            r.extend(p.weight(g.dense_inter, h, false));
            let down = p.weight(h, g.dense_inter, false);
            prev = Some(if fused {
                r.extend(down);
                p.stage(r, Some(o), None, h)
            } else {
                let up = p.stage(r, Some(o), None, h);
                p.stage(down, Some(up), None, g.dense_inter)
            });
        } else {
            let r = p.weight(g.experts, h, false);
            let router = p.stage(r, Some(o), None, h);
            let mut r = p.weight(2 * g.shared_inter, h, false);
            r.extend(p.routed(g.experts, g.top_k, 2 * g.moe_inter, h, g.experts_nvfp4));
            let mut down = p.weight(h, g.shared_inter, false);
            down.extend(p.routed(g.experts, g.top_k, h, g.moe_inter, g.experts_nvfp4));
            prev = Some(if fused {
                r.extend(down);
                p.stage(r, Some(router), Some(router), h)
            } else {
                let up = p.stage(r, Some(router), Some(router), h);
                // A down block's rows lie in one or two experts: their intermediate values.
                let inter = 2 * g.moe_inter.max(g.shared_inter);
                p.stage(down, Some(up), Some(router), inter)
            });
        }
    }
    let r = p.weight(g.vocab, h, false);
    p.stage(r, prev, None, h);
    p
}

/// Runs the probe for each `(label, config.json)` build at each context; `copy_gbs` is the copy
/// bandwidth measured in the same run. Returns one row per build, organisation and context.
pub fn decode_stream_probe(
    b: &Gpu,
    builds: &[(&str, &Path)],
    contexts: &[usize],
    copy_gbs: f64,
    reps: usize,
) -> Result<Vec<ProbeRow>> {
    let e = |x: cudarc::driver::DriverError| b.err(format!("{x:?}"));
    let (maj, min) = b.ctx.compute_capability().map_err(e)?;
    if maj < 9 {
        return Err(b.err("the stream probe needs sm_90 (bulk copies, mbarriers)"));
    }
    let arch: &'static str = Box::leak(format!("sm_{maj}{min}").into_boxed_str());
    let ptx = compile_stream_probe(arch).map_err(|x| b.err(x))?;
    let module = b.ctx.load_module(ptx).map_err(e)?;
    let [stage, stage_real, persistent, ring, ring_real, ring_real16] =
        STREAM_PROBE_KERNELS.map(|name| module.load_function(name).map_err(e));
    let f = ProbeFns {
        stage: stage?,
        stage_real: stage_real?,
        persistent: persistent?,
        ring: ring?,
        ring_real: ring_real?,
        ring_real16: ring_real16?,
    };
    const RING_BYTES: usize = 192 << 10;
    for ring in [&f.ring, &f.ring_real, &f.ring_real16] {
        ring.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            RING_BYTES as i32,
        )
        .map_err(e)?;
    }
    let mut rows = Vec::new();
    for &(label, config) in builds {
        let g = read_geometry(config).map_err(|x| b.err(x))?;
        rows.extend(probe_build(b, &f, &g, label, contexts, copy_gbs, reps)?);
    }
    Ok(rows)
}

/// The probe's kernels, loaded once per run.
struct ProbeFns {
    stage: CudaFunction,
    stage_real: CudaFunction,
    persistent: CudaFunction,
    ring: CudaFunction,
    ring_real: CudaFunction,
    ring_real16: CudaFunction,
}

/// One configuration of `probe_ring`: `slots` slots of `chunk` bytes, the producer running
/// ahead of the stage boundaries or not, the consumers' `work` ([`REAL`]: the `_real` kernels)
/// and their number of warps (8; 16 only with [`REAL`]: `probe_ring_real16`).
#[derive(Clone, Copy)]
struct RingRun {
    slots: i32,
    chunk: i32,
    lookahead: bool,
    work: i32,
    consumer_warps: u32,
}

impl RingRun {
    const fn new(slots: i32, chunk: i32, lookahead: bool, work: i32, consumer_warps: u32) -> Self {
        Self {
            slots,
            chunk,
            lookahead,
            work,
            consumer_warps,
        }
    }
}

/// `work` of the consumers that do the backend's arithmetic (the `_real` kernels).
const REAL: i32 = -1;

/// The probe's runs for one build (see [`decode_stream_probe`]).
fn probe_build(
    b: &Gpu,
    f: &ProbeFns,
    g: &Geometry,
    label: &str,
    contexts: &[usize],
    copy_gbs: f64,
    reps: usize,
) -> Result<Vec<ProbeRow>> {
    let e = |x: cudarc::driver::DriverError| b.err(format!("{x:?}"));
    let sms = b.sms;
    let mut rows = Vec::new();
    // Every context, then the first one again with no bytes at all: what the dependencies alone
    // cost in each organisation (per stage: ms/token over `stages`).
    let runs = [false, true].into_iter().flat_map(|fused| {
        contexts
            .iter()
            .map(move |&c| (fused, c, false))
            .chain(contexts.first().map(move |&c| (fused, c, true)))
    });
    for (fused, context, empty) in runs {
        let mut plan = plan(g, context, fused);
        if empty {
            plan.regions.iter_mut().for_each(|r| r.bytes = 0);
            plan.bytes = 0;
            plan.kv_bytes = 0;
        }
        let prefix = if empty { "no bytes: " } else { "" };
        let first_row = rows.len();
        let _buffers = plan.allocate(b)?;
        let stages = plan.stages.clone();
        // SAFETY: both are plain `#[repr(C)]` structs of integers, mirrored in stream_probe.cu.
        let stage_bytes = unsafe {
            std::slice::from_raw_parts(
                stages.as_ptr() as *const u8,
                std::mem::size_of_val(stages.as_slice()),
            )
        };
        // SAFETY: as above.
        let region_bytes = unsafe {
            std::slice::from_raw_parts(
                plan.regions.as_ptr() as *const u8,
                std::mem::size_of_val(plan.regions.as_slice()),
            )
        };
        let d_stages = b.stream.clone_htod(stage_bytes).map_err(e)?;
        let d_regions = b.stream.clone_htod(region_bytes).map_err(e)?;
        let n = stages.len();
        let mut counters = b.alloc::<u32>(n)?;
        let grid_max = 4 * sms;
        let mut out = b.alloc::<u32>(n * grid_max)?;
        let row = |organisation: String, secs: f64| {
            let gbs = plan.bytes as f64 / secs / 1e9; // 0 for the empty plan
            ProbeRow {
                build: label.to_string(),
                context,
                stages_per_layer: if fused { 4 } else { 6 },
                organisation: format!("{prefix}{organisation}"),
                stages: n,
                ms_per_token: secs * 1e3,
                tok_s: 1.0 / secs,
                bytes_per_token: plan.bytes as f64,
                gbs,
                fraction_of_copy: gbs / copy_gbs,
            }
        };

        let mut status = b.alloc::<u32>(1)?;
        // What the real consumers stage as each stage's input vector (PROBE_XS floats).
        let xsrc = b.alloc::<f32>(PROBE_XS)?;
        // Fails the probe if a spin wait of `organisation` hit the watchdog (stream_probe.cu).
        let check = |status: &mut CudaSlice<u32>, organisation: &str| -> Result<()> {
            let v = b.stream.clone_dtoh(status).map_err(e)?;
            if v.first().copied().unwrap_or(0) != 0 {
                return Err(b.err(format!(
                    "stream probe ({label}, context {context}, {organisation}): a wait timed out"
                )));
            }
            Ok(())
        };

        // chain: one PDL launch per stage, captured in a graph (at most the blocks per SM that
        // are resident at once: the real arithmetic may need more registers).
        let occ_stage = |f: &CudaFunction| -> Result<usize> {
            Ok(
                f.occupancy_max_active_blocks_per_multiprocessor(256, 0, None)
                    .map_err(e)? as usize,
            )
        };
        let (occ_fold, occ_real) = (occ_stage(&f.stage)?, occ_stage(&f.stage_real)?);
        for (blocks_per_sm, prefetch, work) in [
            (2usize, 1i32, 0i32),
            (4, 1, 0),
            (2, 1, 8),
            (2, 1, REAL),
            (4, 1, REAL),
        ] {
            let real = work == REAL;
            let (kernel, occ) = if real {
                (&f.stage_real, occ_real)
            } else {
                (&f.stage, occ_fold)
            };
            let blocks_per_sm = blocks_per_sm.min(occ.max(1));
            let grid = (blocks_per_sm * sms) as u32;
            let cfg = LaunchConfig {
                grid_dim: (grid, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let step = |out: &mut CudaSlice<u32>| -> Result<()> {
                let (sp, rp, op) = (b.ptr(&d_stages), b.ptr(&d_regions), b.ptr(out));
                for s in 0..n as i32 {
                    let (mut a0, mut a1, mut a2, mut a3, mut a4) = (sp, rp, s, op, prefetch);
                    let (mut work_arg, mut xsrc_arg) = (work, b.ptr(&xsrc));
                    let last = if real {
                        &mut xsrc_arg as *mut u64 as *mut std::ffi::c_void
                    } else {
                        &mut work_arg as *mut i32 as *mut std::ffi::c_void
                    };
                    let mut params = [
                        &mut a0 as *mut u64 as *mut std::ffi::c_void,
                        &mut a1 as *mut u64 as *mut std::ffi::c_void,
                        &mut a2 as *mut i32 as *mut std::ffi::c_void,
                        &mut a3 as *mut u64 as *mut std::ffi::c_void,
                        &mut a4 as *mut i32 as *mut std::ffi::c_void,
                        last,
                    ];
                    // SAFETY: six parameters of the kernel's types, alive across the call:
                    // probe_stage ends with `work` (i32), probe_stage_real with `xsrc` (a pointer).
                    unsafe { b.launch_pdl(kernel, cfg, &mut params)? };
                }
                Ok(())
            };
            step(&mut out)?;
            b.synchronize()?;
            let graph = b.capture_graph(|| step(&mut out))?;
            let secs = b.time_graph(&graph, reps)?;
            let first = if prefetch == 1 {
                ", first loads before the wait"
            } else {
                ""
            };
            rows.push(row(
                format!(
                    "chain, {blocks_per_sm} blocks/SM{first}{}",
                    work_label(work)
                ),
                secs,
            ));
        }

        // persistent: one launch per step; every block must be resident.
        let occ = f
            .persistent
            .occupancy_max_active_blocks_per_multiprocessor(256, 0, None)
            .map_err(e)? as usize;
        for blocks_per_sm in [1usize, 2].into_iter().filter(|&k| k <= occ) {
            let grid = (blocks_per_sm * sms) as u32;
            let secs = b.time_calls(3, reps, || {
                b.stream.memset_zeros(&mut counters).map_err(e)?;
                let mut l = b.stream.launch_builder(&f.persistent);
                let n_i = n as i32;
                l.arg(&d_stages)
                    .arg(&n_i)
                    .arg(&d_regions)
                    .arg(&counters)
                    .arg(&out)
                    .arg(&status);
                let cfg = LaunchConfig {
                    grid_dim: (grid, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: arguments match probe_persistent's signature; the grid is resident.
                unsafe { l.launch(cfg) }.map(|_| ()).map_err(e)
            })?;
            let name = format!("persistent, {blocks_per_sm} blocks/SM");
            check(&mut status, &name)?;
            rows.push(row(name, secs));
        }

        // ring: one block per SM, a producer warp running ahead through shared memory.
        for run in [
            RingRun::new(6, 32768, true, 0, 8),
            RingRun::new(12, 16384, true, 0, 8),
            RingRun::new(6, 32768, false, 0, 8),
            RingRun::new(6, 32768, true, 8, 8),
            RingRun::new(6, 32768, true, REAL, 8),
            RingRun::new(6, 32768, true, REAL, 16),
        ] {
            let secs = b.time_calls(3, reps, || {
                b.stream.memset_zeros(&mut counters).map_err(e)?;
                launch_ring(
                    b,
                    f,
                    (&d_stages, n, &d_regions),
                    (&counters, &out, &status, &xsrc),
                    run,
                )
            })?;
            let ahead = if run.lookahead {
                "ahead of stages"
            } else {
                "stage by stage"
            };
            let warps = if run.consumer_warps == 8 {
                String::new()
            } else {
                format!(", {} consumer warps", run.consumer_warps)
            };
            let name = format!(
                "ring {}x{}K, {ahead}{warps}{}",
                run.slots,
                run.chunk / 1024,
                work_label(run.work)
            );
            check(&mut status, &name)?;
            rows.push(row(name, secs));
        }
        for r in &rows[first_row..] {
            eprintln!(
                "  probe {label} ctx {context}, {} stages/layer: {}: {:.3} ms, {:.0} GB/s ({:.1}%)",
                r.stages_per_layer,
                r.organisation,
                r.ms_per_token,
                r.gbs,
                100.0 * r.fraction_of_copy
            );
        }
    }
    Ok(rows)
}

/// Launches the ring kernel `run` names on one block per SM: `plan` is (stages, stage count,
/// regions), `state` (counters, outputs, watchdog status, the real consumers' input vector).
fn launch_ring(
    b: &Gpu,
    f: &ProbeFns,
    plan: (&CudaSlice<u8>, usize, &CudaSlice<u8>),
    state: (
        &CudaSlice<u32>,
        &CudaSlice<u32>,
        &CudaSlice<u32>,
        &CudaSlice<f32>,
    ),
    run: RingRun,
) -> Result<()> {
    let real = run.work == REAL;
    let kernel = match (real, run.consumer_warps) {
        (false, 8) => &f.ring,
        (true, 8) => &f.ring_real,
        (true, 16) => &f.ring_real16,
        (r, w) => {
            return Err(b.err(format!(
                "stream probe: no ring kernel with {w} consumer warps (real arithmetic: {r})"
            )))
        }
    };
    let mut l = b.stream.launch_builder(kernel);
    let n_i = plan.1 as i32;
    let lookahead = i32::from(run.lookahead);
    l.arg(plan.0)
        .arg(&n_i)
        .arg(plan.2)
        .arg(state.0)
        .arg(state.1)
        .arg(state.2)
        .arg(&run.slots)
        .arg(&run.chunk)
        .arg(&lookahead);
    if real {
        l.arg(state.3);
    } else {
        l.arg(&run.work);
    }
    let cfg = LaunchConfig {
        grid_dim: (b.sms as u32, 1, 1),
        block_dim: (32 * (run.consumer_warps + 1), 1, 1),
        shared_mem_bytes: (run.slots * run.chunk) as u32,
    };
    // SAFETY: arguments match the kernel's signature (probe_ring ends with `work`, the `_real`
    // kernels with `xsrc`); one block per SM is resident.
    unsafe { l.launch(cfg) }
        .map(|_| ())
        .map_err(|x| b.err(format!("{x:?}")))
}

/// ", +N instr/16 B" for a positive `work` (about 3 instructions per round, see
/// stream_probe.cu), ", real arithmetic" for [`REAL`], nothing for 0.
fn work_label(work: i32) -> String {
    match work {
        0 => String::new(),
        REAL => ", real arithmetic".to_string(),
        w => format!(", +{} instr/16 B", 3 * w),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::geometry;

    /// The probe's own source (the `#define`s and kernels the Rust side mirrors).
    const STREAM_PROBE_CU: &str = include_str!("stream_probe.cu");

    fn geometry_of(build: &str) -> Geometry {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../builder/tests/fixtures")
            .join(build)
            .join("config.json");
        let text = std::fs::read_to_string(&path).expect("fixture config");
        geometry(&path, serde_json::from_str(&text).expect("json")).expect("geometry")
    }

    /// The probe streams the real step's weight bytes: `fp4forge inspect`'s bytes per token of
    /// the Laguna-S-2.1 builds (9.906 GB stock, 5.890 GB lean; the small tensors the probe
    /// leaves out, norms, global scales, router bias, one embedding row, are < 0.1%).
    #[test]
    fn probe_plan_reads_the_real_bytes_per_token() {
        for (build, inspect) in [("laguna-s-2.1", 9.906e9), ("laguna-s-2.1-lean", 5.890e9)] {
            for fused in [false, true] {
                let p = plan(&geometry_of(build), 2048, fused);
                let weights = (p.bytes - p.kv_bytes) as f64;
                assert!(
                    (weights / inspect - 1.0).abs() < 1e-3,
                    "{build}: {weights} bytes vs inspect's {inspect}"
                );
                // 12 full layers read 2,048 keys, 36 sliding layers their 512-key window (bf16
                // K+V).
                assert_eq!(p.kv_bytes, (12 * 2048 + 36 * 512) * 8 * 128 * 2 * 2);
            }
        }
    }

    /// Stages wait only on earlier stages, the routed experts' addresses come from a router
    /// stage, every region is 16-byte sized (bulk copies need it), and no stage has more regions
    /// than the kernels hold in shared memory.
    #[test]
    fn probe_plan_dependencies_point_backwards() {
        for (fused, stages) in [
            (false, 48 * 3 + 2 + 47 * 3 + 1),
            (true, 48 * 2 + 1 + 47 * 2 + 1),
        ] {
            check_dependencies(
                &plan(&geometry_of("laguna-s-2.1-lean"), 16384, fused),
                stages,
            );
        }
    }

    /// The constants the Rust side mirrors are the kernel source's.
    #[test]
    fn probe_constants_match_the_kernel_source() {
        let define = |name: &str| {
            STREAM_PROBE_CU
                .lines()
                .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
                .and_then(|v| v.split_whitespace().next()?.parse::<i64>().ok())
                .unwrap_or_else(|| panic!("#define {name} in stream_probe.cu"))
        };
        assert_eq!(define("PROBE_XS"), PROBE_XS as i64);
        assert_eq!(define("REGION_BF16"), REGION_BF16 as i64);
        assert_eq!(define("REGION_CODES"), REGION_CODES as i64);
        assert_eq!(define("REGION_SCALES"), REGION_SCALES as i64);
        for name in STREAM_PROBE_KERNELS {
            assert!(
                STREAM_PROBE_CU.contains(&format!(" {name}(")),
                "kernel `{name}` not in the source"
            );
        }
    }

    /// The real consumers know what they read: NVFP4 codes come with their scales (8 code bytes
    /// per scale byte), everything else is bf16; and each stage's input vector is what the
    /// backend's kernel for it reads (Laguna-S lean, a MoE layer with 72 heads).
    #[test]
    fn probe_plan_kinds_and_inputs() {
        let g = geometry_of("laguna-s-2.1-lean");
        let p = plan(&g, 2048, false);
        for (i, r) in p.regions.iter().enumerate() {
            match r.kind {
                REGION_CODES => {
                    // fixed: the next region; routed: the same expert slot of the scales arena
                    let s = &p.regions[i + if r.routed >= 0 { g.top_k } else { 1 }];
                    assert_eq!(s.kind, REGION_SCALES, "region {i}");
                    assert_eq!(r.bytes, 8 * s.bytes, "region {i}");
                }
                REGION_SCALES | REGION_BF16 => {}
                k => panic!("region {i}: kind {k}"),
            }
        }
        let codes = p.regions.iter().filter(|r| r.kind == REGION_CODES).count();
        // q/k/v/o of 48 layers, and gate/up + down of the top-10 in 47 MoE layers.
        assert_eq!(codes, 48 * 4 + 47 * 2 * 10);
        // Layer 0 is dense (q/k/v/g, attention, o, gate/up, down: 5 stages); layer 1 starts at 5.
        let x: Vec<i32> = p.stages[5..11].iter().map(|s| s.x_len).collect();
        assert_eq!(x, [3072, 72 * 128 / 8, 72 * 128, 3072, 3072, 2 * 1024]);
    }

    fn check_dependencies(p: &Plan, stages: usize) {
        assert_eq!(p.stages.len(), stages);
        let max_regions = STREAM_PROBE_CU
            .lines()
            .find_map(|l| l.strip_prefix("#define PROBE_MAX_REGIONS "))
            .and_then(|v| v.trim().parse::<i32>().ok())
            .expect("PROBE_MAX_REGIONS in stream_probe.cu");
        for (i, s) in p.stages.iter().enumerate() {
            assert!(
                s.n_regions <= max_regions,
                "stage {i}: {} regions",
                s.n_regions
            );
            assert!(s.wait < i as i32 && s.select < i as i32, "stage {i}");
            let regions = &p.regions[s.first_region as usize..][..s.n_regions as usize];
            for r in regions {
                assert_eq!(r.bytes % 16, 0);
                // A routed region only in a stage that selects; fixed regions are -1.
                assert!(r.routed == -1 || (s.select >= 0 && (0..10).contains(&r.routed)));
            }
        }
        let routed = p.regions.iter().filter(|r| r.routed >= 0).count();
        // 47 MoE layers × (gate/up, down) × (codes, scales) × top-10.
        assert_eq!(routed, 47 * 2 * 2 * 10);
        assert_eq!(p.stages[0].wait, -1);
        assert!(p.stages[1..].iter().all(|s| s.wait >= 0));
    }
}
