//! KV cache memory: sliding-window layers stay flat once the sequence passes the window (a ring
//! of `window` slots), full-attention layers grow by one row per token; fp8 halves bf16. A copy of
//! a session's prefix (`Session::fork`, what the server's prefix cache does) continues exactly
//! like a fresh one and leaves the original intact, and a wrapped ring refuses to be cut back.

mod common;

use common::{max_abs_diff, tiny_laguna, token_ids};
use fp4forge_engine::{KvDtype, Model, ModelOptions};

const WINDOW: usize = 16;

#[test]
fn sliding_layers_are_flat_past_the_window_and_full_layers_grow() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tiny_laguna(tmp.path(), "bf16", false);
    for kv in [KvDtype::Bf16, KvDtype::Fp8E4m3, KvDtype::F32] {
        let model = Model::load(&dir, ModelOptions::new().kv_dtype(kv)).unwrap();
        let specs = model.kv_specs().to_vec();
        assert!(specs.iter().any(|s| s.window == Some(WINDOW)));
        assert!(specs.iter().any(|s| s.window.is_none()));
        let ids = token_ids(6 * WINDOW, model.info().vocab_size as u32, 3);
        let mut s = model.new_session().unwrap();
        s.prefill(&ids[..WINDOW]).unwrap();
        let at_window: Vec<usize> = (0..specs.len()).map(|l| s.layer_kv_bytes(l)).collect();
        for &t in &ids[WINDOW..3 * WINDOW] {
            s.step(t).unwrap();
        }
        // a long chunk (longer than the window) on top
        s.prefill(&ids[3 * WINDOW..]).unwrap();
        let n = s.position();
        assert_eq!(n, 6 * WINDOW);
        for (l, spec) in specs.iter().enumerate() {
            let bytes = s.layer_kv_bytes(l);
            let row = 2 * spec.kv_heads * spec.head_dim * kv.size();
            match spec.window {
                Some(w) => {
                    assert_eq!(bytes, at_window[l], "{kv:?} layer {l}: sliding cache grew");
                    assert_eq!(bytes, w * row, "{kv:?} layer {l}: ring is window rows");
                }
                None => {
                    assert!(
                        bytes >= n * row,
                        "{kv:?} layer {l}: full cache holds every row"
                    );
                    assert!(
                        bytes > at_window[l],
                        "{kv:?} layer {l}: full cache did not grow"
                    );
                }
            }
        }
    }
}

#[test]
fn a_forked_prefix_continues_like_a_fresh_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tiny_laguna(tmp.path(), "bf16", false);
    let model = Model::load(&dir, ModelOptions::new().kv_dtype(KvDtype::F32)).unwrap();
    let vocab = model.info().vocab_size as u32;
    let ids = token_ids(WINDOW, vocab, 5);
    let other = token_ids(6, vocab, 9);
    // within the window: a copy of the first 10 tokens, continued with other tokens
    let mut s = model.new_session().unwrap();
    s.prefill(&ids[..WINDOW - 1]).unwrap();
    let mut f = s.fork(10).unwrap().unwrap();
    assert_eq!((f.position(), s.position()), (10, WINDOW - 1));
    let reused = f.prefill_all(&other).unwrap();
    let mut fresh = model.new_session().unwrap();
    fresh.prefill(&ids[..10]).unwrap();
    let want = fresh.prefill_all(&other).unwrap();
    let diff = max_abs_diff(&reused.data, &want.data);
    assert!(diff <= 1e-5, "fork: max |Δ| {diff}");
    // the original is untouched by the fork and by what the fork was fed
    let next = s.step(ids[WINDOW - 1]).unwrap();
    let mut whole = model.new_session().unwrap();
    let want = whole.prefill(&ids).unwrap();
    let diff = max_abs_diff(&next, &want);
    assert!(diff <= 1e-5, "original after the fork: max |Δ| {diff}");
    // past the window the sliding rings have wrapped: only the whole sequence can be copied
    s.prefill(&token_ids(2 * WINDOW, vocab, 11)).unwrap();
    let n = s.position();
    assert!(s.fork(n - 1).unwrap().is_none());
    assert!(s.fork(n + 1).unwrap().is_none());
    let mut f = s.fork(n).unwrap().unwrap();
    assert_eq!(f.position(), n);
    let a = f.step(3).unwrap();
    let b = s.step(3).unwrap();
    assert_eq!(a, b, "a copy of a wrapped ring continues like the original");
}
