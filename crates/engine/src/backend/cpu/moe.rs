//! Mixture-of-experts on the CPU: the router's decision and the routed experts' weighted sum.

use super::kernels::{self, Isa};
use super::linear::CpuLinear;
use super::tensor::CpuTensor;
use super::CpuActivations;
use crate::ir::{RouterParams, RouterScoring};

/// One MoE layer's routed experts.
#[derive(Debug, Clone)]
pub struct CpuExperts {
    pub(crate) experts: Vec<CpuExpert>,
}

/// One SwiGLU expert.
#[derive(Debug, Clone)]
pub(crate) struct CpuExpert {
    pub(crate) gate: CpuLinear,
    pub(crate) up: CpuLinear,
    pub(crate) down: CpuLinear,
}

/// Selected experts and their weights, `top_k` per token.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuRouting {
    /// Experts per token.
    pub top_k: usize,
    /// `[T, top_k]` expert ids, best first.
    pub experts: Vec<u32>,
    /// `[T, top_k]` weights.
    pub weights: Vec<f32>,
}

/// Scores, selection on `score + bias`, optional renormalisation, times `scale`.
pub(crate) fn route(
    logits: &CpuTensor,
    bias: Option<&[f32]>,
    p: &RouterParams,
    scale: f32,
) -> CpuRouting {
    let (t, n) = (logits.rows(), logits.cols());
    let k = p.top_k.min(n);
    let mut experts = Vec::with_capacity(t * k);
    let mut weights = Vec::with_capacity(t * k);
    let mut scores = vec![0f32; n];
    let mut order: Vec<usize> = Vec::with_capacity(n);
    for row in 0..t {
        let l = logits.row(row);
        let capped = |x: f32| {
            if p.logit_softcap > 0.0 {
                (x / p.logit_softcap).tanh() * p.logit_softcap
            } else {
                x
            }
        };
        match p.scoring {
            RouterScoring::Sigmoid => {
                for (s, &x) in scores.iter_mut().zip(l) {
                    *s = 1.0 / (1.0 + (-capped(x)).exp());
                }
            }
            RouterScoring::Softmax => {
                let max = l
                    .iter()
                    .map(|&x| capped(x))
                    .fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0f32;
                for (s, &x) in scores.iter_mut().zip(l) {
                    *s = (capped(x) - max).exp();
                    sum += *s;
                }
                for s in scores.iter_mut() {
                    *s /= sum;
                }
            }
        }
        let sel = |e: usize| scores[e] + bias.map_or(0.0, |b| b[e]);
        order.clear();
        order.extend(0..n);
        // Stable: equal selection scores keep the lower expert id first.
        order.sort_by(|&a, &b| sel(b).total_cmp(&sel(a)));
        let chosen = &order[..k];
        let sum: f32 = chosen.iter().map(|&e| scores[e]).sum();
        for &e in chosen {
            let w = if p.normalize {
                scores[e] / sum
            } else {
                scores[e]
            };
            experts.push(e as u32);
            weights.push(w * scale);
        }
    }
    CpuRouting {
        top_k: k,
        experts,
        weights,
    }
}

/// `Σ_j w_j · Expert_{e_j}(x_t)` per token; experts run in ascending id order over the tokens
/// routed to them (as transformers' loop does), each as one matmul over those tokens.
pub(crate) fn experts(
    isa: Isa,
    act: CpuActivations,
    x: &CpuTensor,
    routing: &CpuRouting,
    e: &CpuExperts,
) -> CpuTensor {
    let (t, h) = (x.rows(), x.cols());
    let mut out = vec![0f32; t * h];
    let n = e.experts.len();
    let mut by_expert: Vec<Vec<(usize, f32)>> = vec![Vec::new(); n];
    for tok in 0..t {
        for j in 0..routing.top_k {
            let id = routing.experts[tok * routing.top_k + j] as usize;
            if let Some(list) = by_expert.get_mut(id) {
                list.push((tok, routing.weights[tok * routing.top_k + j]));
            }
        }
    }
    for (id, list) in by_expert.iter().enumerate() {
        if list.is_empty() {
            continue;
        }
        let ex = &e.experts[id];
        let m = list.len();
        let mut xs = Vec::with_capacity(m * h);
        for &(tok, _) in list {
            xs.extend_from_slice(x.row(tok));
        }
        let g = ex.gate.matmul(isa, act, &xs, m);
        let u = ex.up.matmul(isa, act, &xs, m);
        let a = kernels::silu_mul(isa, &g, &u);
        let y = ex.down.matmul(isa, act, &a, m);
        for (i, &(tok, w)) in list.iter().enumerate() {
            kernels::axpy(
                isa,
                &mut out[tok * h..(tok + 1) * h],
                w,
                &y[i * h..(i + 1) * h],
            );
        }
    }
    CpuTensor::new(t, h, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bias_selects_but_does_not_weight() {
        let logits = CpuTensor::new(1, 4, vec![2.0, 1.0, 0.0, -1.0]);
        let p = RouterParams {
            top_k: 2,
            scoring: RouterScoring::Sigmoid,
            normalize: true,
            logit_softcap: 0.0,
        };
        let bias = [0.0, 0.0, 0.0, 10.0];
        let r = route(&logits, Some(&bias), &p, 2.5);
        assert_eq!(r.experts, vec![3, 0]);
        let s = |x: f32| 1.0 / (1.0 + (-x).exp());
        let (a, b) = (s(-1.0), s(2.0));
        assert!((r.weights[0] - 2.5 * a / (a + b)).abs() < 1e-6);
        assert!((r.weights[1] - 2.5 * b / (a + b)).abs() < 1e-6);
    }
}
