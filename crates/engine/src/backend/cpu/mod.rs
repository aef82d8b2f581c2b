//! The CPU backend: activations in host memory (f32), weights borrowed from the checkpoint's
//! memory map and dequantized inside the kernels, rayon over output rows, AVX2/FMA kernels
//! chosen at run time (never `target-cpu=native`).

mod attention;
mod kernels;
mod kv;
mod linear;
mod moe;
mod ops;
#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(target_arch = "x86_64")]
mod simd512;
mod tensor;
mod w4a4;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

pub use kv::HostKvLayer;
pub use linear::CpuLinear;
pub use moe::{CpuExperts, CpuRouting};
pub use ops::CpuRope;
pub use tensor::CpuTensor;

use kernels::Isa;

use super::{Backend, LogprobRequest, Resident};
use crate::error::{EngineError, Result};
use crate::ir::{AttentionParams, KvLayerSpec, RouterParams};
use crate::logprobs::{token_logprob, TokenLogprob};
use crate::rope::RopeSpec;
use crate::weights::{ExpertWeights, LinearWeight};

/// The most capable instruction set the CPU kernels may use (`--cpu-isa`): the best the CPU has
/// by default, or a lower one to compare kernels (an AVX-512 machine measured as an AVX2-only one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuIsa {
    /// The best this CPU supports.
    #[default]
    Auto,
    /// AVX-512F kernels (the CPU must have AVX-512F, AVX2, FMA, F16C).
    Avx512,
    /// AVX2/FMA/F16C kernels at most.
    Avx2,
    /// Portable Rust only.
    Portable,
}

impl fmt::Display for CpuIsa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CpuIsa::Auto => "auto",
            CpuIsa::Avx512 => "avx512",
            CpuIsa::Avx2 => "avx2",
            CpuIsa::Portable => "portable",
        })
    }
}

/// A name that is not `auto`, `avx512`, `avx2` or `portable`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown CPU instruction set '{0}': expected auto, avx512, avx2 or portable")]
pub struct ParseCpuIsaError(pub String);

impl FromStr for CpuIsa {
    type Err = ParseCpuIsaError;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(CpuIsa::Auto),
            "avx512" | "avx-512" => Ok(CpuIsa::Avx512),
            "avx2" => Ok(CpuIsa::Avx2),
            "portable" | "scalar" => Ok(CpuIsa::Portable),
            _ => Err(ParseCpuIsaError(s.to_string())),
        }
    }
}

/// What NVFP4 weights multiply on the CPU (`--cpu-activations`): the f32 activations
/// themselves, or a copy quantized to int8 per 16 values (W4A8, as llama.cpp's CPU kernels do
/// with its `Q8` copies): integer products, roughly half the instructions per weight. Int8 holds
/// for every pass (prompt chunks and decode steps take the same kernel, so a token's result does
/// not depend on the pass it is in); bf16 weights and W4A4 modules always take f32 activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuActivations {
    /// f32 activations: each product `e2m1 · x` exact, only the summation order differs from
    /// the reference.
    #[default]
    F32,
    /// Activations rounded to int8 per 16-value block (`amax / 127` scales).
    Int8,
}

impl fmt::Display for CpuActivations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CpuActivations::F32 => "f32",
            CpuActivations::Int8 => "int8",
        })
    }
}

/// A name that is not `f32` or `int8`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown CPU activation type '{0}': expected f32 or int8")]
pub struct ParseCpuActivationsError(pub String);

impl FromStr for CpuActivations {
    type Err = ParseCpuActivationsError;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" => Ok(CpuActivations::F32),
            "int8" | "i8" => Ok(CpuActivations::Int8),
            _ => Err(ParseCpuActivationsError(s.to_string())),
        }
    }
}

/// The CPU backend. Cheap to clone (the optional thread pool is shared).
#[derive(Debug, Clone)]
pub struct CpuBackend {
    isa: Isa,
    act: CpuActivations,
    pool: Option<Arc<rayon::ThreadPool>>,
    /// The host memory of its KV caches (shared by clones).
    kv: Arc<kv::HostKvAccount>,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    /// The best kernels this CPU supports, on rayon's global thread pool.
    pub fn new() -> Self {
        Self {
            isa: Isa::detect(),
            act: CpuActivations::default(),
            pool: None,
            kv: Arc::default(),
        }
    }

    /// Multiplies decode steps' NVFP4 weights with `act` activations (see [`CpuActivations`]).
    pub fn with_activations(mut self, act: CpuActivations) -> Self {
        self.act = act;
        self
    }

    /// Runs every op on a dedicated pool of `threads` threads (0 = rayon's global pool).
    pub fn with_threads(mut self, threads: usize) -> Result<Self> {
        self.pool = if threads == 0 {
            None
        } else {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .map_err(|e| self.error(format!("cannot start {threads} threads: {e}")))?;
            Some(Arc::new(pool))
        };
        Ok(self)
    }

    /// Uses the kernels of `isa` (see [`CpuIsa`]); an error naming the missing CPU features when
    /// this CPU cannot run them.
    pub fn with_isa(mut self, isa: CpuIsa) -> Result<Self> {
        let best = Isa::detect();
        self.isa = match isa {
            CpuIsa::Auto => best,
            CpuIsa::Avx512 if best == Isa::Avx512 => Isa::Avx512,
            CpuIsa::Avx2 if best != Isa::Scalar => Isa::Avx2,
            CpuIsa::Portable => Isa::Scalar,
            CpuIsa::Avx512 | CpuIsa::Avx2 => {
                let needs = match isa {
                    CpuIsa::Avx512 => "avx512f, avx2, fma and f16c",
                    _ => "avx2, fma and f16c",
                };
                return Err(self.error(format!(
                    "--cpu-isa {isa}: this CPU lacks some of {needs} (best available: {})",
                    Self::new().name()
                )));
            }
        };
        Ok(self)
    }

    /// Uses the portable kernels only (for comparisons with the SIMD ones).
    pub fn scalar_only(mut self) -> Self {
        self.isa = Isa::Scalar;
        self
    }

    /// Never uses the AVX-512 kernels (AVX2 at most).
    pub fn without_avx512(mut self) -> Self {
        self.isa = self.isa.without_avx512();
        self
    }

    /// Whether the AVX2 (or AVX-512) kernels are in use.
    pub fn uses_avx2(&self) -> bool {
        self.isa != Isa::Scalar
    }

    /// Whether the AVX-512 kernels are in use.
    pub fn uses_avx512(&self) -> bool {
        self.isa == Isa::Avx512
    }

    /// Threads the ops run on.
    pub fn threads(&self) -> usize {
        match &self.pool {
            Some(p) => p.current_num_threads(),
            None => rayon::current_num_threads(),
        }
    }

    fn error(&self, reason: impl Into<String>) -> EngineError {
        EngineError::Backend {
            backend: self.name(),
            reason: reason.into(),
        }
    }

    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
    }

    /// `y` (`rows` rows of `w`'s outputs) plus `bias` on every row, as a tensor.
    fn with_bias(
        &self,
        rows: usize,
        w: &CpuLinear,
        mut y: Vec<f32>,
        bias: Option<&CpuTensor>,
    ) -> Result<CpuTensor> {
        if let Some(b) = bias {
            self.check(b.data().len() == w.rows(), || {
                format!("bias of {} for `{}`", b.data().len(), w.name())
            })?;
            for row in y.chunks_exact_mut(w.rows().max(1)) {
                for (v, bi) in row.iter_mut().zip(b.data()) {
                    *v += bi;
                }
            }
        }
        Ok(CpuTensor::new(rows, w.rows(), y))
    }

    fn check(&self, ok: bool, what: impl FnOnce() -> String) -> Result<()> {
        if ok {
            Ok(())
        } else {
            Err(self.error(what()))
        }
    }
}

impl Resident for CpuBackend {
    type Tensor = CpuTensor;
    type Linear = CpuLinear;
    type Experts = CpuExperts;
    type Rope = CpuRope;
    type KvLayer = HostKvLayer;
    type Routing = CpuRouting;
}

/// How long a worker polls for work without finding any before it goes back to rayon's own
/// idling ([`with_polling_workers`]): far longer than the serial gaps between a decode step's
/// parallel regions (tens of µs), short enough that a poller stacked on a waiting join costs
/// little.
const POLL_IDLE_LIMIT: std::time::Duration = std::time::Duration::from_micros(500);

/// Runs `f` (a forward pass, on a worker of the current pool) while every other worker of the
/// pool polls for work (`rayon::yield_now` in a loop) instead of going to sleep between the
/// pass's parallel regions. A decode step has ~180 regions separated by short serial ops
/// (attention on one thread, norms); a worker that fell asleep in such a gap costs a futex
/// wake-up at the next region, which under a hypervisor measured tens of µs (docs/performance.md).
/// The pollers burn their cores for the pass's duration only (as llama.cpp's threads do) and end
/// when it returns or unwinds. A poller that the passing thread itself picks up (waiting inside
/// a join) returns at once, and one that found no work for [`POLL_IDLE_LIMIT`] returns too (a
/// safeguard: a poller that some worker picked up while waiting inside a join sits on top of that
/// join, which would otherwise resume only at the pass's end; pollers are queued before the
/// pass's own jobs and stolen oldest first, so this should not arise).
fn with_polling_workers<R>(f: impl FnOnce() -> R) -> R {
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Sets the flag when the pass ends, also by unwinding.
    struct Done(Arc<AtomicBool>);
    impl Drop for Done {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }

    let Some(me) = rayon::current_thread_index() else {
        return f();
    };
    let done = Done(Arc::new(AtomicBool::new(false)));
    for _ in 1..rayon::current_num_threads() {
        let flag = Arc::clone(&done.0);
        rayon::spawn(move || {
            if rayon::current_thread_index() == Some(me) {
                return;
            }
            let mut idle_since = None;
            while !flag.load(Ordering::Acquire) {
                if rayon::yield_now() == Some(rayon::Yield::Executed) {
                    idle_since = None;
                    continue;
                }
                let since = *idle_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() > POLL_IDLE_LIMIT {
                    return;
                }
                std::hint::spin_loop();
            }
        });
    }
    let result = f();
    drop(done);
    result
}

impl Backend for CpuBackend {
    /// `cpu`, `cpu-avx2` or `cpu-avx512` (the kernels), with `-int8` when decode steps multiply
    /// int8 activations ([`CpuActivations::Int8`]).
    fn name(&self) -> String {
        let isa = match self.isa {
            Isa::Avx512 => "cpu-avx512",
            Isa::Avx2 => "cpu-avx2",
            Isa::Scalar => "cpu",
        };
        match self.act {
            CpuActivations::F32 => isa.into(),
            CpuActivations::Int8 => format!("{isa}-int8"),
        }
    }

    /// The whole pass on one worker of the pool (the caller blocks once per pass, not once per
    /// op), with the pool's other workers polling for work until it ends ([`with_polling_workers`]);
    /// a pass started on a worker of the pool already (nested) runs there as it is.
    fn execute<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) if p.current_thread_index().is_some() => f(),
            Some(p) => p.install(|| with_polling_workers(f)),
            None if rayon::current_thread_index().is_some() => f(),
            None => rayon::scope(|_| with_polling_workers(f)),
        }
    }

    fn load_linear(&self, name: &str, weight: LinearWeight) -> Result<CpuLinear> {
        CpuLinear::new(name, weight)
    }

    fn load_experts(&self, name: &str, experts: Vec<ExpertWeights>) -> Result<CpuExperts> {
        let experts = experts
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                Ok(moe::CpuExpert {
                    gate: CpuLinear::new(&format!("{name}.{i}.gate_proj"), e.gate)?,
                    up: CpuLinear::new(&format!("{name}.{i}.up_proj"), e.up)?,
                    down: CpuLinear::new(&format!("{name}.{i}.down_proj"), e.down)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(CpuExperts { experts })
    }

    fn load_rope(&self, rope: &RopeSpec) -> Result<CpuRope> {
        Ok(CpuRope::new(rope.clone()))
    }

    fn new_kv_layer(&self, spec: &KvLayerSpec) -> Result<HostKvLayer> {
        Ok(HostKvLayer::new(spec, self.kv.clone()))
    }

    fn kv_layer_bytes(&self, layer: &HostKvLayer) -> usize {
        layer.bytes()
    }

    fn kv_growth_bytes(&self, layer: &HostKvLayer, positions: usize) -> usize {
        layer.bytes_for(positions).saturating_sub(layer.charged())
    }

    fn kv_memory(&self) -> crate::backend::KvMemory {
        let (used, capacity) = self.kv.usage();
        crate::backend::KvMemory {
            used,
            capacity,
            available: capacity.map(|cap| cap.saturating_sub(used)),
        }
    }

    fn limit_kv_memory(&self, limit: crate::backend::KvLimit) -> Result<usize> {
        match limit {
            crate::backend::KvLimit::Bytes(b) => {
                self.kv.set_cap(Some(b));
                Ok(b)
            }
            crate::backend::KvLimit::DeviceFraction(f) => Err(self.error(format!(
                "gpu_memory_utilization {f}: applies to a GPU; cap the CPU's KV caches in bytes \
                 (--kv-cache-memory-bytes)"
            ))),
        }
    }

    fn kv_fork(&self, layer: &HostKvLayer, len: usize) -> Result<HostKvLayer> {
        let mut out = layer.fork(len).ok_or_else(|| {
            self.error(format!(
                "KV copy of {len} positions of a layer holding {}",
                layer.len()
            ))
        })?;
        out.charge(len).map_err(|reason| self.error(reason))?;
        Ok(out)
    }

    fn upload(&self, rows: usize, cols: usize, data: &[f32]) -> Result<CpuTensor> {
        self.check(data.len() == rows * cols, || {
            format!("upload of {} values as [{rows}, {cols}]", data.len())
        })?;
        Ok(CpuTensor::new(rows, cols, data.to_vec()))
    }

    fn download(&self, x: &CpuTensor) -> Result<Vec<f32>> {
        Ok(x.data().to_vec())
    }

    fn dims(&self, x: &CpuTensor) -> (usize, usize) {
        (x.rows(), x.cols())
    }

    fn rows(&self, x: &CpuTensor, start: usize, len: usize) -> Result<CpuTensor> {
        self.check(start + len <= x.rows(), || {
            format!("rows {start}..{} of a {}-row tensor", start + len, x.rows())
        })?;
        let c = x.cols();
        Ok(CpuTensor::new(
            len,
            c,
            x.data()[start * c..(start + len) * c].to_vec(),
        ))
    }

    fn embed(&self, table: &CpuLinear, ids: &[u32]) -> Result<CpuTensor> {
        let cols = table.cols();
        let mut out = vec![0f32; ids.len() * cols];
        for (o, &id) in out.chunks_exact_mut(cols.max(1)).zip(ids) {
            self.check((id as usize) < table.rows(), || {
                format!("token id {id} outside table `{}`", table.name())
            })?;
            table.decode_row(self.isa, id as usize, o);
        }
        Ok(CpuTensor::new(ids.len(), cols, out))
    }

    fn rms_norm(&self, x: &CpuTensor, w: &CpuTensor, eps: f32, width: usize) -> Result<CpuTensor> {
        self.check(
            width > 0 && x.cols().is_multiple_of(width) && w.data().len() == width,
            || format!("rms_norm of width {width} on {} columns", x.cols()),
        )?;
        let out = ops::rms_norm(x.data(), w.data(), eps, width);
        Ok(CpuTensor::new(x.rows(), x.cols(), out))
    }

    fn linear(&self, x: &CpuTensor, w: &CpuLinear, bias: Option<&CpuTensor>) -> Result<CpuTensor> {
        self.check(x.cols() == w.cols(), || {
            format!("`{}` takes {} inputs, got {}", w.name(), w.cols(), x.cols())
        })?;
        let y = self.run(|| w.matmul(self.isa, self.act, x.data(), x.rows()));
        self.with_bias(x.rows(), w, y, bias)
    }

    /// Up to [`linear::GEMV_MAX_TOKENS`] rows: every weight's GEMV in one parallel region
    /// (`gemv_many`); more rows: one tiled GEMM each.
    fn linears(
        &self,
        x: &CpuTensor,
        ws: &[(&CpuLinear, Option<&CpuTensor>)],
    ) -> Result<Vec<CpuTensor>> {
        for (w, _) in ws {
            self.check(x.cols() == w.cols(), || {
                format!("`{}` takes {} inputs, got {}", w.name(), w.cols(), x.cols())
            })?;
        }
        if x.rows() > linear::GEMV_MAX_TOKENS {
            return ws.iter().map(|&(w, b)| self.linear(x, w, b)).collect();
        }
        let weights: Vec<&CpuLinear> = ws.iter().map(|&(w, _)| w).collect();
        let ys = self.run(|| linear::gemv_many(self.isa, self.act, x.data(), x.rows(), &weights));
        ys.into_iter()
            .zip(ws)
            .map(|(y, &(w, b))| self.with_bias(x.rows(), w, y, b))
            .collect()
    }

    fn rope(&self, x: &mut CpuTensor, rope: &CpuRope, head_dim: usize, pos0: usize) -> Result<()> {
        self.check(
            head_dim > 0 && x.cols().is_multiple_of(head_dim) && rope.spec().rotary_dim <= head_dim,
            || format!("rope of head_dim {head_dim} on {} columns", x.cols()),
        )?;
        let cols = x.cols();
        rope.apply(x.data_mut(), cols, head_dim, pos0);
        Ok(())
    }

    fn attention(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        cache: &mut HostKvLayer,
        p: &AttentionParams,
    ) -> Result<CpuTensor> {
        let spec = cache.spec();
        self.check(
            p.kv_heads > 0
                && p.heads.is_multiple_of(p.kv_heads)
                && q.cols() == p.heads * p.head_dim
                && k.cols() == p.kv_heads * p.head_dim
                && v.cols() == k.cols()
                && q.rows() == k.rows()
                && k.rows() == v.rows()
                && spec.kv_heads == p.kv_heads
                && spec.head_dim == p.head_dim,
            || {
                format!(
                    "attention shapes q {:?} k {:?} for {p:?}",
                    (q.rows(), q.cols()),
                    (k.rows(), k.cols())
                )
            },
        )?;
        let positions = cache.len() + q.rows();
        cache
            .charge(positions)
            .map_err(|reason| self.error(reason))?;
        Ok(self.run(|| attention::attention(self.isa, q, k, v, cache, p)))
    }

    fn softplus_gate(&self, x: &mut CpuTensor, gate: &CpuTensor) -> Result<()> {
        self.check(
            gate.rows() == x.rows() && gate.cols() > 0 && x.cols().is_multiple_of(gate.cols()),
            || {
                format!(
                    "gate {:?} for {:?}",
                    (gate.rows(), gate.cols()),
                    (x.rows(), x.cols())
                )
            },
        )?;
        let group = x.cols() / gate.cols();
        for (xs, &g) in x.data_mut().chunks_exact_mut(group).zip(gate.data()) {
            let s = ops::softplus(g);
            for v in xs {
                *v *= s;
            }
        }
        Ok(())
    }

    fn silu_mul(&self, gate: &CpuTensor, up: &CpuTensor) -> Result<CpuTensor> {
        self.check(gate.rows() == up.rows() && gate.cols() == up.cols(), || {
            "silu_mul of different shapes".into()
        })?;
        Ok(CpuTensor::new(
            gate.rows(),
            gate.cols(),
            kernels::silu_mul(self.isa, gate.data(), up.data()),
        ))
    }

    fn add_scaled(&self, y: &mut CpuTensor, alpha: f32, x: &CpuTensor) -> Result<()> {
        self.check(y.rows() == x.rows() && y.cols() == x.cols(), || {
            "add of different shapes".into()
        })?;
        kernels::axpy(self.isa, y.data_mut(), alpha, x.data());
        Ok(())
    }

    fn route(
        &self,
        logits: &CpuTensor,
        bias: Option<&CpuTensor>,
        p: &RouterParams,
        scale: f32,
    ) -> Result<CpuRouting> {
        if let Some(b) = bias {
            self.check(b.data().len() == logits.cols(), || {
                format!(
                    "router bias of {} for {} experts",
                    b.data().len(),
                    logits.cols()
                )
            })?;
        }
        self.check(p.top_k > 0 && p.top_k <= logits.cols(), || {
            format!("top-{} of {} experts", p.top_k, logits.cols())
        })?;
        Ok(moe::route(logits, bias.map(|b| b.data()), p, scale))
    }

    fn experts(&self, x: &CpuTensor, routing: &CpuRouting, e: &CpuExperts) -> Result<CpuTensor> {
        self.check(
            routing.experts.len() == x.rows() * routing.top_k
                && routing
                    .experts
                    .iter()
                    .all(|&i| (i as usize) < e.experts.len()),
            || "routing does not match the tokens or experts".into(),
        )?;
        Ok(self.run(|| moe::experts(self.isa, self.act, x, routing, e)))
    }

    /// Every scored row on the backend's threads (the logits are host memory already).
    fn logprobs(
        &self,
        requests: &[LogprobRequest<'_, CpuTensor>],
    ) -> Result<Vec<Option<Vec<TokenLogprob>>>> {
        use rayon::prelude::*;
        self.check(
            requests.iter().all(|r| r.targets.len() <= r.logits.rows()),
            || "more logprob targets than logit rows".into(),
        )?;
        Ok(self.run(|| {
            requests
                .par_iter()
                .map(|r| {
                    let (data, vocab) = (r.logits.data(), r.logits.cols());
                    let rows = (0..r.targets.len()).into_par_iter();
                    Some(
                        rows.map(|i| {
                            token_logprob(&data[i * vocab..(i + 1) * vocab], r.targets[i], r.top)
                        })
                        .collect(),
                    )
                })
                .collect()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Passes with polling workers: nested parallel work inside them completes with the right
    /// result, four passes sharing one 2-thread pool at once all finish, and after a pass that
    /// panics the pool still runs the next one.
    #[test]
    fn polling_workers_never_hold_a_pass_up() {
        use rayon::prelude::*;
        let backend = CpuBackend::new().with_threads(2).expect("a 2-thread pool");
        let work = |seed: u64| {
            (0..64u64)
                .into_par_iter()
                .map(|i| {
                    (0..2000u64)
                        .into_par_iter()
                        .map(|j| (i * 31 + j + seed) % 7)
                        .sum::<u64>()
                })
                .sum::<u64>()
        };
        let want = work(0);
        assert_eq!(backend.execute(|| work(0)), want);
        let (tx, rx) = std::sync::mpsc::channel();
        for t in 0..4u64 {
            let (b, tx) = (backend.clone(), tx.clone());
            std::thread::spawn(move || {
                let got: Vec<u64> = (0..20).map(|_| b.execute(|| work(t))).collect();
                let _ = tx.send((t, got));
            });
        }
        drop(tx);
        for _ in 0..4 {
            let (t, got) = rx
                .recv_timeout(std::time::Duration::from_secs(60))
                .expect("every concurrent pass finishes");
            assert!(got.iter().all(|&g| g == work(t)));
        }
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            backend.execute(|| -> u64 { panic!("a failing pass") })
        }));
        assert!(panicked.is_err());
        assert_eq!(backend.execute(|| work(0)), want);
    }

    /// A linear of 2–4 rows (a batched decode step) gives each row exactly what it gets alone,
    /// bit for bit, for NVFP4 and bf16 weights and through `linears` (several weights in one
    /// region) too; 5+ rows (the tiled GEMM) agree to f32 summation order.
    #[test]
    fn a_few_rows_get_their_single_row_results_bit_for_bit() {
        let (rows, cols) = (40, 96);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) % 2000) as f32 / 1000.0 - 1.0)
            .collect();
        let bits: Vec<u16> = w
            .iter()
            .map(|v| half::bf16::from_f32(*v).to_bits())
            .collect();
        let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let q = fp4forge_format::quantize(
            &fp4forge_format::WeightView::new(
                "w",
                fp4forge_format::SourceDtype::Bf16,
                rows,
                cols,
                &bytes,
            )
            .unwrap(),
        )
        .unwrap();
        for isa in [CpuIsa::Auto, CpuIsa::Avx2, CpuIsa::Portable] {
            let Ok(b) = CpuBackend::new().with_isa(isa) else {
                continue;
            };
            let weights = [
                b.load_linear("nvfp4", LinearWeight::from_nvfp4(&q, None))
                    .unwrap(),
                b.load_linear("bf16", LinearWeight::from_bf16_bits(rows, cols, &bits))
                    .unwrap(),
            ];
            // (no rows: no outputs, as from the GEMM)
            let empty = CpuTensor::new(0, cols, Vec::new());
            let ys = b.linears(&empty, &[(&weights[0], None)]).unwrap();
            assert!(
                ys[0].data().is_empty()
                    && b.linear(&empty, &weights[1], None)
                        .unwrap()
                        .data()
                        .is_empty()
            );
            for t in [2usize, 3, 4, 5, 9] {
                let x: Vec<f32> = (0..t * cols)
                    .map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0)
                    .collect();
                let xt = CpuTensor::new(t, cols, x.clone());
                let together = b
                    .linears(&xt, &[(&weights[0], None), (&weights[1], None)])
                    .unwrap();
                for (w, y) in weights.iter().zip(&together) {
                    let one = b.linear(&xt, w, None).unwrap();
                    for k in 0..t {
                        let xk = CpuTensor::new(1, cols, x[k * cols..(k + 1) * cols].to_vec());
                        let alone = b.linear(&xk, w, None).unwrap();
                        for (r, &a) in alone.data().iter().enumerate() {
                            for (label, got) in [("linear", one.data()), ("linears", y.data())] {
                                let g = got[k * rows + r];
                                if t <= linear::GEMV_MAX_TOKENS {
                                    assert_eq!(
                                        g.to_bits(),
                                        a.to_bits(),
                                        "{} {label} {isa:?} t {t} [{k}, {r}]",
                                        w.name()
                                    );
                                } else {
                                    assert!((g - a).abs() <= 1e-4 * a.abs().max(1.0));
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn cpu_isa_names_parse_and_select_kernels() {
        for (name, isa) in [
            ("auto", CpuIsa::Auto),
            ("AVX512", CpuIsa::Avx512),
            ("avx-512", CpuIsa::Avx512),
            ("avx2", CpuIsa::Avx2),
            ("portable", CpuIsa::Portable),
            ("scalar", CpuIsa::Portable),
        ] {
            assert_eq!(name.parse::<CpuIsa>(), Ok(isa));
        }
        let e = "sse4".parse::<CpuIsa>().unwrap_err();
        assert!(e.to_string().contains("'sse4'") && e.to_string().contains("avx2"));

        let portable = CpuBackend::new().with_isa(CpuIsa::Portable).unwrap();
        assert_eq!(portable.name(), "cpu");
        let best = CpuBackend::new();
        assert_eq!(
            CpuBackend::new().with_isa(CpuIsa::Auto).unwrap().name(),
            best.name()
        );
        match CpuBackend::new().with_isa(CpuIsa::Avx512) {
            Ok(b) => assert_eq!(b.name(), "cpu-avx512"),
            Err(e) => assert!(e.to_string().contains("--cpu-isa avx512"), "{e}"),
        }
        if best.uses_avx2() {
            let avx2 = CpuBackend::new().with_isa(CpuIsa::Avx2).unwrap();
            assert_eq!(avx2.name(), "cpu-avx2");
        }
    }
}
