//! A per-op profile of the production forward pass: [`Profiled`] wraps any backend, delegates
//! every op to it unchanged and adds the op's wall time to a table keyed by op (linear layers by
//! the last component of their weight's name, e.g. `linear q_proj`, so every layer's q_proj adds
//! up in one row), with the bytes of weight each linear reads.
//!
//! `fused_pass` keeps the trait's default (decline), so the profile is of the generic ops, the
//! CPU backend's only path. Ops on the CPU backend are synchronous, so wall time per call is the op's cost including its
//! thread fork-join; on an asynchronous backend it would only be the launch.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fp4forge_engine::backend::{AttentionParams, KvLimit, KvMemory, Resident, RouterParams};
use fp4forge_engine::ir::KvLayerSpec;
use fp4forge_engine::rope::RopeSpec;
use fp4forge_engine::weights::{ExpertWeights, LinearWeight};
use fp4forge_engine::{Backend, Result, SampleRequest};

/// Time and bytes of one kind of op.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpTotals {
    /// Calls.
    pub calls: u64,
    /// Wall time of all calls.
    pub time: Duration,
    /// Weight bytes the calls read (linear layers and experts; 0 otherwise).
    pub weight_bytes: u64,
}

/// A linear layer with what the profile needs to know of it.
#[derive(Debug)]
pub struct ProfiledLinear<L> {
    inner: L,
    key: String,
    bytes: u64,
}

/// `B` with every op timed (see the module docs).
#[derive(Debug)]
pub struct Profiled<B> {
    inner: B,
    table: Mutex<BTreeMap<String, OpTotals>>,
}

impl<B: Backend> Profiled<B> {
    /// Wraps `inner`.
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            table: Mutex::new(BTreeMap::new()),
        }
    }

    /// The totals so far, by op, and clears them.
    pub fn take(&self) -> BTreeMap<String, OpTotals> {
        match self.table.lock() {
            Ok(mut t) => std::mem::take(&mut *t),
            Err(p) => std::mem::take(&mut *p.into_inner()),
        }
    }

    fn timed<R>(&self, key: &str, bytes: u64, f: impl FnOnce() -> R) -> R {
        let t = Instant::now();
        let r = f();
        let dt = t.elapsed();
        let mut table = match self.table.lock() {
            Ok(t) => t,
            Err(p) => p.into_inner(),
        };
        let e = table.entry(key.to_owned()).or_default();
        e.calls += 1;
        e.time += dt;
        e.weight_bytes += bytes;
        r
    }
}

impl<B: Backend> Resident for Profiled<B> {
    type Tensor = B::Tensor;
    type Linear = ProfiledLinear<B::Linear>;
    type Experts = (B::Experts, u64);
    type Rope = B::Rope;
    type KvLayer = B::KvLayer;
    type Routing = B::Routing;
}

impl<B: Backend> Backend for Profiled<B> {
    fn name(&self) -> String {
        self.inner.name()
    }

    fn execute<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.inner.execute(f)
    }

    fn load_linear(&self, name: &str, weight: LinearWeight) -> Result<Self::Linear> {
        let short = name.trim_end_matches(".weight");
        let short = short.rsplit('.').next().unwrap_or(short);
        let key = format!("linear {short} ({})", weight.kind());
        let bytes = weight.stored_bytes() as u64;
        Ok(ProfiledLinear {
            inner: self.inner.load_linear(name, weight)?,
            key,
            bytes,
        })
    }

    fn load_experts(&self, name: &str, experts: Vec<ExpertWeights>) -> Result<Self::Experts> {
        let per_expert = experts.first().map_or(0, |e| {
            e.gate.stored_bytes() + e.up.stored_bytes() + e.down.stored_bytes()
        });
        Ok((self.inner.load_experts(name, experts)?, per_expert as u64))
    }

    fn load_rope(&self, rope: &RopeSpec) -> Result<Self::Rope> {
        self.inner.load_rope(rope)
    }

    fn new_kv_layer(&self, spec: &KvLayerSpec) -> Result<Self::KvLayer> {
        self.inner.new_kv_layer(spec)
    }

    fn kv_layer_bytes(&self, layer: &Self::KvLayer) -> usize {
        self.inner.kv_layer_bytes(layer)
    }

    fn kv_fork(&self, layer: &Self::KvLayer, len: usize) -> Result<Self::KvLayer> {
        self.inner.kv_fork(layer, len)
    }

    fn kv_growth_bytes(&self, layer: &Self::KvLayer, positions: usize) -> usize {
        self.inner.kv_growth_bytes(layer, positions)
    }

    fn kv_memory(&self) -> KvMemory {
        self.inner.kv_memory()
    }

    fn limit_kv_memory(&self, limit: KvLimit) -> Result<usize> {
        self.inner.limit_kv_memory(limit)
    }

    fn upload(&self, rows: usize, cols: usize, data: &[f32]) -> Result<Self::Tensor> {
        self.inner.upload(rows, cols, data)
    }

    fn download(&self, x: &Self::Tensor) -> Result<Vec<f32>> {
        self.timed("download", 0, || self.inner.download(x))
    }

    fn dims(&self, x: &Self::Tensor) -> (usize, usize) {
        self.inner.dims(x)
    }

    fn rows(&self, x: &Self::Tensor, start: usize, len: usize) -> Result<Self::Tensor> {
        self.timed("rows", 0, || self.inner.rows(x, start, len))
    }

    fn concat_rows(&self, parts: &[&Self::Tensor]) -> Result<Self::Tensor> {
        self.timed("concat_rows", 0, || self.inner.concat_rows(parts))
    }

    fn embed(&self, table: &Self::Linear, ids: &[u32]) -> Result<Self::Tensor> {
        self.timed("embed", 0, || self.inner.embed(&table.inner, ids))
    }

    fn rms_norm(
        &self,
        x: &Self::Tensor,
        weight: &Self::Tensor,
        eps: f32,
        width: usize,
    ) -> Result<Self::Tensor> {
        self.timed("rms_norm", 0, || self.inner.rms_norm(x, weight, eps, width))
    }

    fn linear(
        &self,
        x: &Self::Tensor,
        w: &Self::Linear,
        bias: Option<&Self::Tensor>,
    ) -> Result<Self::Tensor> {
        self.timed(&w.key, w.bytes, || self.inner.linear(x, &w.inner, bias))
    }

    fn linear_add(
        &self,
        y: &mut Self::Tensor,
        x: &Self::Tensor,
        w: &Self::Linear,
        bias: Option<&Self::Tensor>,
    ) -> Result<()> {
        let key = format!("{} (+ residual)", w.key);
        self.timed(&key, w.bytes, || {
            self.inner.linear_add(y, x, &w.inner, bias)
        })
    }

    fn gated_linear_add(
        &self,
        y: &mut Self::Tensor,
        x: Self::Tensor,
        gate: &Self::Tensor,
        w: &Self::Linear,
        bias: Option<&Self::Tensor>,
    ) -> Result<()> {
        let key = format!("softplus_gate + {} (+ residual)", w.key);
        self.timed(&key, w.bytes, || {
            self.inner.gated_linear_add(y, x, gate, &w.inner, bias)
        })
    }

    fn linears(
        &self,
        x: &Self::Tensor,
        ws: &[(&Self::Linear, Option<&Self::Tensor>)],
    ) -> Result<Vec<Self::Tensor>> {
        let key = ws
            .iter()
            .map(|(w, _)| w.key.as_str())
            .collect::<Vec<_>>()
            .join(" + ");
        let bytes = ws.iter().map(|(w, _)| w.bytes).sum();
        let inner: Vec<_> = ws.iter().map(|&(w, b)| (&w.inner, b)).collect();
        self.timed(&key, bytes, || self.inner.linears(x, &inner))
    }

    fn rope(
        &self,
        x: &mut Self::Tensor,
        rope: &Self::Rope,
        head_dim: usize,
        pos0: usize,
    ) -> Result<()> {
        self.timed("rope", 0, || self.inner.rope(x, rope, head_dim, pos0))
    }

    fn attention(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        cache: &mut Self::KvLayer,
        params: &AttentionParams,
    ) -> Result<Self::Tensor> {
        self.timed("attention", 0, || {
            self.inner.attention(q, k, v, cache, params)
        })
    }

    fn softplus_gate(&self, x: &mut Self::Tensor, gate: &Self::Tensor) -> Result<()> {
        self.timed("softplus_gate", 0, || self.inner.softplus_gate(x, gate))
    }

    fn silu_mul(&self, gate: &Self::Tensor, up: &Self::Tensor) -> Result<Self::Tensor> {
        self.timed("silu_mul", 0, || self.inner.silu_mul(gate, up))
    }

    fn add_scaled(&self, y: &mut Self::Tensor, alpha: f32, x: &Self::Tensor) -> Result<()> {
        self.timed("add_scaled", 0, || self.inner.add_scaled(y, alpha, x))
    }

    fn route(
        &self,
        logits: &Self::Tensor,
        selection_bias: Option<&Self::Tensor>,
        params: &RouterParams,
        scale: f32,
    ) -> Result<Self::Routing> {
        self.timed("route", 0, || {
            self.inner.route(logits, selection_bias, params, scale)
        })
    }

    fn experts(
        &self,
        x: &Self::Tensor,
        routing: &Self::Routing,
        experts: &Self::Experts,
    ) -> Result<Self::Tensor> {
        // Bytes: one expert's weights per (token, choice) — an upper bound when tokens share.
        let rows = self.inner.dims(x).0 as u64;
        self.timed("experts", experts.1 * rows, || {
            self.inner.experts(x, routing, &experts.0)
        })
    }

    fn sample(&self, rows: &[SampleRequest<'_, Self::Tensor>]) -> Result<Vec<Option<u32>>> {
        self.timed("sample", 0, || self.inner.sample(rows))
    }
}
