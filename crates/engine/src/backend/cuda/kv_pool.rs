//! The paged KV cache's device memory: every layer's cache is blocks of [`KV_BLOCK`] positions
//! (its keys, then its values) taken from one pool, and a block table on the device that the
//! attention kernels read rows through (`kv_row` in kernels/common.cu).
//!
//! Blocks are carved from slabs of [`SLAB_BYTES`] allocated as the caches grow, never freed while
//! the backend lives: a block given back (its last holder dropped) is taken again by the next
//! cache that grows. A block is held by reference count, so a forked cache shares its source's
//! full blocks instead of copying them (`kv_fork`: only the partial last block, and the ring of a
//! sliding layer, which is written again as the sequence goes on, are copied).
//!
//! The pool may be capped (`Backend::limit_kv_memory`: `serve --gpu-memory-utilization` or
//! `--kv-cache-memory-bytes`):
//! taking a block past the cap fails with an error that says so; the server admits and preempts
//! sequences by the room left ([`Backend::kv_memory`](crate::backend::Backend::kv_memory)).
//!
//! All kernels run on the backend's one stream, so a block given back while a queued kernel
//! still reads it is safe: its next holder's writes are queued after that read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{CudaSlice, DevicePtr};

use super::CudaBackend;
use crate::error::Result;

/// Positions per KV block (`KV_BLOCK` in kernels/common.cu).
pub(crate) const KV_BLOCK: usize = 64;

/// Bytes of one slab the blocks are carved from (at least one block).
const SLAB_BYTES: usize = 8 << 20;

/// The pool's bookkeeping.
#[derive(Default)]
struct PoolState {
    /// The slabs (kept alive; blocks point into them).
    slabs: Vec<CudaSlice<u8>>,
    /// Free blocks by their size in bytes.
    free: HashMap<usize, Vec<u64>>,
    /// Bytes of all slabs.
    held: usize,
    /// Bytes of the blocks handed out.
    used: usize,
    /// Most bytes of blocks in use, and of slabs allocated (`None`: no cap).
    budget: Option<usize>,
}

/// The device memory of every KV cache of one backend.
#[derive(Default)]
pub(crate) struct KvPool {
    state: Arc<Mutex<PoolState>>,
}

/// One block of a cache: [`KV_BLOCK`] rows of keys then as many of values, at device address
/// `addr`. Given back to the pool when dropped.
pub(crate) struct KvBlock {
    pub(crate) addr: u64,
    bytes: usize,
    pool: Arc<Mutex<PoolState>>,
}

impl Drop for KvBlock {
    fn drop(&mut self) {
        let mut s = lock(&self.pool);
        s.used -= self.bytes;
        s.free.entry(self.bytes).or_default().push(self.addr);
    }
}

fn lock(m: &Mutex<PoolState>) -> MutexGuard<'_, PoolState> {
    // the state stays consistent across a panic (each update is one short critical section)
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the pool holds, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PoolUsage {
    /// Blocks handed out.
    pub used: usize,
    /// Slabs allocated.
    pub held: usize,
    /// The cap, if any.
    pub budget: Option<usize>,
    /// Free blocks of the block size most of them have (a free block of one size cannot serve
    /// a cache of another; a model's layers usually all have one).
    pub free: usize,
}

impl KvPool {
    /// Caps the slabs at `budget` bytes (`None`: no cap). Slabs already held stay.
    pub(crate) fn set_budget(&self, budget: Option<usize>) {
        lock(&self.state).budget = budget;
    }

    /// What the pool holds.
    pub(crate) fn usage(&self) -> PoolUsage {
        let s = lock(&self.state);
        PoolUsage {
            used: s.used,
            held: s.held,
            budget: s.budget,
            free: s
                .free
                .iter()
                .map(|(bytes, f)| bytes * f.len())
                .max()
                .unwrap_or(0),
        }
    }

    /// A block of `bytes` bytes (contents unset): a free one, else one of a new slab.
    pub(crate) fn take(&self, b: &CudaBackend, bytes: usize) -> Result<Arc<KvBlock>> {
        let mut s = lock(&self.state);
        let full = |s: &PoolState| {
            b.err(format!(
                "KV cache full: {} of {} bytes of KV blocks in use, no room for a block of \
                 {bytes} bytes (raise --gpu-memory-utilization, or serve fewer or shorter \
                 sequences)",
                s.used,
                s.budget.unwrap_or(s.held)
            ))
        };
        if s.budget.is_some_and(|cap| s.used + bytes > cap) {
            return Err(full(&s));
        }
        let addr = match s.free.get_mut(&bytes).and_then(Vec::pop) {
            Some(a) => a,
            None => {
                let room = s
                    .budget
                    .map_or(usize::MAX, |cap| cap.saturating_sub(s.held));
                let n = (SLAB_BYTES / bytes).max(1).min(room / bytes);
                if n == 0 {
                    // (the cap's memory is in free blocks of another size)
                    return Err(full(&s));
                }
                let slab = b.alloc_unset::<u8>(n * bytes)?;
                let base = slab.device_ptr(&b.inner.stream).0;
                s.held += n * bytes;
                s.slabs.push(slab);
                let free = s.free.entry(bytes).or_default();
                free.extend((1..n).rev().map(|i| base + (i * bytes) as u64));
                base
            }
        };
        s.used += bytes;
        Ok(Arc::new(KvBlock {
            addr,
            bytes,
            pool: self.state.clone(),
        }))
    }
}
