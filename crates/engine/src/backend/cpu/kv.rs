//! The CPU backend's KV store: one layer's keys and values in host memory (see
//! [`crate::kv_cache`] for the layout rules every backend follows: rings for sliding layers,
//! rounding to the storage type before attention reads a chunk).

use fp4forge_format::float::{bf16_bits_to_f32, f32_to_bf16_bits};
use fp4forge_format::fp8::{f32_to_e4m3_saturating, E4M3_TO_F32};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::ir::{KvDtype, KvLayerSpec};

/// Rows of cached keys or values in one storage type.
#[derive(Debug, Clone)]
pub(crate) enum KvRows {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
    Fp8(Vec<u8>),
}

impl KvRows {
    fn new(dtype: KvDtype) -> Self {
        match dtype {
            KvDtype::F32 => KvRows::F32(Vec::new()),
            KvDtype::Bf16 => KvRows::Bf16(Vec::new()),
            KvDtype::Fp8E4m3 => KvRows::Fp8(Vec::new()),
        }
    }

    fn elements(&self) -> usize {
        match self {
            KvRows::F32(v) => v.len(),
            KvRows::Bf16(v) => v.len(),
            KvRows::Fp8(v) => v.len(),
        }
    }

    /// A copy of the first `elements` values.
    fn prefix(&self, elements: usize) -> Self {
        match self {
            KvRows::F32(v) => KvRows::F32(v[..elements].to_vec()),
            KvRows::Bf16(v) => KvRows::Bf16(v[..elements].to_vec()),
            KvRows::Fp8(v) => KvRows::Fp8(v[..elements].to_vec()),
        }
    }

    fn capacity_bytes(&self) -> usize {
        match self {
            KvRows::F32(v) => v.capacity() * 4,
            KvRows::Bf16(v) => v.capacity() * 2,
            KvRows::Fp8(v) => v.capacity(),
        }
    }

    /// Writes `row` (f32) into row slot `slot` of width `row.len()`, appending when `slot` is
    /// one past the end.
    fn put(&mut self, slot: usize, row: &[f32], scale: f32) {
        let w = row.len();
        macro_rules! put {
            ($v:expr, $enc:expr) => {{
                let v = $v;
                if v.len() == slot * w {
                    v.extend(row.iter().map($enc));
                } else {
                    for (d, x) in v[slot * w..(slot + 1) * w].iter_mut().zip(row) {
                        *d = ($enc)(x);
                    }
                }
            }};
        }
        match self {
            KvRows::F32(v) => put!(v, |x: &f32| *x),
            KvRows::Bf16(v) => put!(v, |x: &f32| f32_to_bf16_bits(*x)),
            KvRows::Fp8(v) => put!(v, |x: &f32| f32_to_e4m3_saturating(*x / scale)),
        }
    }

    /// Copies row `src_slot` of `src` (same storage type) into slot `slot` of `self`.
    fn put_encoded(&mut self, slot: usize, src: &KvRows, src_slot: usize, w: usize) {
        macro_rules! copy {
            ($d:expr, $s:expr) => {{
                let (d, s) = ($d, $s);
                let from = &s[src_slot * w..(src_slot + 1) * w];
                if d.len() == slot * w {
                    d.extend_from_slice(from);
                } else {
                    d[slot * w..(slot + 1) * w].copy_from_slice(from);
                }
            }};
        }
        match (self, src) {
            (KvRows::F32(d), KvRows::F32(s)) => copy!(d, s),
            (KvRows::Bf16(d), KvRows::Bf16(s)) => copy!(d, s),
            (KvRows::Fp8(d), KvRows::Fp8(s)) => copy!(d, s),
            _ => unreachable!("KV rows of one layer share a storage type"),
        }
    }

    /// Reserves exactly `rows` rows of width `w` in total (a ring's whole window, once).
    fn reserve_rows_exact(&mut self, rows: usize, w: usize) {
        let n = rows * w;
        match self {
            KvRows::F32(v) => v.reserve_exact(n.saturating_sub(v.len())),
            KvRows::Bf16(v) => v.reserve_exact(n.saturating_sub(v.len())),
            KvRows::Fp8(v) => v.reserve_exact(n.saturating_sub(v.len())),
        }
    }

    /// Grows storage to at least `rows` rows of width `w` (zero-filled).
    fn ensure_rows(&mut self, rows: usize, w: usize) {
        let n = rows * w;
        match self {
            KvRows::F32(v) if v.len() < n => v.resize(n, 0.0),
            KvRows::Bf16(v) if v.len() < n => v.resize(n, 0),
            KvRows::Fp8(v) if v.len() < n => v.resize(n, 0),
            _ => {}
        }
    }
}

/// One head's key or value at one position, as stored (fp8 with its scale).
#[derive(Debug, Clone, Copy)]
pub(crate) enum KvRow<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
    Fp8(&'a [u8], f32),
}

impl KvRow<'_> {
    /// The row in f32 (`out.len()` values): bf16 widened, fp8 times its scale.
    #[inline]
    pub(crate) fn decode(self, out: &mut [f32]) {
        match self {
            KvRow::F32(v) => out.copy_from_slice(v),
            KvRow::Bf16(v) => {
                for (o, &b) in out.iter_mut().zip(v) {
                    *o = bf16_bits_to_f32(b);
                }
            }
            KvRow::Fp8(v, scale) => {
                for (o, &b) in out.iter_mut().zip(v) {
                    *o = E4M3_TO_F32[b as usize] * scale;
                }
            }
        }
    }
}

impl KvRows {
    /// Elements `start..start + n` as stored.
    #[inline]
    fn slice(&self, start: usize, n: usize, scale: f32) -> KvRow<'_> {
        match self {
            KvRows::F32(v) => KvRow::F32(&v[start..start + n]),
            KvRows::Bf16(v) => KvRow::Bf16(&v[start..start + n]),
            KvRows::Fp8(v) => KvRow::Fp8(&v[start..start + n], scale),
        }
    }
}

/// The host memory of all KV stores of one backend: the bytes their rows take, and the cap
/// (0: none), which a store growing past fails on.
#[derive(Debug, Default)]
pub(crate) struct HostKvAccount {
    used: AtomicUsize,
    cap: AtomicUsize,
}

impl HostKvAccount {
    /// Caps the stores at `bytes` (`None`: no cap).
    pub(crate) fn set_cap(&self, bytes: Option<usize>) {
        self.cap.store(bytes.unwrap_or(0), Ordering::Relaxed);
    }

    /// Bytes held, and the cap.
    pub(crate) fn usage(&self) -> (usize, Option<usize>) {
        let cap = self.cap.load(Ordering::Relaxed);
        (self.used.load(Ordering::Relaxed), (cap > 0).then_some(cap))
    }
}

/// The host-memory store of one layer (the CPU backend's `KvLayer`).
#[derive(Debug)]
pub struct HostKvLayer {
    spec: KvLayerSpec,
    /// Positions written so far (the sequence length).
    len: usize,
    k: KvRows,
    v: KvRows,
    /// The account its rows are charged to, and what they were charged (bytes).
    account: Arc<HostKvAccount>,
    charged: usize,
}

impl Drop for HostKvLayer {
    fn drop(&mut self) {
        self.account.used.fetch_sub(self.charged, Ordering::Relaxed);
    }
}

/// The keys and values one attention call may read: the stored rows of earlier positions and the
/// chunk being added (already rounded to the storage type), not yet committed.
pub(crate) struct KvChunk {
    pub(crate) pos0: usize,
    pub(crate) rows: usize,
    pub(crate) k: KvRows,
    pub(crate) v: KvRows,
}

impl HostKvLayer {
    /// An empty store, charging its rows to `account`.
    pub(crate) fn new(spec: &KvLayerSpec, account: Arc<HostKvAccount>) -> Self {
        let scale_ok = |s: f32| if s.is_finite() && s > 0.0 { s } else { 1.0 };
        let mut spec = spec.clone();
        if spec.dtype != KvDtype::Fp8E4m3 {
            spec.k_scale = 1.0;
            spec.v_scale = 1.0;
        }
        spec.k_scale = scale_ok(spec.k_scale);
        spec.v_scale = scale_ok(spec.v_scale);
        Self {
            k: KvRows::new(spec.dtype),
            v: KvRows::new(spec.dtype),
            spec,
            len: 0,
            account,
            charged: 0,
        }
    }

    /// Bytes the rows of `positions` positions take (a sliding layer: its window at most).
    pub fn bytes_for(&self, positions: usize) -> usize {
        let rows = self.spec.window.map_or(positions, |w| positions.min(w));
        2 * rows * self.spec.row_width() * self.spec.dtype.size()
    }

    /// Bytes charged to the account for this store.
    pub fn charged(&self) -> usize {
        self.charged
    }

    /// Charges the account for holding `positions` positions (nothing when already charged
    /// for as many); an error, and nothing charged, past the cap.
    pub(crate) fn charge(&mut self, positions: usize) -> Result<(), String> {
        let bytes = self.bytes_for(positions);
        let more = bytes.saturating_sub(self.charged);
        if more == 0 {
            return Ok(());
        }
        let a = &self.account;
        let cap = a.cap.load(Ordering::Relaxed);
        let mut used = a.used.load(Ordering::Relaxed);
        loop {
            if cap > 0 && used + more > cap {
                return Err(format!(
                    "KV cache full: {used} of {cap} bytes of KV rows in use, no room for {more} \
                     more (raise --kv-cache-memory-bytes, or serve fewer or shorter sequences)"
                ));
            }
            match a.used.compare_exchange_weak(
                used,
                used + more,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => used = now,
            }
        }
        self.charged = bytes;
        Ok(())
    }

    /// The layer's spec.
    pub fn spec(&self) -> &KvLayerSpec {
        &self.spec
    }

    /// Positions written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing has been written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the first `len` positions can be had on their own: `len` at most the length, and
    /// a sliding layer's ring not yet wrapped (or all of it).
    pub fn can_fork(&self, len: usize) -> bool {
        self.spec.can_fork(self.len, len)
    }

    /// A new store holding a copy of the first `len` positions (see [`Self::can_fork`]); `None`
    /// when that is not possible. `self` is unchanged. The copy is not charged yet
    /// ([`Self::charge`]).
    pub fn fork(&self, len: usize) -> Option<Self> {
        if !self.can_fork(len) {
            return None;
        }
        // unwrapped: rows 0..len are positions 0..len; wrapped (len is the whole sequence): the ring
        let elements = len.min(self.stored_rows()) * self.spec.row_width();
        Some(Self {
            spec: self.spec.clone(),
            len,
            k: self.k.prefix(elements),
            v: self.v.prefix(elements),
            account: self.account.clone(),
            charged: 0,
        })
    }

    /// Rows held in storage (at most `window` for a sliding layer).
    pub fn stored_rows(&self) -> usize {
        self.k.elements() / self.spec.row_width().max(1)
    }

    /// Bytes allocated for keys and values.
    pub fn bytes(&self) -> usize {
        self.k.capacity_bytes() + self.v.capacity_bytes()
    }

    /// First position a query at `position` may attend to.
    pub fn first_visible(&self, position: usize) -> usize {
        match self.spec.window {
            Some(w) => (position + 1).saturating_sub(w),
            None => 0,
        }
    }

    /// Rounds a chunk of new keys/values (`rows` rows of `row_width` f32 each, positions
    /// `len..len + rows`) to the storage type, ready for [`Self::decode_k`] / [`Self::commit`].
    pub(crate) fn stage(&self, k: &[f32], v: &[f32], rows: usize) -> KvChunk {
        let w = self.spec.row_width();
        let mut ck = KvRows::new(self.spec.dtype);
        let mut cv = KvRows::new(self.spec.dtype);
        for r in 0..rows {
            ck.put(r, &k[r * w..(r + 1) * w], self.spec.k_scale);
            cv.put(r, &v[r * w..(r + 1) * w], self.spec.v_scale);
        }
        KvChunk {
            pos0: self.len,
            rows,
            k: ck,
            v: cv,
        }
    }

    fn slot(&self, position: usize) -> usize {
        match self.spec.window {
            Some(w) => position % w,
            None => position,
        }
    }

    /// Head `head` of the key (`value = false`) or value (`true`) at `position` as stored;
    /// `position` is either stored (and still in the ring) or in `chunk`.
    #[inline]
    pub(crate) fn row<'a>(
        &'a self,
        chunk: &'a KvChunk,
        position: usize,
        head: usize,
        value: bool,
    ) -> KvRow<'a> {
        let w = self.spec.row_width();
        let d = self.spec.head_dim;
        let (rows, scale) = match (position >= chunk.pos0, value) {
            (true, false) => (&chunk.k, self.spec.k_scale),
            (true, true) => (&chunk.v, self.spec.v_scale),
            (false, false) => (&self.k, self.spec.k_scale),
            (false, true) => (&self.v, self.spec.v_scale),
        };
        let row = if position >= chunk.pos0 {
            position - chunk.pos0
        } else {
            self.slot(position)
        };
        rows.slice(row * w + head * d, d, scale)
    }

    /// Decodes head `head` of the key (`value = false`) or value (`true`) at `position` into
    /// `out` (`head_dim` elements). `position` is either stored (and still in the ring) or in
    /// `chunk`.
    #[inline]
    pub(crate) fn decode(
        &self,
        chunk: &KvChunk,
        position: usize,
        head: usize,
        value: bool,
        out: &mut [f32],
    ) {
        self.row(chunk, position, head, value).decode(out);
    }

    /// Writes a staged chunk into storage: all rows for a full layer, the last `window` for a
    /// sliding one.
    pub(crate) fn commit(&mut self, chunk: KvChunk) {
        let w = self.spec.row_width();
        let keep_from = match self.spec.window {
            Some(win) => {
                // A ring slot may be written before the slots below it (a chunk longer than the
                // window wraps): size the ring first.
                if self.k.elements() == 0 {
                    self.k.reserve_rows_exact(win, w);
                    self.v.reserve_rows_exact(win, w);
                }
                let rows = win.min(chunk.pos0 + chunk.rows);
                self.k.ensure_rows(rows, w);
                self.v.ensure_rows(rows, w);
                chunk.rows.saturating_sub(win)
            }
            None => 0,
        };
        for r in keep_from..chunk.rows {
            let slot = self.slot(chunk.pos0 + r);
            self.k.put_encoded(slot, &chunk.k, r, w);
            self.v.put_encoded(slot, &chunk.v, r, w);
        }
        self.len = chunk.pos0 + chunk.rows;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(window: Option<usize>, dtype: KvDtype) -> KvLayerSpec {
        KvLayerSpec {
            kv_heads: 2,
            head_dim: 4,
            window,
            dtype,
            k_scale: 0.5,
            v_scale: 2.0,
        }
    }

    fn row(p: usize) -> Vec<f32> {
        (0..8).map(|i| (p * 8 + i) as f32 * 0.25).collect()
    }

    #[test]
    fn stores_charge_their_rows_to_the_account_within_its_cap_and_give_them_back() {
        let account = Arc::new(HostKvAccount::default());
        // f32 rows of 8 values, keys and values: 64 bytes a position
        let mut full = HostKvLayer::new(&spec(None, KvDtype::F32), account.clone());
        let mut ring = HostKvLayer::new(&spec(Some(4), KvDtype::F32), account.clone());
        assert_eq!(full.bytes_for(10), 640);
        assert_eq!(ring.bytes_for(10), 256, "a ring holds its window");
        full.charge(10).unwrap();
        ring.charge(10).unwrap();
        assert_eq!(account.usage(), (896, None));
        full.charge(6).unwrap();
        assert_eq!(
            full.charged(),
            640,
            "charging fewer positions takes nothing back"
        );
        account.set_cap(Some(1000));
        let err = full.charge(12).unwrap_err();
        assert!(
            err.contains("KV cache full") && err.contains("1000"),
            "{err}"
        );
        assert_eq!(
            account.usage(),
            (896, Some(1000)),
            "a refused charge takes nothing"
        );
        full.charge(11).unwrap();
        let forked = full.fork(0).unwrap();
        assert_eq!(forked.charged(), 0, "the caller charges a copy");
        drop(forked);
        drop(ring);
        assert_eq!(account.usage(), (704, Some(1000)));
        drop(full);
        assert_eq!(account.usage(), (0, Some(1000)));
    }

    #[test]
    fn ring_keeps_the_last_window_and_memory_is_flat() {
        let mut l = HostKvLayer::new(&spec(Some(4), KvDtype::F32), Arc::default());
        let mut bytes_after_window = 0;
        for p in 0..20 {
            let r = row(p);
            let c = l.stage(&r, &r, 1);
            l.commit(c);
            if p == 3 {
                bytes_after_window = l.bytes();
            }
        }
        assert_eq!(l.len(), 20);
        assert_eq!(l.stored_rows(), 4);
        assert_eq!(l.bytes(), bytes_after_window);
        let empty = l.stage(&[], &[], 0);
        let mut out = [0f32; 4];
        for p in 16..20 {
            l.decode(&empty, p, 1, false, &mut out);
            assert_eq!(out.to_vec(), row(p)[4..8].to_vec());
        }
    }

    #[test]
    fn a_chunk_longer_than_the_window_commits_its_tail() {
        let mut l = HostKvLayer::new(&spec(Some(4), KvDtype::Bf16), Arc::default());
        let rows: Vec<f32> = (0..10).flat_map(row).collect();
        let c = l.stage(&rows, &rows, 10);
        let mut out = [0f32; 4];
        l.decode(&c, 2, 0, true, &mut out);
        assert_eq!(out.to_vec(), row(2)[0..4].to_vec());
        l.commit(c);
        assert_eq!(l.stored_rows(), 4);
        let empty = l.stage(&[], &[], 0);
        l.decode(&empty, 9, 0, false, &mut out);
        assert_eq!(out.to_vec(), row(9)[0..4].to_vec());
        assert_eq!(l.first_visible(10), 7);
    }

    #[test]
    fn fp8_uses_the_scales() {
        let mut l = HostKvLayer::new(&spec(None, KvDtype::Fp8E4m3), Arc::default());
        let r = vec![1.0f32, -2.0, 3.0, 0.5, 100.0, 7.0, -8.0, 0.0];
        let c = l.stage(&r, &r, 1);
        l.commit(c);
        let empty = l.stage(&[], &[], 0);
        let mut out = [0f32; 4];
        l.decode(&empty, 0, 0, false, &mut out);
        assert_eq!(out, [1.0, -2.0, 3.0, 0.5]);
        l.decode(&empty, 0, 1, true, &mut out);
        assert_eq!(out, [96.0, 7.0, -8.0, 0.0]); // 100/2 = 50 → e4m3 48 → ×2
        assert!(l.bytes() >= 16);
    }
}
