//! Attention (kernels/attention.cu, host side): the KV cache on the device, decode attention
//! with key splits and their merge, prefill attention (chunks of `ATTN_FLASH_MIN_T`+ rows over
//! bf16 / fp8 caches on tensor cores, `attention_flash`; the others on `attn_*`); and one
//! token's q/k norms, rope and KV append (`qk_norm_rope`, kernels/elementwise.cu) where the
//! decode kernel does not do them.

use crate::backend::cuda::*;

kernels! {
    group attention;

    /// Rows `k`, `v` of `t` tokens (`width` values each) into the paged cache of block table
    /// `tab` from position `pos0` (one block per row).
    kv_append => KvAppendArgs {
        tab: DevPtr<u64>, k: DevPtr<f32>, v: DevPtr<f32>, t: i32, pos0: i32,
        window: i32, width: i32, kv_t: i32, ks: f32, vs: f32,
    }
    /// Rows `k`, `v` (`width` values each) in the storage type into the contiguous `kc`, `vc`
    /// (one block per row).
    kv_stage => KvStageArgs {
        kc: DevPtr<u8>, vc: DevPtr<u8>, k: DevPtr<f32>, v: DevPtr<f32>, width: i32, kv_t: i32,
        ks: f32, vs: f32,
    }
    /// `tab[at + i] = put.e[i]` for `i < n` (≤ [`KV_PUT_MAX`]; one block of that many threads).
    kv_table_put => KvTablePutArgs { tab: DevPtr<u64>, at: i32, n: i32, put: KvTablePut }
    /// Attention of `t` query rows over a cache of f32, fp8 or bf16 values (`3 · kv_t +
    /// head-dim class`: d ≤ 32, 64, 128).
    attn [
        "attn_f32_1", "attn_f32_2", "attn_f32_4",
        "attn_fp8_1", "attn_fp8_2", "attn_fp8_4",
        "attn_bf16_1", "attn_bf16_2", "attn_bf16_4",
    ] => AttnArgs {
        q: DevPtr<f32>, kch: DevPtr<f32>, vch: DevPtr<f32>, kt: DevPtr<u64>,
        out: DevPtr<f32>, part_o: DevPtr<f32>, part_ml: DevPtr<f32>, t: i32, heads: i32, kvh: i32,
        d: i32, scale: f32, pos0: i32, window: i32, splits: i32, ngroups: i32, ks: f32, vs: f32,
    }
    /// One token's attention over a bf16 or fp8 cache (`ks`, `vs`: fp8's scales): head_dim 64,
    /// 128, and 128 for short spans (`3 · fp8 +` that).
    attn_dec [
        "attn_dec_bf16_64", "attn_dec_bf16_128", "attn_dec_bf16_128_short",
        "attn_dec_fp8_64", "attn_dec_fp8_128", "attn_dec_fp8_128_short",
    ] => AttnDecArgs {
        q: DevPtr<f32>, kch: DevPtr<f32>, vch: DevPtr<f32>, kt: DevPtr<u64>,
        out: DevPtr<f32>, part_o: DevPtr<f32>, part_ml: DevPtr<f32>, heads: i32, kvh: i32,
        scale: f32, pos0: i32, window: i32, splits: i32, ngroups: i32, pp: AttnPrep,
        ks: f32, vs: f32,
    }
    /// One query row per sequence over each one's bf16 or fp8 cache (one type and scales for
    /// all), up to [`ATTN_BATCH_MAX`] sequences per launch (rope and append inside): head_dim
    /// 64, 128, 128 for short spans (`3 · fp8 +` that); then head_dim 128 with up to 8 query
    /// heads a block ([`ATTN_G8_VARIANT`] `+ fp8`); then head_dim 128 on tensor cores, a kv
    /// head's up to [`ATTN_MMA_GMAX`] query heads a block ([`ATTN_MMA_VARIANT`] `+ fp8`).
    attn_dec_batch [
        "attn_dec_batch_bf16_64", "attn_dec_batch_bf16_128", "attn_dec_batch_bf16_128_short",
        "attn_dec_batch_fp8_64", "attn_dec_batch_fp8_128", "attn_dec_batch_fp8_128_short",
        "attn_dec_batch_bf16_128_g8", "attn_dec_batch_fp8_128_g8",
        "attn_dec_batch_bf16_128_mma", "attn_dec_batch_fp8_128_mma",
    ] => AttnDecBatchArgs {
        q: DevPtr<f32>, kch: DevPtr<f32>, vch: DevPtr<f32>, out: DevPtr<f32>,
        part_o: DevPtr<f32>, part_ml: DevPtr<f32>, heads: i32, kvh: i32, scale: f32,
        window: i32, splits: i32, ngroups: i32, pp: AttnPrep, seqs: AttnSeqs, ks: f32, vs: f32,
    }
    /// Prefill attention on tensor cores (`t` ≥ `ATTN_FLASH_MIN_T` rows) over a bf16 or fp8
    /// cache (`2 · fp8 + (head_dim == 128)`), the chunk's rows `kx`, `vx` already in the
    /// storage type; `hb` heads of a kv head's group per block.
    attn_flash [
        "attn_flash_bf16_64", "attn_flash_bf16_128", "attn_flash_fp8_64", "attn_flash_fp8_128",
    ] => AttnFlashArgs {
        q: DevPtr<f32>, kt: DevPtr<u64>, kx: DevPtr<u8>, vx: DevPtr<u8>,
        out: DevPtr<f32>, part_o: DevPtr<f32>, part_ml: DevPtr<f32>, t: i32, heads: i32,
        kvh: i32, scale: f32, pos0: i32, window: i32, splits: i32, hb: i32, ks: f32, vs: f32,
    }
    /// The merge of `splits` partial results per head (and `softplus(gate)` where not null).
    attn_combine => AttnCombineArgs {
        part_o: DevPtr<f32>, part_ml: DevPtr<f32>, out: DevPtr<f32>, gate: DevPtr<f32>,
        heads: i32, d: i32, splits: i32,
    }
}

/// Most sequences of one `attn_dec_batch` launch (`ATTN_BATCH_MAX` in kernels/attention.cu).
pub(crate) const ATTN_BATCH_MAX: usize = 32;

/// One sequence of an `attn_dec_batch` launch (`AttnSeq` in kernels/attention.cu; layout
/// identical): its cache's block table, the slot its new row goes to, its position.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct AttnSeq {
    kt: DevPtr<u64>,
    slot: i64,
    pos0: i32,
    _pad: i32,
}

/// The sequences of an `attn_dec_batch` launch (`AttnSeqs`; layout identical), passed by value.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct AttnSeqs {
    s: [AttnSeq; ATTN_BATCH_MAX],
}

// SAFETY: plain old data matching the C struct's layout.
unsafe impl DeviceRepr for AttnSeqs {}

/// Most block-table entries one `kv_table_put` launch writes (`KV_PUT_MAX`).
pub(crate) const KV_PUT_MAX: usize = 16;

/// The entries of a `kv_table_put` launch (`KvTablePut`; layout identical), passed by value.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct KvTablePut {
    e: [u64; KV_PUT_MAX],
}

// SAFETY: plain old data matching the C struct's layout.
unsafe impl DeviceRepr for KvTablePut {}

/// Query heads of one KV head handled by one attention block (`GMAX`).
pub(crate) const ATTN_GMAX: usize = 4;

/// Query heads of one KV head handled by one block of the `_g8` batched decode kernels
/// (`CudaOptions::attn_g8`).
pub(crate) const ATTN_G8_GMAX: usize = 8;

/// The first `_g8` kernel's place in `attn_dec_batch`'s table (bf16; fp8 the next).
pub(crate) const ATTN_G8_VARIANT: usize = 6;

/// The first tensor-core kernel's place in `attn_dec_batch`'s table (bf16; fp8 the next).
pub(crate) const ATTN_MMA_VARIANT: usize = 8;

/// Most query heads of one KV head (the rows of one 16-row mma tile that a block fills) on the
/// tensor-core batched decode kernels (`DMMA_GMAX`).
pub(crate) const ATTN_MMA_GMAX: usize = 8;

/// Fewest keys per split of the tensor-core batched decode kernels: a chunk of `DMMA_KEYS` (32)
/// for each of a block's 4 warps.
pub(crate) const ATTN_MMA_SPLIT_MIN_KEYS: usize = 128;

/// Resident blocks a SM of the tensor-core batched decode kernels (`__launch_bounds__`).
pub(crate) const ATTN_MMA_BLOCKS_PER_SM: usize = 2;

/// Fewest rows of a batched decode step whose attention runs on the tensor-core kernels by
/// default (`CudaOptions::attn_mma`). H100, 2026-12-07, `batch_decode_speed --prompt 128
/// --top-k 20`, two rounds: a 32-row step 12.36 ms against 13.41 on the CUDA-core kernels
/// (−7.9%), a 4-row step 4.45 against 4.51 (−1.6%); 2–3 rows not measured.
pub(crate) const ATTN_MMA_MIN_ROWS: usize = 4;

/// Fewest keys per split of decode attention.
pub(crate) const ATTN_SPLIT_MIN_KEYS: u32 = 64;

/// Decode attention blocks per SM that `splits_for` aims at; 0: one full wave of the kernel it
/// launches (its resident blocks per SM). H200, Laguna-S, graph replay, one run: lean 5.056 /
/// 5.249 / 5.531 ms per token at 16K context aiming at 4 / 8 / 16 (4 = one wave of the long-span
/// kernel), 7.130 / 7.346 / 7.698 at 64K; at 2K 2 (one wave of the short-span kernel) beats 4.
pub(crate) const ATTN_SPLIT_BLOCKS_PER_SM: u32 = 0;

/// Most key splits of one decode attention call.
pub(crate) const MAX_SPLITS: usize = 128;

/// Attended keys up to which a head_dim-128 decode step takes the kernel variant with 2 resident
/// blocks per SM (no register cap, no spills) instead of 4. Measured on the H200 (Laguna-S
/// geometry, 2026-11-30): sliding layers (512 keys) 565 vs 618 µs per token, full layers at 64K
/// 4,103 vs 3,520 µs (the occupancy wins there).
pub(crate) const ATTN_SHORT_KEYS: usize = 8192;

/// Fewest query rows (tokens of one chunk) that take the prefill attention on tensor cores
/// (`attn_flash_*`, where `flash_attention_applies`); fewer take the `attn_*` kernels.
pub(crate) const ATTN_FLASH_MIN_T: usize = 16;

/// Query rows of one `attn_flash` block (4 warps of 16: `FA_WARPS` in kernels/attention.cu).
const ATTN_FLASH_ROWS: usize = 64;

/// Fewest keys per split of the prefill attention on tensor cores (8 tiles of 64).
const ATTN_FLASH_SPLIT_MIN_KEYS: usize = 512;

/// Resident `attn_flash` blocks per SM (`__launch_bounds__(128, 2)`).
const ATTN_FLASH_BLOCKS_PER_SM: usize = 2;

/// The per-head q/k norms, rope and KV append of a decode step, done by the decode attention
/// kernel (`Prep` in kernels/attention.cu; layout identical).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct AttnPrep {
    qn: DevPtr<f32>,
    kn: DevPtr<f32>,
    inv_freq: DevPtr<f32>,
    kt: DevPtr<u64>,
    slot: i64,
    eps: f32,
    attn_factor: f32,
    rdim: i32,
    on: i32,
    gate: DevPtr<f32>,
}

// SAFETY: plain old data matching the C struct's layout.
unsafe impl DeviceRepr for AttnPrep {}

impl AttnPrep {
    /// The norms `norms` and the rope `rope` of one token, and its new rows written to `slot`
    /// of `cache`.
    pub(crate) fn new(
        b: &CudaBackend,
        cache: &CudaKvLayer,
        slot: usize,
        norms: QkNorms,
        rope: RopeDev,
    ) -> Self {
        Self {
            qn: norms.q,
            kn: norms.k,
            inv_freq: rope.inv_freq,
            kt: b.ptr(&cache.table),
            slot: slot as i64,
            eps: norms.eps,
            attn_factor: rope.attn_factor,
            rdim: rope.rdim as i32,
            on: 1,
            gate: DevPtr::NULL,
        }
    }

    /// These preparations (or none: `on` clear) with the per-head softplus `gate` applied to the
    /// output by the kernel itself (only where it writes the output: one key split).
    pub(crate) fn with_gate(self, gate: DevPtr<f32>) -> Self {
        Self { gate, ..self }
    }
}

/// Per-head RMSNorm weights of q and k (null: none, each `head_dim` long) and their epsilon.
#[derive(Clone, Copy)]
pub(crate) struct QkNorms {
    pub q: DevPtr<f32>,
    pub k: DevPtr<f32>,
    pub eps: f32,
}

impl QkNorms {
    /// No per-head norms (q and k arrive normalised, or the model has none).
    pub(crate) const NONE: Self = Self {
        q: DevPtr::NULL,
        k: DevPtr::NULL,
        eps: 0.0,
    };
}

/// A rope as the kernels take it: frequencies `inv_freq` over the first `rdim` dims, cos and
/// sin scaled by `attn_factor`.
#[derive(Clone, Copy)]
pub(crate) struct RopeDev {
    pub inv_freq: DevPtr<f32>,
    pub rdim: usize,
    pub attn_factor: f32,
}

/// One token's `qk_norm_rope_raw` call: `q` (`heads` heads) and `k` normed and rotated in place
/// at position `pos`, the k row and the `v` row written into cache slot `slot`.
#[derive(Clone, Copy)]
pub(crate) struct QkNormRope {
    pub q: DevPtr<f32>,
    pub k: DevPtr<f32>,
    pub v: DevPtr<f32>,
    pub heads: usize,
    pub pos: usize,
    pub slot: usize,
    pub norms: QkNorms,
    pub rope: RopeDev,
}

/// One `attention_raw` call: `t` query rows `q` over the cache (positions `< pos0`) and the
/// chunk `k`, `v`, into `out` (with `softplus(gate)` applied when `gate` is not null), over
/// `splits` key splits whose partials go to `scratch` (`part_o`, `part_ml`); `prep`: the norms,
/// rope and append done inside the decode kernel.
#[derive(Clone, Copy)]
pub(crate) struct AttnCall {
    pub q: DevPtr<f32>,
    pub k: DevPtr<f32>,
    pub v: DevPtr<f32>,
    pub pos0: usize,
    pub t: usize,
    pub out: DevPtr<f32>,
    pub gate: DevPtr<f32>,
    pub splits: usize,
    pub scratch: Option<(DevPtr<f32>, DevPtr<f32>)>,
    pub prep: Option<AttnPrep>,
}

/// The rows of one [`attention_decode_batch`](CudaBackend::attention_decode_batch) call, one
/// per sequence: projections `q`, `k`, `v` (f32), the output `out` (`[n, heads · head_dim]`),
/// the per-head output gate (`[n, heads]`, null: none) and the per-head norms to apply first.
#[derive(Clone, Copy)]
pub(crate) struct DecBatchIo {
    pub q: DevPtr<f32>,
    pub k: DevPtr<f32>,
    pub v: DevPtr<f32>,
    pub out: DevPtr<f32>,
    pub gate: DevPtr<f32>,
    pub norms: QkNorms,
}

/// One `attention_flash` call: `t` query rows `q` and the chunk's `k`, `v` (f32), the output
/// `out` (`[t, heads · head_dim]`).
#[derive(Clone, Copy)]
pub(crate) struct FlashCall {
    pub q: DevPtr<f32>,
    pub k: DevPtr<f32>,
    pub v: DevPtr<f32>,
    pub t: usize,
    pub out: DevPtr<f32>,
}

/// A rotary embedding: `inv_freq` on the device; cos/sin computed in the kernel.
pub struct CudaRope {
    pub(crate) inv_freq: CudaSlice<f32>,
    pub(crate) rotary_dim: usize,
    pub(crate) attention_factor: f32,
}

/// One layer's KV cache on the device: paged (kv_pool.rs), slot `s` (the position; on a sliding
/// layer its ring slot `p % window`) is row `s % KV_BLOCK` of block `s / KV_BLOCK`, a row being
/// `[kv_heads, head_dim]` values of the storage type.
pub struct CudaKvLayer {
    pub(crate) spec: KvLayerSpec,
    pub(crate) len: usize,
    /// The blocks, slot order (shared with forks of this cache where they are full).
    pub(crate) blocks: Vec<Arc<KvBlock>>,
    /// The block table on the device: `blocks`' addresses, room for at least one entry.
    pub(crate) table: CudaSlice<u64>,
    /// 0 = f32, 1 = fp8 e4m3, 2 = bf16.
    pub(crate) kv_t: i32,
    /// fp8: stored values are e4m3(x / scale) (1 for the other types).
    pub(crate) k_scale: f32,
    pub(crate) v_scale: f32,
}

impl CudaKvLayer {
    pub(crate) fn elem(&self) -> usize {
        match self.kv_t {
            2 => 2,
            1 => 1,
            _ => 4,
        }
    }

    /// Bytes of one cached row (one position's keys, or its values).
    pub(crate) fn row_bytes(&self) -> usize {
        self.spec.row_width() * self.elem()
    }

    /// Bytes of one block: [`KV_BLOCK`] rows of keys and as many of values.
    pub(crate) fn block_bytes(&self) -> usize {
        2 * KV_BLOCK * self.row_bytes()
    }

    /// Blocks that holding `positions` positions takes (a sliding layer: its window at most).
    pub(crate) fn blocks_for(&self, positions: usize) -> usize {
        self.spec
            .window
            .map_or(positions, |w| positions.min(w))
            .div_ceil(KV_BLOCK)
    }
}

/// Key splits of one decode attention call over `keys` keys whose split launches `blocks`
/// blocks, on `slots` resident blocks of the device: as many as fill one wave (at least one),
/// at least `min_keys` keys per split, at most `MAX_SPLITS`.
pub(crate) fn key_splits(keys: usize, blocks: usize, slots: usize, min_keys: usize) -> usize {
    let want = (slots / blocks.max(1)).max(1);
    want.min(keys.div_ceil(min_keys.max(1)))
        .clamp(1, MAX_SPLITS)
}

impl CudaRope {
    /// The rope as the kernels take it.
    pub(crate) fn dev(&self, b: &CudaBackend) -> RopeDev {
        RopeDev {
            inv_freq: b.ptr(&self.inv_freq),
            rdim: self.rotary_dim,
            attn_factor: self.attention_factor,
        }
    }
}

impl CudaBackend {
    /// One token's per-head q/k RMSNorms and rope over `a.q` (`a.heads` heads) and `a.k` (the
    /// cache's kv heads), in place, and the rotated k row and the `v` row written into cache
    /// slot `a.slot`, in one launch (`qk_norm_rope`).
    pub(crate) fn qk_norm_rope_raw(&self, cache: &CudaKvLayer, a: QkNormRope) -> Result<()> {
        let (kvh, d) = (cache.spec.kv_heads, cache.spec.head_dim);
        // one thread per value of a head, whole warps (the block sum reads every warp's share)
        let threads = d.div_ceil(32) * 32;
        ops::elementwise::QkNormRopeArgs {
            q: a.q,
            k: a.k,
            qn: a.norms.q,
            kn: a.norms.k,
            heads: a.heads as i32,
            hd: d as i32,
            eps: a.norms.eps,
            inv_freq: a.rope.inv_freq,
            rdim: a.rope.rdim as i32,
            attn_factor: a.rope.attn_factor,
            pos: a.pos as i32,
            kt: self.ptr(&cache.table),
            v: a.v,
            slot: a.slot as i64,
            kv_heads: kvh as i32,
            kv_t: cache.kv_t,
            ks: cache.k_scale,
            vs: cache.v_scale,
        }
        .launch(
            self,
            ((a.heads + 2 * kvh) as u32, 1, 1),
            (threads as u32, 1, 1),
        )
    }

    pub(crate) fn kv_grow(&self, c: &mut CudaKvLayer, need: usize) -> Result<()> {
        let want = c.blocks_for(need);
        if want <= c.blocks.len() {
            return Ok(());
        }
        let bytes = c.block_bytes();
        let fresh = (c.blocks.len()..want)
            .map(|_| self.inner.kv_pool.take(self, bytes))
            .collect::<Result<Vec<_>>>()?;
        self.kv_table_extend(c, fresh)
    }

    /// Appends `fresh` to `c`'s blocks and their addresses to its table on the device (a larger
    /// table when it is full: the old entries copied over), `KV_PUT_MAX` entries per launch.
    pub(crate) fn kv_table_extend(
        &self,
        c: &mut CudaKvLayer,
        fresh: Vec<Arc<KvBlock>>,
    ) -> Result<()> {
        let at = c.blocks.len();
        let n = at + fresh.len();
        if n > c.table.len() {
            let mut table = self.alloc_unset::<u64>(n.max(2 * c.table.len()).max(16))?;
            if at > 0 {
                self.inner
                    .stream
                    .memcpy_dtod(&c.table.slice(0..at), &mut table.slice_mut(0..at))
                    .map_err(|e| self.err(format!("{e:?}")))?;
            }
            c.table = table;
        }
        for (i, group) in fresh.chunks(KV_PUT_MAX).enumerate() {
            let mut put = KvTablePut::default();
            for (e, b) in put.e.iter_mut().zip(group) {
                *e = b.addr;
            }
            ops::attention::KvTablePutArgs {
                tab: self.ptr(&c.table),
                at: (at + i * KV_PUT_MAX) as i32,
                n: group.len() as i32,
                put,
            }
            .launch(self, (1, 1, 1), (KV_PUT_MAX as u32, 1, 1))?;
        }
        c.blocks.extend(fresh);
        Ok(())
    }

    /// The variant of the `attn` kernels for caches of type `kv_t` and heads of `d` values.
    pub(crate) fn attn_variant(&self, kv_t: i32, d: usize) -> Result<usize> {
        let i = match d {
            d if d <= 32 => 0,
            d if d <= 64 => 1,
            d if d <= 128 => 2,
            _ => return Err(self.err(format!("head_dim {d} > 128"))),
        };
        Ok(i + 3 * kv_t as usize)
    }

    /// Whether a decode step (`t` = 1) over `cache` with heads of `head_dim` takes the grouped
    /// decode kernel (bf16 or fp8 cache, head_dim 64 or 128), the one that can also do the q/k
    /// norms, rope and KV append itself (`AttnPrep`).
    pub(crate) fn dec_attention_applies(cache: &CudaKvLayer, head_dim: usize, t: usize) -> bool {
        t == 1 && matches!(cache.kv_t, 1 | 2) && matches!(head_dim, 64 | 128)
    }

    /// The variant of the `attn_dec` / `attn_dec_batch` kernels for `cache` (bf16 or fp8) and
    /// heads of `head_dim` (64 or 128) attending over `keys` keys.
    fn dec_variant(&self, cache: &CudaKvLayer, head_dim: usize, keys: usize) -> usize {
        let d = match head_dim {
            64 => 0,
            _ if keys <= self.opts().attn_short_keys => 2,
            _ => 1,
        };
        d + if cache.kv_t == 1 { 3 } else { 0 }
    }

    /// Attention of `c.t` query rows over `cache` (positions `< c.pos0`) and the chunk `c.k`,
    /// `c.v` (see [`AttnCall`]). Does not append, unless `c.prep` is given: then q and k arrive
    /// as projected, and the kernel applies the per-head norms and rope and writes the new key
    /// and value rows into cache slot `prep.slot` (only where `dec_attention_applies`).
    pub(crate) fn attention_raw(
        &self,
        cache: &CudaKvLayer,
        p: &AttentionParams,
        c: AttnCall,
    ) -> Result<()> {
        let AttnCall {
            q,
            k,
            v,
            pos0,
            t,
            out,
            gate,
            splits,
            scratch,
            prep,
        } = c;
        let g = p.heads / p.kv_heads;
        let ngroups = g.div_ceil(ATTN_GMAX);
        let window = cache.spec.window.unwrap_or(0) as i32;
        let grid = ((p.kv_heads * ngroups) as u32, t as u32, splits as u32);
        let (po, pml) = scratch.unwrap_or((DevPtr::NULL, DevPtr::NULL));
        // Decode over bf16 or fp8 caches: the grouped kernel (ngroups blocks split a kv head's
        // queries).
        let dec_ok = Self::dec_attention_applies(cache, p.head_dim, t);
        self.check(dec_ok || prep.is_none(), || {
            format!(
                "attention: norms + rope inside the kernel need a bf16 or fp8 cache, head_dim 64 \
                 or 128 and one token (kv type {}, head_dim {}, {t} tokens)",
                cache.kv_t, p.head_dim
            )
        })?;
        if dec_ok {
            let keys = cache.spec.window.map_or(pos0 + 1, |w| w.min(pos0 + 1));
            let variant = self.dec_variant(cache, p.head_dim, keys);
            ops::attention::AttnDecArgs {
                q,
                kch: k,
                vch: v,
                kt: self.ptr(&cache.table),
                out,
                part_o: po,
                part_ml: pml,
                heads: p.heads as i32,
                kvh: p.kv_heads as i32,
                scale: p.scale,
                pos0: pos0 as i32,
                window,
                splits: splits as i32,
                ngroups: ngroups as i32,
                // (one split: the kernel writes the output, the gate applied on the way)
                pp: prep.unwrap_or_default().with_gate(if splits == 1 {
                    gate
                } else {
                    DevPtr::NULL
                }),
                ks: cache.k_scale,
                vs: cache.v_scale,
            }
            .launch(self, variant, grid, (128, 1, 1))?;
            if splits == 1 {
                return Ok(());
            }
        } else {
            let variant = self.attn_variant(cache.kv_t, p.head_dim)?;
            ops::attention::AttnArgs {
                q,
                kch: k,
                vch: v,
                kt: self.ptr(&cache.table),
                out,
                part_o: po,
                part_ml: pml,
                t: t as i32,
                heads: p.heads as i32,
                kvh: p.kv_heads as i32,
                d: p.head_dim as i32,
                scale: p.scale,
                pos0: pos0 as i32,
                window,
                splits: splits as i32,
                ngroups: ngroups as i32,
                ks: cache.k_scale,
                vs: cache.v_scale,
            }
            .launch(self, variant, grid, (128, 1, 1))?;
        }
        self.attn_finish((po, pml), out, gate, p, t, splits)
    }

    /// The end of a key-split decode attention of `t` query rows: the splits' partials `part`
    /// merged into `out` (`attn_combine`, times `softplus(gate)` where `gate` is not null) when
    /// there are several; else only the gate applied to `out`, if any.
    fn attn_finish(
        &self,
        part: (DevPtr<f32>, DevPtr<f32>),
        out: DevPtr<f32>,
        gate: DevPtr<f32>,
        p: &AttentionParams,
        t: usize,
        splits: usize,
    ) -> Result<()> {
        if splits > 1 {
            self.attn_combine_raw(part, out, gate, p, t, splits)?;
        } else if !gate.is_null() {
            self.softplus_gate_raw(out, gate, t * p.heads * p.head_dim, p.head_dim)?;
        }
        Ok(())
    }

    /// Whether a chunk of `t` rows over `cache` with heads of `head_dim` takes the prefill
    /// attention on tensor cores ([`attention_flash`](Self::attention_flash)): switched on
    /// (`CudaOptions::flash_attention`), an sm_80+ device, `t ≥ ATTN_FLASH_MIN_T`, a bf16 or fp8
    /// cache (f32 caches stay on `attn_*`), head_dim 64 or 128.
    pub(crate) fn flash_attention_applies(
        &self,
        cache: &CudaKvLayer,
        head_dim: usize,
        t: usize,
    ) -> bool {
        t >= ATTN_FLASH_MIN_T
            && self.inner.sm80
            && self.opts().flash_attention
            && matches!(cache.kv_t, 1 | 2)
            && matches!(head_dim, 64 | 128)
    }

    /// Causal attention of the `t` rows `q` (positions `cache.len ..`) over `cache` and the
    /// chunk `k`, `v` into `out` on tensor cores (`attn_flash_*`, where
    /// `flash_attention_applies`), and the chunk appended to the cache. The kernel reads keys
    /// and values in the storage type: the chunk's rows are appended first where that
    /// overwrites no row a query of the chunk still needs (full layers, and rings the chunk does
    /// not wrap), else converted into scratch (`kv_append` there) and appended after.
    pub(crate) fn attention_flash(
        &self,
        cache: &mut CudaKvLayer,
        p: &AttentionParams,
        c: FlashCall,
    ) -> Result<()> {
        let FlashCall { q, k, v, t, out } = c;
        let (pos0, d) = (cache.len, p.head_dim);
        let row_bytes = cache.spec.row_width() * cache.elem();
        let window = cache.spec.window;
        // The chunk's rows in the storage type, contiguous (what the kernel reads for keys at
        // positions >= pos0); they go into the cache after the kernel (a ring may overwrite
        // slots that the chunk's first queries still read).
        let (ks, vs) = (
            self.alloc_unset::<u8>(t * row_bytes)?,
            self.alloc_unset::<u8>(t * row_bytes)?,
        );
        ops::attention::KvStageArgs {
            kc: self.ptr(&ks),
            vc: self.ptr(&vs),
            k,
            v,
            width: cache.spec.row_width() as i32,
            kv_t: cache.kv_t,
            ks: cache.k_scale,
            vs: cache.v_scale,
        }
        .launch(self, (t as u32, 1, 1), (128, 1, 1))?;
        let (kx, vx) = (self.ptr(&ks), self.ptr(&vs));
        // blocks: hb heads of a group times 64 / hb tokens; key splits fill about one wave
        let g = p.heads / p.kv_heads;
        let hb = [4, 2, 1]
            .into_iter()
            .find(|&h| g.is_multiple_of(h))
            .unwrap_or(1);
        let tb = ATTN_FLASH_ROWS / hb;
        let blocks = p.kv_heads * (g / hb) * t.div_ceil(tb);
        let keys = window.map_or(pos0 + t, |w| (pos0 + t).min(w + tb));
        let slots = ATTN_FLASH_BLOCKS_PER_SM * self.inner.sms;
        let splits = key_splits(keys, blocks, slots, ATTN_FLASH_SPLIT_MIN_KEYS);
        let parts = if splits > 1 {
            let po = self.alloc::<f32>(t * p.heads * splits * d)?;
            let pml = self.alloc::<f32>(t * p.heads * splits * 2)?;
            Some((po, pml))
        } else {
            None
        };
        let (po, pml) = parts
            .as_ref()
            .map_or((DevPtr::NULL, DevPtr::NULL), |(a, b)| {
                (self.ptr(a), self.ptr(b))
            });
        let variant = 2 * usize::from(cache.kv_t == 1) + usize::from(d == 128);
        ops::attention::AttnFlashArgs {
            q,
            kt: self.ptr(&cache.table),
            kx,
            vx,
            out,
            part_o: po,
            part_ml: pml,
            t: t as i32,
            heads: p.heads as i32,
            kvh: p.kv_heads as i32,
            scale: p.scale,
            pos0: pos0 as i32,
            window: window.unwrap_or(0) as i32,
            splits: splits as i32,
            hb: hb as i32,
            ks: cache.k_scale,
            vs: cache.v_scale,
        }
        .launch(
            self,
            variant,
            (
                (p.kv_heads * (g / hb)) as u32,
                t.div_ceil(tb) as u32,
                splits as u32,
            ),
            (128, 1, 1),
        )?;
        if splits > 1 {
            self.attn_combine_raw((po, pml), out, DevPtr::NULL, p, t, splits)?;
        }
        self.kv_append_raw(cache, k, v, t)?;
        drop((ks, vs, parts));
        Ok(())
    }

    /// Number of key splits for a decode step of `p` over `keys` keys: as many blocks as fill one
    /// wave of the attention kernel (`ATTN_SPLIT_BLOCKS_PER_SM`; decode attention is latency-bound
    /// and needs warps in flight, but a partial second wave and more partial results to merge
    /// cost more), at least `ATTN_SPLIT_MIN_KEYS` keys (one round of the block's 4 warps) per
    /// split. Prefill (`t > 1`): one.
    pub(crate) fn splits_for(&self, keys: usize, p: &AttentionParams, t: usize) -> usize {
        if t > 1 {
            return 1;
        }
        self.splits_for_seqs(keys, p, 1)
    }

    /// [`splits_for`](Self::splits_for) a decode step of `seqs` sequences in one launch (the
    /// longest attending over `keys` keys).
    pub(crate) fn splits_for_seqs(&self, keys: usize, p: &AttentionParams, seqs: usize) -> usize {
        let min_keys = self.opts().attn_split_min_keys as usize;
        key_splits(
            keys,
            Self::attn_blocks_per_split(p, seqs),
            self.attn_wave_slots(keys, p),
            min_keys,
        )
    }

    /// Blocks of one key split of decode attention over `seqs` sequences: each kv head's query
    /// heads in groups of at most [`ATTN_GMAX`].
    fn attn_blocks_per_split(p: &AttentionParams, seqs: usize) -> usize {
        seqs * p.kv_heads * (p.heads / p.kv_heads.max(1)).div_ceil(ATTN_GMAX)
    }

    /// The blocks of one wave of the decode attention kernel over `keys` keys that
    /// [`splits_for_seqs`](Self::splits_for_seqs) aims at (`CudaOptions::attn_split_blocks_per_sm`
    /// a SM, 0: the kernel's resident blocks).
    fn attn_wave_slots(&self, keys: usize, p: &AttentionParams) -> usize {
        let (per_sm, short) = {
            let o = self.opts();
            (o.attn_split_blocks_per_sm as usize, o.attn_short_keys)
        };
        let per_sm = if per_sm == 0 {
            // resident blocks per SM (`__launch_bounds__`): the short-span head_dim-128 kernel 2,
            // the others 4
            if p.head_dim == 128 && keys <= short {
                2
            } else {
                4
            }
        } else {
            per_sm
        };
        per_sm * self.inner.sms
    }

    /// A decode step's attention for several sequences at once: row `i` of `io.q`, `io.k`,
    /// `io.v` (projected, not rotated; per-head norms applied unless `io.norms` names them) is
    /// sequence `i`'s new token at position `chunks[i].pos0`; normalised, rotated, appended to its
    /// cache and attended over it inside `attn_dec_batch` ([`ATTN_BATCH_MAX`] sequences per
    /// launch), the key splits merged by `attn_combine`, into row `i` of `io.out`, times
    /// `softplus(io.gate)` where the gate is not null. Every chunk must be
    /// [`decode_batch_eligible`](Self::decode_batch_eligible) and over caches of one window.
    pub(crate) fn attention_decode_batch(
        &self,
        io: DecBatchIo,
        rope: &CudaRope,
        chunks: &mut [AttnChunk<'_, Self>],
        p: &AttentionParams,
    ) -> Result<()> {
        let n = chunks.len();
        self.check(
            n > 0
                && chunks.iter().all(|c| Self::decode_batch_eligible(c, p))
                && p.heads.is_multiple_of(p.kv_heads),
            || format!("batched decode attention of {n} sequences"),
        )?;
        let window = chunks[0].kv.spec.window;
        let storage = {
            let c = &chunks[0].kv;
            (c.kv_t, c.k_scale.to_bits(), c.v_scale.to_bits())
        };
        let mut keys = 0;
        for c in chunks.iter_mut() {
            self.check(c.kv.len == c.pos0 && c.kv.spec.window == window, || {
                format!(
                    "batched decode attention: a cache of {} positions for position {}",
                    c.kv.len, c.pos0
                )
            })?;
            self.check(
                (c.kv.kv_t, c.kv.k_scale.to_bits(), c.kv.v_scale.to_bits()) == storage,
                || "batched decode attention: caches of different types or scales".to_string(),
            )?;
            self.kv_grow(c.kv, c.pos0 + 1)?;
            keys = keys.max(window.map_or(c.pos0 + 1, |w| w.min(c.pos0 + 1)));
        }
        let d = p.head_dim;
        let heads_per_kv = p.heads / p.kv_heads;
        let fp8 = usize::from(chunks[0].kv.kv_t == 1);
        // the tensor-core kernels (`attn_mma` rows and more): one block a kv head and sequence,
        // the key splits filling about a wave of them
        let mma = self.decode_batch_mma_applies(p, n);
        // (otherwise the key splits are those of blocks of ATTN_GMAX heads, with or without
        // the g8 kernels: the same bits)
        let splits = if mma {
            key_splits(
                keys,
                n.min(ATTN_BATCH_MAX) * p.kv_heads,
                ATTN_MMA_BLOCKS_PER_SM * self.inner.sms,
                ATTN_MMA_SPLIT_MIN_KEYS.max(self.opts().attn_split_min_keys as usize),
            )
        } else {
            self.splits_for_seqs(keys, p, n)
        };
        // the g8 kernels (`attn_g8` 1) where blocks of ATTN_GMAX heads would take more than a
        // wave (then the keys are not split: 32 rows of Laguna-XS are 512 blocks for 264 slots
        // on an H100); below that, halving the blocks halves the work in flight
        let g8 = !mma
            && d == 128
            && heads_per_kv <= ATTN_G8_GMAX
            && match self.opts().attn_g8 {
                0 => false,
                1 => {
                    Self::attn_blocks_per_split(p, n.min(ATTN_BATCH_MAX))
                        > self.attn_wave_slots(keys, p)
                }
                _ => true,
            };
        let (ngroups, variant) = if mma {
            (1, ATTN_MMA_VARIANT + fp8)
        } else if g8 {
            (1, ATTN_G8_VARIANT + fp8)
        } else {
            (
                heads_per_kv.div_ceil(ATTN_GMAX),
                self.dec_variant(chunks[0].kv, d, keys),
            )
        };
        let (ks, vs) = (chunks[0].kv.k_scale, chunks[0].kv.v_scale);
        // (every split writes all of its partials)
        let scratch = if splits > 1 {
            Some((
                self.alloc_unset(n * p.heads * splits * d)?,
                self.alloc_unset(n * p.heads * splits * 2)?,
            ))
        } else {
            None
        };
        // (one split: the kernel writes the output, the gate applied on the way; each launch
        // gets its own sequences' rows of it)
        let gate_inside = if splits == 1 { io.gate } else { DevPtr::NULL };
        let prep = AttnPrep::new(self, chunks[0].kv, 0, io.norms, rope.dev(self));
        let qw = p.heads * d;
        let kw = p.kv_heads * d;
        for (gi, group) in chunks.chunks(ATTN_BATCH_MAX).enumerate() {
            let b0 = gi * ATTN_BATCH_MAX;
            let mut seqs = AttnSeqs::default();
            for (s, c) in seqs.s.iter_mut().zip(group) {
                *s = AttnSeq {
                    kt: self.ptr(&c.kv.table),
                    slot: window.map_or(c.pos0, |w| c.pos0 % w) as i64,
                    pos0: c.pos0 as i32,
                    _pad: 0,
                };
            }
            let (po, pml) = scratch
                .as_ref()
                .map_or((DevPtr::NULL, DevPtr::NULL), |(a, b)| {
                    (
                        self.ptr(a).add(b0 * p.heads * splits * d),
                        self.ptr(b).add(b0 * p.heads * splits * 2),
                    )
                });
            ops::attention::AttnDecBatchArgs {
                q: io.q.add(b0 * qw),
                kch: io.k.add(b0 * kw),
                vch: io.v.add(b0 * kw),
                out: io.out.add(b0 * qw),
                part_o: po,
                part_ml: pml,
                heads: p.heads as i32,
                kvh: p.kv_heads as i32,
                scale: p.scale,
                window: window.unwrap_or(0) as i32,
                splits: splits as i32,
                ngroups: ngroups as i32,
                pp: prep.with_gate(if gate_inside.is_null() {
                    gate_inside
                } else {
                    gate_inside.add(b0 * p.heads)
                }),
                seqs,
                ks,
                vs,
            }
            .launch(
                self,
                variant,
                (
                    (p.kv_heads * ngroups) as u32,
                    group.len() as u32,
                    splits as u32,
                ),
                (128, 1, 1),
            )?;
        }
        let part = scratch
            .as_ref()
            .map_or((DevPtr::NULL, DevPtr::NULL), |(a, b)| {
                (self.ptr(a), self.ptr(b))
            });
        if splits > 1 {
            self.attn_finish(part, io.out, io.gate, p, n, splits)?;
        }
        for c in chunks.iter_mut() {
            c.kv.len += 1;
        }
        self.inner
            .batched_attention_rows
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        let counter = if mma {
            Some(&self.inner.mma_attention_rows)
        } else if g8 {
            Some(&self.inner.g8_attention_rows)
        } else {
            None
        };
        if let Some(c) = counter {
            c.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    /// Whether a batched decode step of `rows` sequences of `p` attends on the tensor-core
    /// kernels (`attn_dec_batch_*_128_mma`): `CudaOptions::attn_mma` rows or more (0: never),
    /// an sm_80+ device, head_dim 128, at most [`ATTN_MMA_GMAX`] query heads per kv head.
    pub(crate) fn decode_batch_mma_applies(&self, p: &AttentionParams, rows: usize) -> bool {
        let min_rows = self.opts().attn_mma;
        min_rows > 0
            && rows >= min_rows
            && self.inner.sm80
            && p.head_dim == 128
            && p.heads <= ATTN_MMA_GMAX * p.kv_heads
    }

    /// Sequences attended together in `attn_dec_batch` launches (one query row each, over bf16
    /// or fp8 caches) on this backend (and its clones) so far.
    pub fn batched_attention_rows(&self) -> usize {
        self.inner
            .batched_attention_rows
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Of [`batched_attention_rows`](Self::batched_attention_rows), the sequences attended on
    /// the `_g8` kernels (`CudaOptions::attn_g8`).
    pub fn g8_attention_rows(&self) -> usize {
        self.inner
            .g8_attention_rows
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Of [`batched_attention_rows`](Self::batched_attention_rows), the sequences attended on
    /// the tensor-core kernels (`CudaOptions::attn_mma`).
    pub fn mma_attention_rows(&self) -> usize {
        self.inner
            .mma_attention_rows
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a chunk can be one sequence of
    /// [`attention_decode_batch`](Self::attention_decode_batch): one new token over a bf16
    /// cache, head_dim 64 or 128.
    pub(crate) fn decode_batch_eligible(c: &AttnChunk<'_, Self>, p: &AttentionParams) -> bool {
        c.rows == 1 && Self::dec_attention_applies(c.kv, p.head_dim, 1)
    }

    /// Merges the `splits` key splits' partial results `part` (`part_o`, `part_ml`) of `t` query
    /// rows of `p`'s heads into `out`, times `softplus(gate)` where `gate` is not null (one
    /// `attn_combine` launch).
    pub(crate) fn attn_combine_raw(
        &self,
        (part_o, part_ml): (DevPtr<f32>, DevPtr<f32>),
        out: DevPtr<f32>,
        gate: DevPtr<f32>,
        p: &AttentionParams,
        t: usize,
        splits: usize,
    ) -> Result<()> {
        ops::attention::AttnCombineArgs {
            part_o,
            part_ml,
            out,
            gate,
            heads: p.heads as i32,
            d: p.head_dim as i32,
            splits: splits as i32,
        }
        .launch(
            self,
            (p.heads as u32, t as u32, 1),
            (p.head_dim.max(32) as u32, 1, 1),
        )
    }

    /// Appends the `t` rows of `k` and `v` to `cache` (one launch, `kv_append`).
    pub(crate) fn kv_append_raw(
        &self,
        cache: &mut CudaKvLayer,
        k: DevPtr<f32>,
        v: DevPtr<f32>,
        t: usize,
    ) -> Result<()> {
        let width = cache.spec.row_width();
        let window = cache.spec.window.unwrap_or(0) as i32;
        self.kv_grow(cache, cache.len + t)?;
        ops::attention::KvAppendArgs {
            tab: self.ptr(&cache.table),
            k,
            v,
            t: t as i32,
            pos0: cache.len as i32,
            window,
            width: width as i32,
            kv_t: cache.kv_t,
            ks: cache.k_scale,
            vs: cache.v_scale,
        }
        .launch(self, (t as u32, 1, 1), (128, 1, 1))?;
        cache.len += t;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One wave at most, enough keys per split, within `1..=MAX_SPLITS`, over a sweep of shapes.
    #[test]
    fn key_splits_fill_at_most_one_wave() {
        for keys in [1, 63, 64, 65, 512, 2048, 16384, 65536, 1 << 20] {
            for blocks in [1, 16, 24, 64, 300] {
                for slots in [78, 264, 528] {
                    for min_keys in [1, 64, 256] {
                        let s = key_splits(keys, blocks, slots, min_keys);
                        assert!((1..=MAX_SPLITS).contains(&s));
                        assert!(
                            s == 1 || s * blocks <= slots,
                            "{keys} {blocks} {slots}: {s}"
                        );
                        assert!(s == 1 || s * min_keys <= keys.next_multiple_of(min_keys));
                    }
                }
            }
        }
    }

    /// Laguna-S on an H200 (132 SMs): a sliding layer (72 query heads over 8 KV heads: 24
    /// blocks per split, the short-span kernel: 264 slots) is capped by its 512 keys; a full
    /// layer at 2K (48 heads: 16 blocks) fills the wave; at 64K (the long-span kernel: 528
    /// slots) as well.
    #[test]
    fn key_splits_at_laguna_s_geometry() {
        assert_eq!(key_splits(512, 24, 264, 64), 8);
        assert_eq!(key_splits(2048, 16, 264, 64), 16);
        assert_eq!(key_splits(65536, 16, 528, 64), 33);
    }
}
