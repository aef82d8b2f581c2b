//! Self-consistency of the forward pass: one full prefill, chunked prefills (chunks shorter and
//! longer than the sliding window) and step-by-step decode give the same logits at every
//! position, past the window, for bf16 and NVFP4 weights and for every KV storage type.
//!
//! Tolerance with an f32 cache: 1e-4 absolute at every position. The paths differ only in f32
//! summation order (GEMV vs tiled GEMM kernels, attention over a ring vs a chunk), measured at
//! ~1e-6 on logits of magnitude ~4.
//!
//! With a bf16 or fp8 cache, new keys are rounded to the storage type before any query reads them,
//! on every path alike; but a ~1e-7 difference in a key before rounding can still tip it across a
//! rounding boundary (one bf16 ulp is 2^-8 relative), and this random model amplifies such a
//! step ~20x. So: 1e-4 at the median position, and a bound at every position that one such flip
//! stays under (bf16 5e-3, measured ≤ 5e-4; fp8 5e-2).

mod common;

use common::{max_abs_diff, tiny_laguna, token_ids};
use fp4forge_engine::{KvDtype, Model, ModelOptions};

const TOL: f32 = 1e-4;
const WINDOW: usize = 16; // the tiny preset's sliding window

fn stepwise(model: &Model, ids: &[u32], first: usize) -> Vec<Vec<f32>> {
    let mut s = model.new_session().unwrap();
    let mut out = vec![s.prefill(&ids[..first]).unwrap()];
    for &t in &ids[first..] {
        out.push(s.step(t).unwrap());
    }
    out
}

/// Checks per-position differences against the tolerances above.
fn assert_close(kv: KvDtype, label: &str, diffs: &mut [f32]) {
    let worst = diffs.iter().fold(0f32, |m, d| m.max(*d));
    diffs.sort_by(f32::total_cmp);
    let median = diffs[diffs.len() / 2];
    let bound = match kv {
        KvDtype::F32 => TOL,
        KvDtype::Bf16 => 5e-3,
        KvDtype::Fp8E4m3 => 5e-2,
    };
    assert!(
        worst <= bound && median <= TOL,
        "{kv:?} {label}: max |diff| {worst} (bound {bound}), median {median}"
    );
}

fn check(dir: &std::path::Path, kv: KvDtype) {
    let n = 3 * WINDOW + 5;
    let model = Model::load(dir, ModelOptions::new().kv_dtype(kv)).unwrap();
    let vocab = model.info().vocab_size;
    let ids = token_ids(n, vocab as u32, 11);
    let full = model.new_session().unwrap().prefill_all(&ids).unwrap();
    assert_eq!((full.rows, full.vocab), (n, vocab));

    // Step by step after a 3-token prompt.
    let steps = stepwise(&model, &ids, 3);
    let mut diffs: Vec<f32> = steps
        .iter()
        .enumerate()
        .map(|(i, logits)| max_abs_diff(logits, full.row(i + 2)))
        .collect();
    assert_close(kv, "stepwise", &mut diffs);

    // Chunked prefill: chunks shorter than, and longer than, the window.
    for chunk in [5, WINDOW + 7, 2 * WINDOW + 3] {
        let m = Model::load(dir, ModelOptions::new().kv_dtype(kv).prefill_chunk(chunk)).unwrap();
        let got = m.new_session().unwrap().prefill_all(&ids).unwrap();
        let mut diffs: Vec<f32> = (0..n)
            .map(|p| max_abs_diff(got.row(p), full.row(p)))
            .collect();
        assert_close(kv, &format!("chunk {chunk}"), &mut diffs);
        // prefill (last position only) agrees with prefill_all's last row
        let last = m.new_session().unwrap().prefill(&ids).unwrap();
        let d = max_abs_diff(&last, got.row(n - 1));
        assert!(
            d <= TOL,
            "{kv:?} chunk {chunk}: prefill vs prefill_all last row {d}"
        );
    }
}

#[test]
fn bf16_weights_prefill_equals_decode_past_the_window() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tiny_laguna(tmp.path(), "bf16", false);
    for kv in [KvDtype::F32, KvDtype::Bf16, KvDtype::Fp8E4m3] {
        check(&dir, kv);
    }
}

#[test]
fn nvfp4_weights_prefill_equals_decode_past_the_window() {
    let tmp = tempfile::tempdir().unwrap();
    let stock = tiny_laguna(tmp.path(), "stock", true);
    check(&stock, KvDtype::F32);
    let all = common::all_linear_build(&stock, &tmp.path().join("all"));
    check(&all, KvDtype::Bf16);
}

#[test]
fn sliding_window_changes_only_positions_past_it() {
    // A key at distance >= window must not influence the query: logits of a sequence and of the
    // same sequence with an earlier token changed agree on sliding layers' reach... which is
    // model-wide only through full layers, so instead check the window's edge directly: with
    // every layer made full attention the logits past the window change, before it they do not.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tiny_laguna(tmp.path(), "bf16", false);
    let wide = tmp.path().join("wide");
    std::fs::create_dir_all(&wide).unwrap();
    for f in std::fs::read_dir(&dir).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), wide.join(f.file_name())).unwrap();
    }
    let cfg_path = wide.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    cfg["sliding_window"] = serde_json::json!(1_000_000);
    std::fs::write(&cfg_path, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();

    let opts = || ModelOptions::new().kv_dtype(KvDtype::F32);
    let a = Model::load(&dir, opts()).unwrap();
    let b = Model::load(&wide, opts()).unwrap();
    let n = 2 * WINDOW + 4;
    let ids = token_ids(n, a.info().vocab_size as u32, 5);
    let la = a.new_session().unwrap().prefill_all(&ids).unwrap();
    let lb = b.new_session().unwrap().prefill_all(&ids).unwrap();
    for pos in 0..n {
        let d = max_abs_diff(la.row(pos), lb.row(pos));
        if pos < WINDOW {
            assert!(
                d <= TOL,
                "position {pos} (inside the window) differs by {d}"
            );
        } else {
            assert!(
                d > 1e-3,
                "position {pos} (past the window) does not differ ({d})"
            );
        }
    }
}
