//! The entry points of kernels/moe.cu: the router's top-k and the expert kernels (host side:
//! `moe.rs`).

use super::DevPtr;
use crate::backend::cuda::{Epi, ExpertProj, Route};

kernels! {
    group moe;

    /// The router's top-`k` of `n` expert logits per token (one warp per token).
    route => RouteArgs {
        logits: DevPtr<f32>, bias: DevPtr<f32>, n: i32, k: i32, softmax: i32, normalize: i32,
        softcap: f32, scale: f32, sel: DevPtr<i32>, wts: DevPtr<f32>,
    }
    /// Gate/up (SiLU · up into `h`) of each (token, expert) item, one grid row per item.
    experts_gate_up2 => ExpertsGateUp2Args {
        gate: ExpertProj, up: ExpertProj, sgate: ExpertProj, sup: ExpertProj, has_shared: i32,
        shared_inter: i32, sel: DevPtr<i32>, k: i32, t: i32, x: DevPtr<f32>, h: DevPtr<f32>,
        inter: i32, hidden: i32, mma: i32,
    }
    /// Down of each item into its row of `part` (weighted), one grid row per item.
    experts_down2 => ExpertsDown2Args {
        down: ExpertProj, sdown: ExpertProj, shared_inter: i32, sel: DevPtr<i32>,
        wts: DevPtr<f32>, k: i32, t: i32, h: DevPtr<f32>, inter: i32, part: DevPtr<f32>,
        hidden: i32, mma: i32,
    }
    /// One token's gate/up on persistent blocks (the top-k first where `route` asks for it).
    experts_gate_up_p => ExpertsGateUpPArgs {
        gate: ExpertProj, up: ExpertProj, sgate: ExpertProj, sup: ExpertProj, has_shared: i32,
        shared_inter: i32, sel: DevPtr<i32>, wts: DevPtr<f32>, k: i32, x: DevPtr<f32>,
        h: DevPtr<f32>, inter: i32, hidden: i32, route: Route,
    }
    /// One token's down on persistent blocks.
    experts_down_p => ExpertsDownPArgs {
        down: ExpertProj, sdown: ExpertProj, has_shared: i32, shared_inter: i32,
        sel: DevPtr<i32>, wts: DevPtr<f32>, k: i32, h: DevPtr<f32>, inter: i32,
        part: DevPtr<f32>, hidden: i32,
    }
    /// `out = resid + Σ part` in item order, then the epilogue `epi` in the last block.
    experts_reduce => ExpertsReduceArgs {
        part: DevPtr<f32>, k: i32, t: i32, has_shared: i32, out: DevPtr<f32>, resid: DevPtr<f32>,
        hidden: i32, epi: Epi,
    }
}
