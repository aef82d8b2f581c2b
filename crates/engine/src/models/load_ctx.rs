//! Loading helpers the loader uses: tensors found by name through a [`WeightLoader`], checked
//! and made resident on the backend, assembled into the [`crate::ir`] types.

use crate::backend::Backend;
use crate::error::Result;
use crate::ir::SwiGlu;
use crate::weights::{ExpertWeights, LinearWeight, WeightLoader};

/// What the loader loads with: finds tensors through a [`WeightLoader`] and makes
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
