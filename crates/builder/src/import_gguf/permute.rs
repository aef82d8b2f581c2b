//! Undoing llama.cpp's Q/K row permutation.
//!
//! ggml's llama graph applies RoPE to *adjacent* pairs (x[2i], x[2i+1]) of each head; transformers'
//! Llama rotates *halves* (x[i], x[i + d/2]). llama.cpp's converter therefore reorders the rows of
//! `q_proj`/`k_proj` (weights and biases) within each head:
//!
//! ```text
//! gguf = hf.reshape(n_head, 2, d/2, in).swapaxes(1, 2).reshape(out, in)     (convert_hf_to_gguf)
//! hf   = gguf.reshape(n_head, d/2, 2, in).swapaxes(1, 2).reshape(out, in)   (this module)
//! ```
//!
//! i.e. HF row `h·d + s·d/2 + i` is GGUF row `h·d + 2i + s` (s ∈ {0, 1}, i < d/2), with `n_head`
//! the query heads for `q` and the key/value heads for `k`.

/// Reorders the rows of a row-major `[rows, cols]` matrix from GGUF (interleaved RoPE pairs) to
/// HF (rotate-half) order. `rows` must be a multiple of `2·n_head` (checked by the caller).
pub(crate) fn unpermute_rows<T: Copy>(
    gguf: &[T],
    rows: usize,
    cols: usize,
    n_head: usize,
) -> Vec<T> {
    debug_assert_eq!(gguf.len(), rows * cols);
    debug_assert_eq!(rows % (2 * n_head), 0);
    let head_dim = rows / n_head;
    let half = head_dim / 2;
    let mut hf = Vec::with_capacity(gguf.len());
    for h in 0..n_head {
        for s in 0..2 {
            for i in 0..half {
                let src = h * head_dim + 2 * i + s;
                hf.extend_from_slice(&gguf[src * cols..(src + 1) * cols]);
            }
        }
    }
    hf
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's forward permutation, written independently from its numpy form
    /// `w.reshape(n_head, 2, d/2, in).swapaxes(1, 2)`: GGUF row (h, i, s) = HF row (h, s, i).
    fn permute_rows(hf: &[u32], rows: usize, cols: usize, n_head: usize) -> Vec<u32> {
        let half = rows / n_head / 2;
        let mut out = Vec::new();
        for h in 0..n_head {
            for i in 0..half {
                for s in 0..2 {
                    let r = (h * 2 + s) * half + i;
                    out.extend_from_slice(&hf[r * cols..(r + 1) * cols]);
                }
            }
        }
        out
    }

    #[test]
    fn hand_made_example() {
        // 2 heads of dim 4, 1 column: HF rows [a0 a1 b0 b1 | c0 c1 d0 d1] (a/b halves of head 0)
        // are stored by llama.cpp as [a0 b0 a1 b1 | c0 d0 c1 d1].
        let gguf = [10, 20, 11, 21, 30, 40, 31, 41];
        assert_eq!(
            unpermute_rows(&gguf, 8, 1, 2),
            [10, 11, 20, 21, 30, 31, 40, 41]
        );
        // With 3 columns the rows move whole.
        let gguf: Vec<u32> = [0, 2, 1, 3]
            .iter()
            .flat_map(|&r| [r * 10, r * 10 + 1, r * 10 + 2])
            .collect();
        let hf: Vec<u32> = (0..4)
            .flat_map(|r| [r * 10, r * 10 + 1, r * 10 + 2])
            .collect();
        assert_eq!(unpermute_rows(&gguf, 4, 3, 1), hf);
    }

    #[test]
    fn inverts_llama_cpp_permutation() {
        for (n_head, head_dim, cols) in [(9, 64, 5), (3, 64, 2), (1, 2, 1), (4, 8, 3)] {
            let rows = n_head * head_dim;
            let hf: Vec<u32> = (0..(rows * cols) as u32).collect();
            let gguf = permute_rows(&hf, rows, cols, n_head);
            if head_dim > 2 {
                assert_ne!(gguf, hf, "a real permutation");
            }
            assert_eq!(unpermute_rows(&gguf, rows, cols, n_head), hf);
        }
    }
}
