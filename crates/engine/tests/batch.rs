//! Batched forward passes (continuous batching) give each session the logits it gets alone:
//! `Model::step_batch` against per-session `Session::step`, and `Model::forward_batch` mixing
//! prompt chunks (last-row and all-row logits) with decode steps against `prefill_all`. Sessions
//! sit at different positions, some past the sliding window. With an f32 KV cache the paths
//! differ only in f32 summation order (tiled GEMM for the batch, GEMV alone): 1e-5 relative to
//! the logits' scale (their largest magnitude, ~4 here: measured ≤ 1.1e-5 absolute).

mod common;

use common::{lean_build, max_abs, max_abs_diff, tiny_laguna, token_ids};
use fp4forge_engine::{KvDtype, Model, ModelOptions, Session, Want};

const TOL: f32 = 1e-5;

/// `max |a − b|` in units of `b`'s scale (`max |b|`, at least 1).
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    max_abs_diff(a, b) / max_abs(b).max(1.0)
}

fn check_step_batch(model: &Model) {
    let vocab = model.info().vocab_size as u32;
    // Prompts of different lengths: positions 1, 7, 16 (= window), 29 (past it).
    let prompts: Vec<Vec<u32>> = [1usize, 7, 16, 29]
        .iter()
        .enumerate()
        .map(|(i, &n)| token_ids(n, vocab, 100 + i as u64))
        .collect();
    let steps = 12;
    let next: Vec<Vec<u32>> = (0..prompts.len())
        .map(|i| token_ids(steps, vocab, 200 + i as u64))
        .collect();

    let mut alone: Vec<Session> = prompts
        .iter()
        .map(|p| {
            let mut s = model.new_session().unwrap();
            s.prefill(p).unwrap();
            s
        })
        .collect();
    let mut batched: Vec<Session> = prompts
        .iter()
        .map(|p| {
            let mut s = model.new_session().unwrap();
            s.prefill(p).unwrap();
            s
        })
        .collect();
    let mut worst = 0f32;
    for step in 0..steps {
        let tokens: Vec<u32> = next.iter().map(|n| n[step]).collect();
        let want: Vec<Vec<f32>> = alone
            .iter_mut()
            .zip(&tokens)
            .map(|(s, &t)| s.step(t).unwrap())
            .collect();
        let mut refs: Vec<&mut Session> = batched.iter_mut().collect();
        let got = model.step_batch(&mut refs, &tokens).unwrap();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            worst = worst.max(rel_diff(g, w));
        }
    }
    for (a, b) in alone.iter().zip(&batched) {
        assert_eq!(a.position(), b.position());
    }
    println!("step_batch vs step: max relative |diff| {worst}");
    assert!(worst <= TOL, "step_batch differs from step by {worst}");
}

#[test]
fn step_batch_equals_stepping_each_session() {
    let tmp = tempfile::tempdir().unwrap();
    let bf16 = tiny_laguna(tmp.path(), "bf16", false);
    let lean = lean_build(
        &tiny_laguna(tmp.path(), "stock", true),
        &tmp.path().join("lean"),
    );
    for dir in [&bf16, &lean] {
        let model = Model::load(dir, ModelOptions::new().kv_dtype(KvDtype::F32)).unwrap();
        check_step_batch(&model);
    }
}

#[test]
fn forward_batch_mixes_prompt_chunks_and_decode_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tiny_laguna(tmp.path(), "bf16", false);
    let model = Model::load(&dir, ModelOptions::new().kv_dtype(KvDtype::F32)).unwrap();
    let vocab = model.info().vocab_size as u32;
    let a_ids = token_ids(40, vocab, 1);
    let b_ids = token_ids(23, vocab, 2);
    let a_full = model.new_session().unwrap().prefill_all(&a_ids).unwrap();
    let b_full = model.new_session().unwrap().prefill_all(&b_ids).unwrap();

    // A: a 20-token prompt already in, then decodes a_ids[20..] one at a time.
    // B: prefills b_ids in chunks of 9, 9, 5 alongside A's steps, asking for every row.
    let mut a = model.new_session().unwrap();
    a.prefill(&a_ids[..20]).unwrap();
    let mut b = model.new_session().unwrap();
    let mut b_rows: Vec<Vec<f32>> = Vec::new();
    let mut worst = 0f32;
    for (step, chunk) in [(0usize, 0..9usize), (1, 9..18), (2, 18..23)] {
        let a_tok = [a_ids[20 + step]];
        let mut sessions = [&mut a, &mut b];
        let out = model
            .forward_batch(
                &mut sessions,
                &[&a_tok, &b_ids[chunk.clone()]],
                &[Want::Last, Want::All],
            )
            .unwrap();
        let a_logits = out[0].as_ref().unwrap();
        assert_eq!(a_logits.rows, 1);
        worst = worst.max(rel_diff(a_logits.row(0), a_full.row(20 + step)));
        let b_logits = out[1].as_ref().unwrap();
        assert_eq!(b_logits.rows, chunk.len());
        b_rows.extend((0..b_logits.rows).map(|r| b_logits.row(r).to_vec()));
    }
    for (p, row) in b_rows.iter().enumerate() {
        worst = worst.max(rel_diff(row, b_full.row(p)));
    }
    assert_eq!((a.position(), b.position()), (23, 23));

    // A session that wants nothing next to one that wants its last row.
    let mut c = model.new_session().unwrap();
    let mut sessions = [&mut a, &mut c];
    let out = model
        .forward_batch(
            &mut sessions,
            &[&a_ids[23..24], &b_ids[..4]],
            &[Want::None, Want::Last],
        )
        .unwrap();
    assert!(out[0].is_none());
    worst = worst.max(rel_diff(out[1].as_ref().unwrap().row(0), b_full.row(3)));
    println!("forward_batch vs prefill_all: max relative |diff| {worst}");
    assert!(worst <= TOL, "forward_batch differs by {worst}");
}

#[test]
fn forward_batch_validates_its_inputs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tiny_laguna(tmp.path(), "bf16", false);
    let model = Model::load(&dir, ModelOptions::new().max_context(8)).unwrap();
    let mut a = model.new_session().unwrap();
    let mut b = model.new_session().unwrap();
    let mut sessions = [&mut a, &mut b];
    let err = model.step_batch(&mut sessions, &[1]).unwrap_err();
    assert!(
        err.to_string().contains("2 sessions, 1 token lists"),
        "{err}"
    );
    let err = model.step_batch(&mut sessions, &[1, 100_000]).unwrap_err();
    assert!(err.to_string().contains("100000"), "{err}");
    let long = [1u32; 9];
    let err = model
        .forward_batch(&mut sessions, &[&[1], &long], &[Want::Last, Want::Last])
        .unwrap_err();
    assert!(err.to_string().contains("context"), "{err}");
    // Nothing was appended by the refused calls.
    assert_eq!((a.position(), b.position()), (0, 0));
    let other = Model::load(&dir, ModelOptions::new()).unwrap();
    let mut c = other.new_session().unwrap();
    let mut sessions = [&mut a, &mut c];
    let err = model.step_batch(&mut sessions, &[1, 2]).unwrap_err();
    assert!(err.to_string().contains("another model"), "{err}");
}

/// A pass where some sessions have their next token picked (`forward_batch_sampled`) gives the
/// tokens each session's own seeded sampler picks from its logits alone, leaves the others
/// their logits, and refuses a sampler on a chunk that does not want its last logits.
#[test]
fn forward_batch_sampled_picks_what_each_sampler_picks_alone() {
    use fp4forge_engine::{Output, Sampler, SamplingParams};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tiny_laguna(tmp.path(), "bf16", false);
    let model = Model::load(&dir, ModelOptions::new().kv_dtype(KvDtype::F32)).unwrap();
    let vocab = model.info().vocab_size as u32;
    let params = |seed| SamplingParams {
        temperature: 0.8,
        top_k: 20,
        top_p: 0.9,
        seed,
    };
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|i| token_ids(5 + 7 * i, vocab, 300 + i as u64))
        .collect();
    let mut batched: Vec<Session> = Vec::new();
    let mut alone: Vec<Session> = Vec::new();
    for p in &prompts {
        for list in [&mut batched, &mut alone] {
            let mut s = model.new_session().unwrap();
            s.prefill(p).unwrap();
            list.push(s);
        }
    }
    let mut batch_samplers = [Sampler::new(params(1)), Sampler::new(params(2))];
    let mut alone_samplers = [Sampler::new(params(1)), Sampler::new(params(2))];
    let mut tokens = [3u32, 4, 5];
    for _ in 0..6 {
        // Sessions 0 and 2 sample; session 1 gets its logits.
        let expected0 = alone[0]
            .step_sampled(tokens[0], &mut alone_samplers[0])
            .unwrap();
        let logits1 = alone[1].step(tokens[1]).unwrap();
        let expected2 = alone[2]
            .step_sampled(tokens[2], &mut alone_samplers[1])
            .unwrap();
        let [s0, s1] = &mut batch_samplers;
        let mut samplers = [Some(s0), None, Some(s1)];
        let mut refs: Vec<&mut Session> = batched.iter_mut().collect();
        let lists: Vec<&[u32]> = tokens.iter().map(std::slice::from_ref).collect();
        let out = model
            .forward_batch_sampled(&mut refs, &lists, &[Want::Last; 3], &mut samplers)
            .unwrap();
        assert_eq!(out[0], Output::Token(expected0));
        assert_eq!(out[2], Output::Token(expected2));
        let Output::Logits(l) = &out[1] else {
            panic!("session 1 wanted logits: {:?}", out[1]);
        };
        assert!(rel_diff(&l.data, &logits1) <= TOL);
        tokens = [expected0, (tokens[1] + 1) % vocab, expected2];
    }

    let mut refs: Vec<&mut Session> = batched.iter_mut().take(1).collect();
    let mut sampler = Sampler::new(params(9));
    let err = model
        .forward_batch_sampled(
            &mut refs,
            &[&[1, 2]],
            &[Want::All],
            &mut [Some(&mut sampler)],
        )
        .unwrap_err();
    assert!(err.to_string().contains("sampler"), "{err}");
}

/// Log-probabilities wanted from a pass (`forward_batch_scored`) are those the host computes
/// from the same logits: a prompt chunk's rows score its next tokens and the row past the
/// targets comes back as logits; a sampled session gets its pick and the pick's score; a
/// session without a spec gets its logits as before.
#[test]
fn forward_batch_scored_scores_what_the_host_scores() {
    use fp4forge_engine::{token_logprob, LogprobSpec, Output, Sampler, SamplingParams};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tiny_laguna(tmp.path(), "bf16", false);
    let model = Model::load(&dir, ModelOptions::new().kv_dtype(KvDtype::F32)).unwrap();
    let vocab = model.info().vocab_size;
    let prompt = token_ids(9, vocab as u32, 400);
    let params = SamplingParams {
        temperature: 0.7,
        top_k: 0,
        top_p: 1.0,
        seed: 5,
    };
    // the reference: the same passes, logits downloaded and scored on the host
    let mut ref_prompt = model.new_session().unwrap();
    let all = ref_prompt.prefill_all(&prompt).unwrap();
    let mut ref_dec = model.new_session().unwrap();
    ref_dec.prefill(&prompt[..4]).unwrap();
    let mut ref_sampler = Sampler::new(params);
    let dec_logits = ref_dec.step(prompt[4]).unwrap();

    let mut a = model.new_session().unwrap();
    let mut b = model.new_session().unwrap();
    b.prefill(&prompt[..4]).unwrap();
    let mut sampler = Sampler::new(params);
    let mut refs = [&mut a, &mut b];
    let out = model
        .forward_batch_scored(
            &mut refs,
            &[&prompt[..], &prompt[4..5]],
            &[Want::All, Want::Last],
            &mut [None, Some(&mut sampler)],
            &[
                Some(LogprobSpec {
                    targets: &prompt[1..],
                    top: 5,
                }),
                Some(LogprobSpec {
                    targets: &[],
                    top: 3,
                }),
            ],
        )
        .unwrap();
    let Output::Scored {
        token: None,
        logprobs,
        logits: Some(last),
    } = &out[0]
    else {
        panic!("the prompt's scores and last logits: {:?}", out[0]);
    };
    assert_eq!(logprobs.len(), prompt.len() - 1);
    assert_eq!(last.rows, 1);
    assert!(rel_diff(&last.data, all.row(prompt.len() - 1)) <= TOL);
    for (r, lp) in logprobs.iter().enumerate() {
        let want = token_logprob(all.row(r), prompt[r + 1], 5);
        assert_eq!(lp.top.len(), 5);
        assert_eq!(lp.rank, want.rank, "row {r}");
        assert!((lp.logprob - want.logprob).abs() <= 1e-4, "row {r}");
        let ids = |t: &[(u32, f32)]| t.iter().map(|p| p.0).collect::<Vec<_>>();
        assert_eq!(ids(&lp.top), ids(&want.top), "row {r}");
    }
    let picked = ref_sampler.sample(&dec_logits);
    let want = token_logprob(&dec_logits, picked, 3);
    match &out[1] {
        Output::Scored {
            token: Some(t),
            logprobs,
            logits: None,
        } => {
            assert_eq!(*t, picked);
            assert_eq!(logprobs.len(), 1);
            assert_eq!(logprobs[0].rank, want.rank);
            assert!((logprobs[0].logprob - want.logprob).abs() <= 1e-4);
        }
        o => panic!("the pick and its score: {o:?}"),
    }
}
