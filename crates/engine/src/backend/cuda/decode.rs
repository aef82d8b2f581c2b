//! The model path's decode step on CUDA: one new token of each of `n` sequences through a loaded
//! decoder with a fused launch sequence (what `fp4forge-lab`'s decode benchmark times for one),
//! over the model's own weights and KV caches and on activation buffers allocated once (grown
//! when a step needs more rows).
//!
//! Per layer, one sequence: q/k/v(/gate) in one launch (`linear_multi2`); attention that also
//! applies the per-head q/k norms and rope and appends the new KV rows (`AttnPrep`, bf16 or fp8
//! caches at head_dim 64/128; elsewhere one `qk_norm_rope` launch first) and the softplus gate;
//! o_proj with the residual; then a MoE layer's post-attention norm inside the router's launch,
//! the router's top-k and the routed + shared experts on the persistent kernels, and their
//! ordered sum with the residual, whose last block computes the next layer's input norm (or the
//! final norm); a dense layer runs norm, gate/up (one launch), SiLU·up, down with the residual
//! and the next norm. Then the lm_head.
//!
//! Several sequences (a continuous-batching step): the same sequence over `n` rows, each linear
//! one multi-token launch (up to `GEMV_MT_MAX_TOKENS` rows `gemv_mt`, the decode GEMV's tensor-core
//! tiles with 4 (NVFP4) or 2 (bf16) tokens per mma, 8 per decoded weight fragment; more rows
//! `gemm_mma`: every weight read once for all rows), the attention of all sequences in one
//! `attn_dec_batch` launch per layer (norms, rope, append and the gate inside or beside it, each
//! sequence over its own cache at its own position), the routed experts per item with the shared
//! expert as one more item per token below `FEW_MOE_MIN_TOKENS` rows, from there grouped a few
//! items per expert tile on the same tensor-core tiles (`experts_grouped_few`, the shared expert
//! on the multi-token linears); norms as one launch over all rows (up to 4 rows, with
//! `CudaOptions::norm_router_rows`, the MoE's input norm inside the router's launch as for one
//! row). The H200, lean XS, 2026-12-03
//! (`batch_decode_speed`, ms a step at 1 / 2 / 4 / 8 / 16 / 32 / 64 rows): 2.56 / 4.28 / 5.16 /
//! 7.36 / 11.29 / 17.92 / 23.98 (before `gemv_mt` and the grouped experts: 2.57 / 6.95 / 7.79 /
//! 9.40 / 12.66 / 20.12 / 32.89). No allocation but the logits, the staged operands and the
//! kernels' split-K and key-split scratch.
//!
//! [`CudaBackend::decode_fused`] runs it where the decoder has nothing it does not cover (no
//! projection biases, a gate of one value per head, a hidden width of at most `XS_MAX` values;
//! a dense layer's down projection takes any width; several sequences: bf16 or fp8 caches with
//! head_dim 64 or 128); otherwise the caller takes the generic ops. Every row is computed as the
//! generic path computes it, up to f32 summation order (the GPU tests compare both, and both
//! against the CPU backend).

use std::sync::atomic::Ordering;

use cudarc::driver::CudaSlice;

use super::ops::{self, DevPtr};
use super::{
    AttnCall, AttnPrep, CudaBackend, CudaKvLayer, CudaLinear, CudaTensor, DecBatchIo, Epi,
    ExpertTiles, Gemv, MoeBuffers, MoePath, MtInput, MultiLinear, NormGemv, QkNormRope, QkNorms,
    Route, SharedExpert, StagedRows, FEW_TILE_ITEMS, MAX_SPLITS,
};
use crate::error::Result;
use crate::ir::{AttnChunk, Decoder, Layer, Mlp, Moe, SeqChunk, Want};

/// Most sequences in one fused step (the buffers grow with the rows).
pub(crate) const FUSED_BATCH_MAX: usize = 256;

/// Activation buffers of the fused decode step, at fixed addresses, grown when a decoder needs
/// more. Held by the backend (one step at a time: the lock around it serialises steps).
pub(crate) struct DecodeBuffers {
    sizes: Sizes,
    x: CudaSlice<f32>,
    a: CudaSlice<f32>,
    q: CudaSlice<f32>,
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
    gate: CudaSlice<f32>,
    attn: CudaSlice<f32>,
    part_o: CudaSlice<f32>,
    part_ml: CudaSlice<f32>,
    router: CudaSlice<f32>,
    sel: CudaSlice<i32>,
    wts: CudaSlice<f32>,
    h: CudaSlice<f32>,
    part: CudaSlice<f32>,
    up: CudaSlice<f32>,
    act: CudaSlice<f32>,
    ids: CudaSlice<u32>,
    /// `1 / global_scale` of each MoE layer's shared gate, up and down (the persistent kernels
    /// read them from device memory), and the host copy they were uploaded from.
    shared_inv: CudaSlice<f32>,
    shared_inv_host: Vec<f32>,
}

/// Element counts of the buffers (what a decoder needs).
#[derive(Clone, Copy, PartialEq, Default)]
struct Sizes {
    /// Rows (sequences) of a step; the other counts are per row.
    rows: usize,
    hidden: usize,
    q: usize,
    kv: usize,
    gate: usize,
    heads: usize,
    router: usize,
    top_k: usize,
    h: usize,
    part: usize,
    dense: usize,
}

impl Sizes {
    fn of(d: &Decoder<CudaBackend>, rows: usize) -> Self {
        let mut s = Sizes {
            rows,
            hidden: d.hidden,
            ..Default::default()
        };
        for l in &d.layers {
            let p = &l.attn.params;
            s.q = s.q.max(p.heads * p.head_dim);
            s.kv = s.kv.max(p.kv_heads * p.head_dim);
            s.gate = s.gate.max(l.attn.gate.as_ref().map_or(0, |g| g.rows));
            s.heads = s.heads.max(p.heads);
            match &l.mlp {
                Mlp::Moe(m) => {
                    let sh = m.shared.as_ref().map_or(0, |x| x.gate.rows);
                    let items = m.params.top_k + usize::from(m.shared.is_some());
                    s.router = s.router.max(m.router.rows);
                    s.top_k = s.top_k.max(m.params.top_k);
                    s.h = s.h.max(items * m.experts.inter.max(sh));
                    s.part = s.part.max(items * d.hidden);
                }
                Mlp::Dense(m) => s.dense = s.dense.max(m.gate.rows),
            }
        }
        s
    }

    fn covers(&self, need: &Sizes) -> bool {
        self.hidden == need.hidden
            && self.rows >= need.rows
            && self.q >= need.q
            && self.kv >= need.kv
            && self.gate >= need.gate
            && self.heads >= need.heads
            && self.router >= need.router
            && self.top_k >= need.top_k
            && self.h >= need.h
            && self.part >= need.part
            && self.dense >= need.dense
    }
}

impl DecodeBuffers {
    fn new(b: &CudaBackend, s: Sizes) -> Result<Self> {
        let n = s.rows;
        Ok(Self {
            sizes: s,
            x: b.alloc(n * s.hidden)?,
            a: b.alloc(n * s.hidden)?,
            q: b.alloc(n * s.q)?,
            k: b.alloc(n * s.kv)?,
            v: b.alloc(n * s.kv)?,
            gate: b.alloc(n * s.gate)?,
            attn: b.alloc(n * s.q)?,
            // (the split partials of one sequence's attention; several take their own)
            part_o: b.alloc(s.q * MAX_SPLITS)?,
            part_ml: b.alloc(s.heads * MAX_SPLITS * 2)?,
            router: b.alloc(n * s.router)?,
            sel: b.alloc(n * s.top_k)?,
            wts: b.alloc(n * s.top_k)?,
            h: b.alloc(n * s.h.max(s.dense))?,
            part: b.alloc(n * s.part)?,
            up: b.alloc(n * s.dense)?,
            act: b.alloc(n * s.dense)?,
            ids: b.alloc(n)?,
            shared_inv: b.alloc(1)?,
            shared_inv_host: Vec::new(),
        })
    }
}

/// Whether the fused step covers `d`: no projection biases, a gate of one value per head, every
/// layer's linears of one input vector within `linear_multi2`'s reach, MoE routing the `route`
/// kernel takes (top-k <= 32 of <= 1,024 experts).
fn covers(d: &Decoder<CudaBackend>) -> bool {
    CudaBackend::linear_multi_applies(d.hidden)
        && d.layers.iter().all(|l| {
            let a = &l.attn;
            let p = &a.params;
            let no_bias = a.q_bias.is_none()
                && a.k_bias.is_none()
                && a.v_bias.is_none()
                && a.o_bias.is_none();
            let gate_ok = a.gate.as_ref().is_none_or(|g| g.rows == p.heads);
            let mlp_ok = match &l.mlp {
                // gate/up go through `linear_multi` at the hidden width (checked above); the
                // down projection through `gemv_raw`, which takes any input width.
                Mlp::Dense(_) => true,
                Mlp::Moe(m) => m.params.top_k > 0 && m.params.top_k <= 32 && m.router.rows <= 1024,
            };
            no_bias && gate_ok && mlp_ok && p.head_dim <= 128
        })
}

impl CudaBackend {
    /// Tokens decoded on the fused step by this backend (and its clones) so far.
    pub fn fused_decode_steps(&self) -> usize {
        self.inner.fused_steps.load(Ordering::Relaxed)
    }

    /// MoE layers whose sum also ran the next norm and its staging (`experts_reduce_norm_stage`,
    /// `CudaOptions::reduce_norm`) on this backend (and its clones) so far.
    pub fn sums_with_norm(&self) -> usize {
        self.inner.sums_with_norm.load(Ordering::Relaxed)
    }

    /// Batched steps' MoE layers whose router ran the top-k as its launch's tail
    /// (`gemv_mt_bf16_topk`, `CudaOptions::router_topk`) on this backend (and its clones) so far.
    pub fn routed_in_router(&self) -> usize {
        self.inner.routed_in_router.load(Ordering::Relaxed)
    }

    /// Batched steps' inputs whose NVFP4 and bf16 linears ran in one launch (`gemv_mt_mixed4`,
    /// `gemv_mt_mixed8`: `CudaOptions::mt_mixed`, `CudaOptions::mt_mixed8`) on this backend
    /// (and its clones) so far.
    pub fn mixed_linears(&self) -> usize {
        self.inner.mixed_linears.load(Ordering::Relaxed)
    }

    /// Batched steps' MoE layers whose router's launch also ran the shared expert's gate and up
    /// (`CudaOptions::router_shared`) on this backend (and its clones) so far.
    pub fn shared_in_router(&self) -> usize {
        self.inner.shared_in_router.load(Ordering::Relaxed)
    }

    /// `gemv_mt` launches that ran a deep variant (`gemv_mt_nv4_deep`, `gemv_mt_nv_deep`:
    /// `CudaOptions::mt_deep`) on this backend (and its clones) so far.
    pub fn deep_linears(&self) -> usize {
        self.inner.deep_linears.load(Ordering::Relaxed)
    }

    /// `gemv_mt` launches that ran on `gemv_mt_wide` (`CudaOptions::mt_wide_min_tokens`) on
    /// this backend (and its clones) so far.
    pub fn wide_linears(&self) -> usize {
        self.inner.wide_linears.load(Ordering::Relaxed)
    }

    /// Linears of a few tokens that ran on `gemm_h16_t32` (`CudaOptions::h16_few_min`) on this
    /// backend (and its clones) so far.
    pub fn few_h16_linears(&self) -> usize {
        self.inner.few_h16_linears.load(Ordering::Relaxed)
    }

    /// K-split `gemm_mma` / `gemm_h16` launches whose splits were added by each tile's last
    /// block (`CudaOptions::splitk_last`), not by `gemm_splitk_reduce`, on this backend (and its
    /// clones) so far.
    pub fn splitk_last_launches(&self) -> usize {
        self.inner.splitk_last_launches.load(Ordering::Relaxed)
    }

    /// Inputs of batched steps' experts staged by the kernel that produced them (the MoE's input
    /// by its norm, one a layer, for the few-items-per-tile experts with `CudaOptions::moe_staged`
    /// or the per-item ones with `CudaOptions::item_staged`; the shared expert's down projection's
    /// on `gemv_mt` by its SiLU product, one a layer with a shared expert, with `moe_staged`) on
    /// this backend (and its clones) so far.
    pub fn moe_inputs_staged(&self) -> usize {
        self.inner.moe_inputs_staged.load(Ordering::Relaxed)
    }

    /// Per-item experts' launches (gate/up and down each count) on their tensor-core-only
    /// kernels (`CudaOptions::item_tc`, `CudaOptions::gate_up_tc`) on this backend (and its
    /// clones) so far.
    pub fn tc_item_launches(&self) -> usize {
        self.inner.tc_item_launches.load(Ordering::Relaxed)
    }

    /// Few-items-per-tile experts' launches (gate/up and down each count) on their variants of
    /// three blocks a SM (`CudaOptions::few_three_blocks`) on this backend (and its clones) so
    /// far.
    pub fn few_b3_launches(&self) -> usize {
        self.inner.few_b3_launches.load(Ordering::Relaxed)
    }

    /// Few-items-per-tile experts' launches (gate/up and down each count) on their variants of
    /// tiles of 8 items (`CudaOptions::few_tile8_items`) on this backend (and its clones) so far.
    pub fn few_tile8_launches(&self) -> usize {
        self.inner.few_tile8_launches.load(Ordering::Relaxed)
    }

    /// Batched steps' MoE layers whose shared expert ran on `gemv_mt` beside the per-item routed
    /// experts (`CudaOptions::shared_mt_min_rows`) on this backend (and its clones) so far.
    pub fn shared_on_mt(&self) -> usize {
        self.inner.shared_on_mt.load(Ordering::Relaxed)
    }

    /// Batched steps' MoE layers whose input norm and router ran in one `norm_gemv_bf16` launch
    /// (`CudaOptions::norm_router_rows`) on this backend (and its clones) so far.
    pub fn routers_with_norm(&self) -> usize {
        self.inner.routers_with_norm.load(Ordering::Relaxed)
    }

    /// Batched steps' MoE layers whose router's top-k tail also grouped the routed items by
    /// expert for the few-items-per-tile experts (`CudaOptions::router_topk`) on this backend
    /// (and its clones) so far.
    pub fn grouped_in_router(&self) -> usize {
        self.inner.grouped_in_router.load(Ordering::Relaxed)
    }

    /// One new token of each sequence of `seqs` (each one id, its last logits wanted) through
    /// the whole decoder `d` on the fused step, appending their keys and values to their caches;
    /// the logits of each (`[1, vocab]`), in order. `None` where the fused step is off or does not
    /// cover `d` or these sequences (the caller runs the generic ops).
    pub(crate) fn decode_fused(
        &self,
        d: &Decoder<CudaBackend>,
        seqs: &mut [SeqChunk<'_, Self>],
    ) -> Result<Option<Vec<CudaTensor>>> {
        let n = seqs.len();
        let single = seqs
            .iter()
            .all(|s| s.ids.len() == 1 && s.want == Want::Last);
        let on = {
            let o = self.opts();
            o.fused_decode && (n == 1 || (o.fused_batch && o.batched_attention))
        };
        if n == 0 || n > FUSED_BATCH_MAX || !single || !on || !covers(d) {
            return Ok(None);
        }
        // several sequences attend in one launch: bf16 or fp8 caches, head_dim 64 or 128
        if n > 1
            && !seqs.iter().all(|s| {
                s.kv.iter()
                    .zip(&d.layers)
                    .all(|(c, l)| Self::dec_attention_applies(c, l.attn.params.head_dim, 1))
            })
        {
            return Ok(None);
        }
        for s in seqs.iter() {
            let id = s.ids[0];
            self.check(s.kv.len() == d.layers.len(), || {
                format!("{} KV layers for {} layers", s.kv.len(), d.layers.len())
            })?;
            self.check(s.kv.iter().all(|c| c.len == s.pos0), || {
                format!(
                    "a KV cache does not hold the {} positions before this token",
                    s.pos0
                )
            })?;
            self.check((id as usize) < d.embed.rows, || {
                format!("token id {id} outside table `{}`", d.embed.name)
            })?;
        }
        let mut guard = self
            .inner
            .decode
            .lock()
            .map_err(|_| self.err("a fused decode step panicked earlier"))?;
        let need = Sizes::of(d, n);
        let bufs = match guard.take() {
            Some(bufs) if bufs.sizes.covers(&need) => bufs,
            Some(bufs) => DecodeBuffers::new(
                self,
                Sizes {
                    // (grown for the larger of both, so alternating batches do not reallocate)
                    rows: n.max(bufs.sizes.rows),
                    ..need
                },
            )?,
            None => DecodeBuffers::new(self, need)?,
        };
        let bufs = guard.insert(bufs);
        self.refresh_shared_inv(d, bufs)?;
        let ids: Vec<u32> = seqs.iter().map(|s| s.ids[0]).collect();
        self.inner
            .stream
            .memcpy_htod(&ids, &mut bufs.ids.slice_mut(0..n))
            .map_err(|e| self.err(format!("{e:?}")))?;
        let logits = self.decode_launches(d, seqs, bufs)?;
        if n == 1 {
            // (several sequences' caches are advanced by the batched attention, layer by layer)
            for c in seqs[0].kv.iter_mut() {
                c.len += 1;
            }
        }
        self.inner.fused_steps.fetch_add(n, Ordering::Relaxed);
        if n == 1 {
            return Ok(Some(vec![logits]));
        }
        (0..n)
            .map(|i| crate::backend::Backend::rows(self, &logits, i, 1))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// Uploads the shared experts' `1 / global_scale` values where they changed (another
    /// decoder on this backend).
    fn refresh_shared_inv(&self, d: &Decoder<CudaBackend>, bufs: &mut DecodeBuffers) -> Result<()> {
        let host: Vec<f32> = d
            .layers
            .iter()
            .flat_map(|l| match &l.mlp {
                Mlp::Moe(Moe {
                    shared: Some(s), ..
                }) => [s.gate.inv_g, s.up.inv_g, s.down.inv_g],
                _ => [1.0; 3],
            })
            .collect();
        if host != bufs.shared_inv_host {
            bufs.shared_inv = self
                .inner
                .stream
                .clone_htod(&host)
                .map_err(|e| self.err(format!("{e:?}")))?;
            bufs.shared_inv_host = host;
        }
        Ok(())
    }

    /// q, k, v (and the per-head gate) of layer `l`, with their outputs in `bufs`: the linears
    /// of its normed input.
    fn attn_parts<'l>(
        &self,
        l: &'l Layer<CudaBackend>,
        bufs: &DecodeBuffers,
    ) -> Vec<(&'l CudaLinear, DevPtr<f32>)> {
        let at = &l.attn;
        let mut parts = vec![
            (&at.q, self.ptr(&bufs.q)),
            (&at.k, self.ptr(&bufs.k)),
            (&at.v, self.ptr(&bufs.v)),
        ];
        if let Some(g) = &at.gate {
            parts.push((g, self.ptr(&bufs.gate)));
        }
        parts
    }

    /// The launches of one step (the sequences' token ids already in `bufs.ids`); the logits
    /// (`[n, vocab]`).
    fn decode_launches(
        &self,
        d: &Decoder<CudaBackend>,
        seqs: &mut [SeqChunk<'_, Self>],
        bufs: &DecodeBuffers,
    ) -> Result<CudaTensor> {
        let n = seqs.len();
        let p = |s: &CudaSlice<f32>| self.ptr(s);
        let (x, a) = (p(&bufs.x), p(&bufs.a));
        let h = d.hidden;
        // the `n` rows of `x` times `w` into `y` (plus `resid`, which may be `y`)
        let rows = |w, x, y, resid| self.gemv_raw(w, Gemv::rows(x, y, resid, n));
        ops::prefill::EmbedArgs {
            fmt: d.embed.fmt,
            w: self.ptr(&d.embed.data),
            scales: d.embed.scales_ptr(self),
            inv_g: d.embed.inv_g,
            ids: self.ptr(&bufs.ids),
            y: x,
            k: h as i32,
        }
        .launch(self, (n as u32, 1, 1), (256, 1, 1))?;
        // One row: each layer's input norm runs inside the previous layer's last launch.
        // Several: it runs first in the layer (`norm_staged`: also staging the rows for q/k/v).
        let several = n > 1;
        let norm_of = |w: &CudaSlice<f32>| Epi::norm(self, x, p(w), a, h, d.eps);
        if !several {
            let first = d.layers.first().map_or(&d.norm, |l| &l.input_norm);
            self.epilogue_launch(&norm_of(&first.buf), n)?;
        }
        let shared_inv = self.ptr(&bufs.shared_inv);
        let head = d.lm_head.as_ref().unwrap_or(&d.embed);
        // Several rows: the rows the previous MoE layer's sum normed and staged for this layer
        // (`CudaOptions::reduce_norm`), else this layer's norm does.
        let mut staged_by_sum: Option<StagedRows> = None;
        // the normed rows staged for `parts`: by the sum (`by_sum`), else by the norm `w` (several
        // rows), else none (one row: each norm runs inside the launch before)
        let staged_for = |by_sum: &mut Option<StagedRows>,
                          parts: &[(&CudaLinear, DevPtr<f32>)],
                          w: &CudaSlice<f32>|
         -> Result<StagedRows> {
            match by_sum.take() {
                Some(staged) => Ok(staged),
                None if several => {
                    let formats = self.gemv_mt_formats(parts, n);
                    self.norm_staged(&norm_of(w), n, &formats)
                }
                None => Ok(StagedRows::default()),
            }
        };
        for (li, l) in d.layers.iter().enumerate() {
            let next_layer = d.layers.get(li + 1);
            // the next norm: the next layer's input norm, or the final one
            let next_norm = norm_of(&next_layer.map_or(&d.norm, |n| &n.input_norm).buf);
            let next = if several { Epi::default() } else { next_norm };
            let at = &l.attn;
            let ap = &at.params;
            // q, k, v (and the per-head gate) of the normed input: one launch for one row
            let parts = self.attn_parts(l, bufs);
            let staged = staged_for(&mut staged_by_sum, &parts, &l.input_norm.buf)?;
            self.linears_of_one_input(&parts, a, n, h, &staged)?;

            // attention over each cache and its token (norms, rope and append inside or first)
            let rope = &d.ropes[at.rope];
            let norms = QkNorms {
                q: at.q_norm.as_ref().map_or(DevPtr::NULL, |n| p(&n.buf)),
                k: at.k_norm.as_ref().map_or(DevPtr::NULL, |n| p(&n.buf)),
                eps: d.eps,
            };
            let gate = at.gate.as_ref().map_or(DevPtr::NULL, |_| p(&bufs.gate));
            if let [s] = seqs {
                self.attend_one(&mut s.kv[li], ap, s.pos0, rope, norms, (bufs, gate))?;
            } else {
                let mut chunks: Vec<AttnChunk<'_, Self>> = seqs
                    .iter_mut()
                    .map(|s| AttnChunk {
                        pos0: s.pos0,
                        rows: 1,
                        kv: &mut s.kv[li],
                    })
                    .collect();
                let io = DecBatchIo {
                    q: p(&bufs.q),
                    k: p(&bufs.k),
                    v: p(&bufs.v),
                    out: p(&bufs.attn),
                    gate,
                    norms,
                };
                self.attention_decode_batch(io, rope, &mut chunks, ap)?;
            }
            // x += o(attention)
            rows(&at.o, p(&bufs.attn), x, x)?;

            // a = post_norm · rmsnorm(x) (inside the router's launch where it applies)
            let post_norm = norm_of(&l.post_norm.buf);
            match &l.mlp {
                Mlp::Moe(m) => {
                    let route = Route::new(
                        p(&bufs.router),
                        m.selection_bias
                            .as_ref()
                            .map_or(DevPtr::NULL, |b| p(&b.buf)),
                        m.router.rows,
                        &m.params,
                        m.routed_scale,
                    );
                    let shared = m.shared.as_ref().map(|s| SharedExpert {
                        gate: &s.gate,
                        up: &s.up,
                        down: &s.down,
                    });
                    let k = m.params.top_k;
                    // whether the top-k ran as the router's tail (else `experts_raw` runs it)
                    let mut routed = false;
                    // the normed rows as the norm staged them for the experts, where they take
                    // them (`CudaOptions::moe_staged`)
                    let mut moe_input: Option<StagedRows> = None;
                    // the routed items grouped by expert by the router's launch, where the top-k
                    // runs there and the experts run a few items per tile
                    let mut tiles: Option<ExpertTiles> = None;
                    // the shared expert's gate and up outputs, where the router's launch ran them
                    let mut shared_gu: Option<(CudaSlice<f32>, CudaSlice<f32>)> = None;
                    // the norm inside the router's launch: always for one row, where it
                    // applies for several
                    let norm_router = if several {
                        self.norm_router_applies(&m.experts, shared.as_ref(), &m.router, k, n)
                    } else {
                        Self::norm_gemv_applies(&m.router, 1)
                    };
                    if norm_router {
                        self.norm_gemv_raw(
                            &m.router,
                            NormGemv {
                                x,
                                norm_w: p(&l.post_norm.buf),
                                eps: d.eps,
                                xn: a,
                                y: p(&bufs.router),
                                rows: n,
                            },
                        )?;
                        if several {
                            self.inner.routers_with_norm.fetch_add(1, Ordering::Relaxed);
                        }
                    } else {
                        let router = [(&m.router, p(&bufs.router))];
                        let path = self.moe_path(&m.experts, shared.as_ref(), k, n);
                        // (and for the experts where they take it staged)
                        let moe_formats =
                            self.moe_input_formats(&m.experts, path, shared.as_ref(), n);
                        let mut formats = self.gemv_mt_formats(&router, n);
                        formats.extend(&moe_formats);
                        formats.sort_unstable();
                        formats.dedup();
                        let staged = self.norm_staged(&post_norm, n, &formats)?;
                        match staged.of(self, m.router.fmt) {
                            Some(input)
                                if self.router_topk_applies(
                                    &m.experts,
                                    shared.as_ref(),
                                    &m.router,
                                    k,
                                    n,
                                ) =>
                            {
                                if path == MoePath::GroupedFew {
                                    tiles = Some(self.expert_tiles_unset(
                                        n * k,
                                        m.experts.n,
                                        FEW_TILE_ITEMS,
                                    )?);
                                }
                                self.router_topk(
                                    &m.router,
                                    p(&bufs.router),
                                    input,
                                    n,
                                    (&route, k),
                                    (&bufs.sel, &bufs.wts, tiles.as_ref()),
                                )?;
                                routed = true;
                            }
                            Some(input) => match shared.as_ref() {
                                Some(s) if self.router_shared_applies(&m.router, s, path, n) => {
                                    let si = s.gate.rows;
                                    let gu = (self.alloc_unset(n * si)?, self.alloc_unset(n * si)?);
                                    let parts = [
                                        router[0],
                                        (s.gate, self.ptr(&gu.0)),
                                        (s.up, self.ptr(&gu.1)),
                                    ];
                                    self.gemv_mt(&parts, input, n, DevPtr::NULL, DevPtr::NULL)?;
                                    shared_gu = Some(gu);
                                    self.inner.shared_in_router.fetch_add(1, Ordering::Relaxed);
                                }
                                _ => self.gemv_mt(&router, input, n, DevPtr::NULL, DevPtr::NULL)?,
                            },
                            None => rows(&m.router, a, p(&bufs.router), DevPtr::NULL)?,
                        }
                        moe_input = (!moe_formats.is_empty()).then_some(staged);
                    }
                    let io = MoeBuffers {
                        sel: &bufs.sel,
                        wts: &bufs.wts,
                        top_k: k,
                        tokens: n,
                        x: a,
                        h: p(&bufs.h),
                        part: p(&bufs.part),
                        out: x,
                        resid: x,
                        staged: moe_input.as_ref(),
                        tiles: tiles.as_ref(),
                        shared_gu: shared_gu.as_ref().map(|(g, u)| (p(g), p(u))),
                    };
                    // three f32 per layer: gate, up, down
                    let inv = shared_inv.add(3 * li);
                    // several rows: the next norm with the sum, staging for the next layer's
                    // q/k/v or the lm_head
                    let next_staged = if several && self.opts().reduce_norm {
                        let formats = match next_layer {
                            Some(nl) => self.gemv_mt_formats(&self.attn_parts(nl, bufs), n),
                            None => self.gemv_mt_formats(&[(head, DevPtr::NULL)], n),
                        };
                        self.stage_buffers(&next_norm, n, &formats)?
                    } else {
                        None
                    };
                    let epi = if next_staged.is_some() {
                        next_norm
                    } else {
                        next
                    };
                    self.experts_raw(
                        &m.experts,
                        shared.as_ref().map(|s| (s, [inv, inv.add(1), inv.add(2)])),
                        io,
                        epi,
                        (!routed).then_some(&route),
                        next_staged.as_ref(),
                    )?;
                    staged_by_sum = next_staged;
                }
                Mlp::Dense(m) => {
                    let (g, u) = (p(&bufs.h), p(&bufs.up));
                    let parts = [(&m.gate, g), (&m.up, u)];
                    let formats = self.gemv_mt_formats(&parts, n);
                    let staged = self.norm_staged(&post_norm, n, &formats)?;
                    self.linears_of_one_input(&parts, a, n, h, &staged)?;
                    self.silu_mul_raw(g, u, p(&bufs.act), n * m.gate.rows)?;
                    rows(&m.down, p(&bufs.act), x, x)?;
                    self.epilogue_launch(&next, n)?;
                }
            }
        }
        let logits = self.tensor(n, head.rows)?;
        let head_part = [(head, self.ptr(&logits.buf))];
        let staged = staged_for(&mut staged_by_sum, &head_part, &d.norm.buf)?;
        match staged.of(self, head.fmt) {
            Some(input) => self.gemv_mt(&head_part, input, n, DevPtr::NULL, DevPtr::NULL)?,
            None => rows(head, a, self.ptr(&logits.buf), DevPtr::NULL)?,
        }
        Ok(logits)
    }

    /// `y_i = x · W_iᵀ` for the `n` rows of `x` (`h` values each) and each `(W_i, y_i)` of
    /// `parts`: one launch where it applies (one row: `linear_multi2`), else a few rows: one
    /// `gemv_mt` per weight format over the parts it takes (the rows staged once per format:
    /// NVFP4 q/k/v in one launch beside a bf16 gate's, or both in one at up to four rows,
    /// `CudaOptions::mt_mixed`; or already staged by the norm: `staged`), and
    /// one multi-token linear for each other part (their rows' f16 scales computed once).
    pub(crate) fn linears_of_one_input(
        &self,
        parts: &[(&CudaLinear, DevPtr<f32>)],
        x: DevPtr<f32>,
        n: usize,
        h: usize,
        staged: &StagedRows,
    ) -> Result<()> {
        if n == 1 {
            return self.linear_multi_raw(&MultiLinear::new(self, parts, h)?, x);
        }
        // the parts on gemv_mt, per weight format (formats in ascending order)
        let groups: Vec<(i32, Vec<_>)> = self
            .gemv_mt_formats(parts, n)
            .into_iter()
            .map(|fmt| {
                let group = parts
                    .iter()
                    .filter(|(w, _)| w.fmt == fmt && self.gemv_mt_applies(w, n))
                    .copied()
                    .collect();
                (fmt, group)
            })
            .collect();
        let input = |fmt: i32| staged.of(self, fmt).unwrap_or(MtInput::Rows(x));
        match groups.as_slice() {
            [(2, bf), (3, nv)]
                if self.gemv_mt_mixed_applies(nv, n)
                    && nv.len() <= MultiLinear::MAX
                    && bf.len() <= MultiLinear::MAX =>
            {
                // (NVFP4 q/k/v and a bf16 gate in one launch)
                self.gemv_mt_mixed((nv, input(3)), (bf, input(2)), n)?;
            }
            _ => {
                for (fmt, group) in &groups {
                    for chunk in group.chunks(MultiLinear::MAX) {
                        self.gemv_mt(chunk, input(*fmt), n, DevPtr::NULL, DevPtr::NULL)?;
                    }
                }
            }
        }
        let rest: Vec<(&CudaLinear, DevPtr<f32>)> = parts
            .iter()
            .filter(|(w, _)| !self.gemv_mt_applies(w, n))
            .copied()
            .collect();
        let weights: Vec<&CudaLinear> = rest.iter().map(|&(w, _)| w).collect();
        let shared = self.shared_input(&weights, (x, n, h))?;
        for (w, y) in rest {
            self.gemv_raw(w, shared.onto(self, Gemv::rows(x, y, DevPtr::NULL, n)))?;
        }
        Ok(())
    }

    /// One sequence's decode attention at position `pos0` over `cache`: the per-head norms, the
    /// rope and the append inside the kernel where it applies (else one `qk_norm_rope` launch
    /// first), from and into the step's buffers, the softplus `gate` (null: none) applied.
    fn attend_one(
        &self,
        cache: &mut CudaKvLayer,
        ap: &crate::ir::AttentionParams,
        pos0: usize,
        rope: &super::CudaRope,
        norms: QkNorms,
        (bufs, gate): (&DecodeBuffers, DevPtr<f32>),
    ) -> Result<()> {
        let p = |s: &CudaSlice<f32>| self.ptr(s);
        self.kv_grow(cache, pos0 + 1)?;
        let slot = cache.spec.window.map_or(pos0, |w| pos0 % w);
        let rope = rope.dev(self);
        let prep = Self::dec_attention_applies(cache, ap.head_dim, 1)
            .then(|| AttnPrep::new(self, cache, slot, norms, rope));
        if prep.is_none() {
            self.qk_norm_rope_raw(
                cache,
                QkNormRope {
                    q: p(&bufs.q),
                    k: p(&bufs.k),
                    v: p(&bufs.v),
                    heads: ap.heads,
                    pos: pos0,
                    slot,
                    norms,
                    rope,
                },
            )?;
        }
        let keys = cache.spec.window.map_or(pos0 + 1, |w| w.min(pos0 + 1));
        let splits = self.splits_for(keys, ap, 1);
        self.attention_raw(
            cache,
            ap,
            AttnCall {
                q: p(&bufs.q),
                k: p(&bufs.k),
                v: p(&bufs.v),
                pos0,
                t: 1,
                out: p(&bufs.attn),
                gate,
                splits,
                scratch: Some((p(&bufs.part_o), p(&bufs.part_ml))),
                prep,
            },
        )
    }
}
