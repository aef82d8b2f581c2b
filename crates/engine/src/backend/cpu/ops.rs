//! Elementwise and row-wise ops of the CPU backend, in f32 as the reference computes them.

use std::sync::RwLock;

use crate::rope::RopeSpec;

/// RMSNorm over each consecutive group of `width` values: `x · rsqrt(mean(x²) + eps) · w`.
pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f32, width: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for (o, g) in out.chunks_exact_mut(width).zip(x.chunks_exact(width)) {
        let ss: f64 = g.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let mean = (ss / width as f64) as f32;
        let r = 1.0 / (mean + eps).sqrt();
        for ((o, &v), &wi) in o.iter_mut().zip(g).zip(w) {
            *o = wi * (v * r);
        }
    }
    out
}

/// torch's softplus (β = 1, threshold 20) in f32.
#[inline]
pub(crate) fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// A rotary embedding with cos/sin tables grown on demand (positions are computed once and
/// reused by every layer of the type and every later call).
#[derive(Debug)]
pub struct CpuRope {
    spec: RopeSpec,
    /// `[positions, half]` cos, then sin, of every position computed so far.
    tables: RwLock<(Vec<f32>, Vec<f32>)>,
}

/// Positions added to the tables at a time.
const TABLE_STEP: usize = 1024;

impl CpuRope {
    pub(crate) fn new(spec: RopeSpec) -> Self {
        Self {
            spec,
            tables: RwLock::new((Vec::new(), Vec::new())),
        }
    }

    /// The rope's parameters.
    pub fn spec(&self) -> &RopeSpec {
        &self.spec
    }

    fn ensure(&self, positions: usize) {
        let half = self.spec.rotary_dim / 2;
        let have = match self.tables.read() {
            Ok(t) => t.0.len() / half.max(1),
            Err(p) => p.into_inner().0.len() / half.max(1),
        };
        if have >= positions {
            return;
        }
        let mut t = match self.tables.write() {
            Ok(t) => t,
            Err(p) => p.into_inner(),
        };
        let target = positions.div_ceil(TABLE_STEP) * TABLE_STEP;
        let (cos, sin) = &mut *t;
        let mut p = cos.len() / half.max(1);
        while p < target {
            self.spec.cos_sin(p, cos, sin);
            p += 1;
        }
    }

    /// Rotates `x` (`rows` rows of heads of `head_dim`) in place; row `t` at `pos0 + t`.
    pub(crate) fn apply(&self, x: &mut [f32], cols: usize, head_dim: usize, pos0: usize) {
        let rows = x.len() / cols.max(1);
        self.ensure(pos0 + rows);
        let half = self.spec.rotary_dim / 2;
        let t = match self.tables.read() {
            Ok(t) => t,
            Err(p) => p.into_inner(),
        };
        let (cos, sin) = (&t.0, &t.1);
        for (r, row) in x.chunks_exact_mut(cols).enumerate() {
            let pos = pos0 + r;
            let c = &cos[pos * half..(pos + 1) * half];
            let s = &sin[pos * half..(pos + 1) * half];
            for head in row.chunks_exact_mut(head_dim) {
                let (a, b) = head[..2 * half].split_at_mut(half);
                for j in 0..half {
                    let (x1, x2) = (a[j], b[j]);
                    a[j] = x1 * c[j] - x2 * s[j];
                    b[j] = x2 * c[j] + x1 * s[j];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_per_group() {
        let x = [3.0f32, 4.0, 1.0, 1.0];
        let out = rms_norm(&x, &[1.0, 2.0], 0.0, 2);
        let r = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / r).abs() < 1e-6 && (out[1] - 8.0 / r).abs() < 1e-6);
        assert!((out[2] - 1.0).abs() < 1e-6 && (out[3] - 2.0).abs() < 1e-6);
    }

    #[test]
    fn rope_rotates_pairs_within_the_slice() {
        let spec = RopeSpec {
            inv_freq: vec![1.0],
            rotary_dim: 2,
            attention_factor: 1.0,
        };
        let r = CpuRope::new(spec);
        let mut x = vec![1.0f32, 0.0, 5.0, 7.0];
        r.apply(&mut x, 4, 4, 1);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[1] - 1f32.sin()).abs() < 1e-6);
        assert_eq!(&x[2..], &[5.0, 7.0]);
    }

    #[test]
    fn softplus_threshold() {
        assert_eq!(softplus(25.0), 25.0);
        assert!((softplus(0.0) - 2f32.ln()).abs() < 1e-7);
    }
}
