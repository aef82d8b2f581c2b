//! The decoder-only transformer both families share, written once against [`Backend`]:
//! pre-norm residual blocks of attention (GQA, optional biases, optional per-head q/k RMSNorm,
//! rotary embedding per layer type, optional sliding window, optional softplus output gate) and an
//! MLP (dense SwiGLU, or a routed mixture of SwiGLU experts with an optional always-on shared
//! expert). The families differ only in how they read their config and name their tensors.

mod batch;

pub(crate) use batch::BatchSeq;

use crate::backend::{AttentionParams, Backend, RouterParams};
use crate::error::Result;
use crate::kv_cache::KvLayerSpec;
use crate::weights::{ExpertWeights, LinearWeight, WeightLoader};

/// Which logits a forward pass computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wanted {
    /// None (a prefill chunk that is not the last).
    None,
    /// The last position's.
    Last,
    /// Every position's.
    All,
}

/// A loaded decoder: resident weights and per-layer geometry.
pub(crate) struct Decoder<B: Backend> {
    pub embed: B::Linear,
    /// `None`: tied to `embed`.
    pub lm_head: Option<B::Linear>,
    pub norm: B::Tensor,
    pub eps: f32,
    pub hidden: usize,
    pub layers: Vec<Layer<B>>,
    pub ropes: Vec<B::Rope>,
}

pub(crate) struct Layer<B: Backend> {
    pub input_norm: B::Tensor,
    pub post_norm: B::Tensor,
    pub attn: Attention<B>,
    pub mlp: Mlp<B>,
}

pub(crate) struct Attention<B: Backend> {
    pub q: B::Linear,
    pub k: B::Linear,
    pub v: B::Linear,
    pub o: B::Linear,
    pub q_bias: Option<B::Tensor>,
    pub k_bias: Option<B::Tensor>,
    pub v_bias: Option<B::Tensor>,
    pub o_bias: Option<B::Tensor>,
    pub q_norm: Option<B::Tensor>,
    pub k_norm: Option<B::Tensor>,
    /// Softplus output gate (`g_proj`): one scalar per head (or per element).
    pub gate: Option<B::Linear>,
    /// Index into [`Decoder::ropes`].
    pub rope: usize,
    pub params: AttentionParams,
    pub kv: KvLayerSpec,
}

pub(crate) struct SwiGlu<B: Backend> {
    pub gate: B::Linear,
    pub up: B::Linear,
    pub down: B::Linear,
}

pub(crate) struct Moe<B: Backend> {
    pub router: B::Linear,
    pub selection_bias: Option<B::Tensor>,
    pub experts: B::Experts,
    pub shared: Option<SwiGlu<B>>,
    pub params: RouterParams,
    pub routed_scale: f32,
}

pub(crate) enum Mlp<B: Backend> {
    Dense(SwiGlu<B>),
    Moe(Moe<B>),
}

impl<B: Backend> Decoder<B> {
    /// Runs `ids` (positions `pos0..pos0 + len`) through the network, appending to `kv`.
    /// Returns the logits `wanted`: `[len, vocab]`, `[1, vocab]` of the last position, or none.
    pub fn forward(
        &self,
        b: &B,
        kv: &mut [B::KvLayer],
        ids: &[u32],
        pos0: usize,
        wanted: Wanted,
    ) -> Result<Option<B::Tensor>> {
        if let ([id], Wanted::Last) = (ids, wanted) {
            if let Some(logits) = b.decode_step(self, kv, *id, pos0)? {
                return Ok(Some(logits));
            }
        }
        let mut x = b.embed(&self.embed, ids)?;
        for (layer, cache) in self.layers.iter().zip(kv.iter_mut()) {
            self.residual_block(b, layer, &mut x, |a| {
                layer.attn.forward(b, a, cache, pos0, self)
            })?;
        }
        let x = match wanted {
            Wanted::None => return Ok(None),
            Wanted::All => x,
            Wanted::Last => {
                let (rows, _) = b.dims(&x);
                b.rows(&x, rows.saturating_sub(1), 1)?
            }
        };
        let y = b.rms_norm(&x, &self.norm, self.eps, self.hidden)?;
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        b.linear(&y, head, None).map(Some)
    }

    /// One layer on the residual stream `x`: `x += attention(norm(x))`, then
    /// `x += mlp(post_norm(x))`; `attention` maps the normed rows to the attention output.
    pub(crate) fn residual_block(
        &self,
        b: &B,
        layer: &Layer<B>,
        x: &mut B::Tensor,
        attention: impl FnOnce(&B::Tensor) -> Result<B::Tensor>,
    ) -> Result<()> {
        let a = b.rms_norm(x, &layer.input_norm, self.eps, self.hidden)?;
        let h = attention(&a)?;
        b.add_scaled(x, 1.0, &h)?;
        let m = b.rms_norm(x, &layer.post_norm, self.eps, self.hidden)?;
        let h = match &layer.mlp {
            Mlp::Dense(mlp) => mlp.forward(b, &m)?,
            Mlp::Moe(moe) => moe.forward(b, &m)?,
        };
        b.add_scaled(x, 1.0, &h)
    }
}

impl<B: Backend> Attention<B> {
    /// q, k and v of the rows of `a`, q and k normalised per head where the layer has q/k norms
    /// (before rope).
    fn qkv(
        &self,
        b: &B,
        a: &B::Tensor,
        dec: &Decoder<B>,
    ) -> Result<(B::Tensor, B::Tensor, B::Tensor)> {
        let d = self.params.head_dim;
        let mut q = b.linear(a, &self.q, self.q_bias.as_ref())?;
        let mut k = b.linear(a, &self.k, self.k_bias.as_ref())?;
        let v = b.linear(a, &self.v, self.v_bias.as_ref())?;
        if let Some(n) = &self.q_norm {
            q = b.rms_norm(&q, n, dec.eps, d)?;
        }
        if let Some(n) = &self.k_norm {
            k = b.rms_norm(&k, n, dec.eps, d)?;
        }
        Ok((q, k, v))
    }

    fn forward(
        &self,
        b: &B,
        a: &B::Tensor,
        cache: &mut B::KvLayer,
        pos0: usize,
        dec: &Decoder<B>,
    ) -> Result<B::Tensor> {
        let d = self.params.head_dim;
        let (mut q, mut k, v) = self.qkv(b, a, dec)?;
        let rope = &dec.ropes[self.rope];
        b.rope(&mut q, rope, d, pos0)?;
        b.rope(&mut k, rope, d, pos0)?;
        let mut o = b.attention(&q, &k, &v, cache, &self.params)?;
        if let Some(g) = &self.gate {
            let gate = b.linear(a, g, None)?;
            b.softplus_gate(&mut o, &gate)?;
        }
        b.linear(&o, &self.o, self.o_bias.as_ref())
    }
}

impl<B: Backend> SwiGlu<B> {
    fn forward(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        let g = b.linear(x, &self.gate, None)?;
        let u = b.linear(x, &self.up, None)?;
        let a = b.silu_mul(&g, &u)?;
        b.linear(&a, &self.down, None)
    }
}

impl<B: Backend> Moe<B> {
    fn forward(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        let logits = b.linear(x, &self.router, None)?;
        let routing = b.route(
            &logits,
            self.selection_bias.as_ref(),
            &self.params,
            self.routed_scale,
        )?;
        let mut out = b.experts(x, &routing, &self.experts)?;
        if let Some(shared) = &self.shared {
            let s = shared.forward(b, x)?;
            b.add_scaled(&mut out, 1.0, &s)?;
        }
        Ok(out)
    }
}

/// Loading helpers shared by the families: finds tensors through a [`WeightLoader`] and makes
/// them resident on the backend.
pub(crate) struct LoadCtx<'a, B: Backend> {
    pub backend: &'a B,
    pub loader: &'a WeightLoader,
    /// Keep `input_global_scale` on W4A4 modules (emulate activation quantization).
    pub emulate_w4a4: bool,
}

impl<B: Backend> LoadCtx<'_, B> {
    /// `module`'s weight, checked to be `[rows, cols]`, resident.
    pub fn linear(&self, module: &str, rows: usize, cols: usize) -> Result<B::Linear> {
        let w = self.prepare(self.loader.linear(module, rows, cols)?);
        self.backend.load_linear(module, w)
    }

    /// `module`'s weight, whatever its shape, resident.
    pub fn linear_any(&self, module: &str) -> Result<(B::Linear, usize, usize)> {
        let w = self.prepare(self.loader.linear_any(module)?);
        let (r, c) = (w.rows(), w.cols());
        Ok((self.backend.load_linear(module, w)?, r, c))
    }

    fn prepare(&self, mut w: LinearWeight) -> LinearWeight {
        if !self.emulate_w4a4 {
            if let LinearWeight::Nvfp4 {
                input_global_scale, ..
            } = &mut w
            {
                *input_global_scale = None;
            }
        }
        w
    }

    /// A 1-D tensor of `len` values as a `[1, len]` tensor.
    pub fn vector(&self, name: &str, len: usize) -> Result<B::Tensor> {
        let v = self.loader.vector(name, len)?;
        self.backend.upload(1, len, &v)
    }

    /// [`vector`](Self::vector) if the tensor exists.
    pub fn opt_vector(&self, name: &str, len: usize) -> Result<Option<B::Tensor>> {
        match self.loader.opt_vector(name, len)? {
            Some(v) => Ok(Some(self.backend.upload(1, len, &v)?)),
            None => Ok(None),
        }
    }

    /// A SwiGLU MLP under `prefix` (`{prefix}.gate_proj`, `.up_proj`, `.down_proj`).
    pub fn swiglu(&self, prefix: &str, hidden: usize, inter: usize) -> Result<SwiGlu<B>> {
        Ok(SwiGlu {
            gate: self.linear(&format!("{prefix}.gate_proj"), inter, hidden)?,
            up: self.linear(&format!("{prefix}.up_proj"), inter, hidden)?,
            down: self.linear(&format!("{prefix}.down_proj"), hidden, inter)?,
        })
    }

    /// Routed experts under `prefix` (`…mlp.experts`): per-expert 2-D tensors
    /// (`{prefix}.E.{gate,up,down}_proj`), or fused 3-D ones (`{prefix}.gate_up_proj
    /// [E, 2I, H]` with gate rows first, `{prefix}.down_proj [E, H, I]`).
    pub fn experts(
        &self,
        prefix: &str,
        n: usize,
        hidden: usize,
        inter: usize,
    ) -> Result<B::Experts> {
        let fused = format!("{prefix}.gate_up_proj");
        let list = if self.loader.has(&fused) {
            let gate_up = self.loader.stacked_linears(&fused, n, 2 * inter, hidden)?;
            let down =
                self.loader
                    .stacked_linears(&format!("{prefix}.down_proj"), n, hidden, inter)?;
            gate_up
                .into_iter()
                .zip(down)
                .map(|(gu, down)| {
                    let (gate, up) = split_rows(gu, inter);
                    ExpertWeights { gate, up, down }
                })
                .collect()
        } else {
            (0..n)
                .map(|e| {
                    let p = format!("{prefix}.{e}");
                    Ok(ExpertWeights {
                        gate: self.prepare(self.loader.linear(
                            &format!("{p}.gate_proj"),
                            inter,
                            hidden,
                        )?),
                        up: self.prepare(self.loader.linear(
                            &format!("{p}.up_proj"),
                            inter,
                            hidden,
                        )?),
                        down: self.prepare(self.loader.linear(
                            &format!("{p}.down_proj"),
                            hidden,
                            inter,
                        )?),
                    })
                })
                .collect::<Result<Vec<_>>>()?
        };
        self.backend.load_experts(prefix, list)
    }
}

/// Splits a dense `[2·inter, cols]` weight into its first and last `inter` rows.
fn split_rows(w: LinearWeight, inter: usize) -> (LinearWeight, LinearWeight) {
    let part = |data: &crate::weights::Bytes, size: usize, which: usize| {
        let per = inter * w.cols() * size;
        data.slice(which * per..(which + 1) * per)
    };
    let cols = w.cols();
    match &w {
        LinearWeight::Bf16 { data, .. } => (
            LinearWeight::Bf16 {
                data: part(data, 2, 0),
                rows: inter,
                cols,
            },
            LinearWeight::Bf16 {
                data: part(data, 2, 1),
                rows: inter,
                cols,
            },
        ),
        LinearWeight::F16 { data, .. } => (
            LinearWeight::F16 {
                data: part(data, 2, 0),
                rows: inter,
                cols,
            },
            LinearWeight::F16 {
                data: part(data, 2, 1),
                rows: inter,
                cols,
            },
        ),
        LinearWeight::F32 { data, .. } => (
            LinearWeight::F32 {
                data: part(data, 4, 0),
                rows: inter,
                cols,
            },
            LinearWeight::F32 {
                data: part(data, 4, 1),
                rows: inter,
                cols,
            },
        ),
        // `stacked_linears` yields dense weights only.
        LinearWeight::Nvfp4 { .. } => unreachable!("fused experts are dense"),
    }
}
