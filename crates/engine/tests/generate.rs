//! The generation loop: greedy generation equals argmax stepping, stop tokens end it, seeded
//! sampling is reproducible, the context limit stops it cleanly; stats are filled in.

mod common;

use common::{argmax, tiny_laguna, token_ids};
use fp4forge_engine::{GenerateOptions, Model, ModelOptions, SamplingParams, StopReason};

#[test]
fn greedy_generation_matches_manual_argmax_and_stops() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tiny_laguna(tmp.path(), "m", false);
    let m = Model::load(&dir, ModelOptions::new()).unwrap();
    let prompt = token_ids(7, m.info().vocab_size as u32, 1);

    let mut manual = Vec::new();
    let mut s = m.new_session().unwrap();
    let mut logits = s.prefill(&prompt).unwrap();
    for _ in 0..12 {
        let t = argmax(&logits) as u32;
        manual.push(t);
        logits = s.step(t).unwrap();
    }

    let opts = GenerateOptions {
        max_tokens: 12,
        ..Default::default()
    };
    let mut streamed = Vec::new();
    let g = m
        .new_session()
        .unwrap()
        .generate(&prompt, &opts, |t| {
            streamed.push(t);
            true
        })
        .unwrap();
    assert_eq!(g.tokens, manual);
    assert_eq!(streamed, manual);
    assert_eq!(g.stop, StopReason::MaxTokens);
    assert_eq!(g.stats.prompt_tokens, 7);
    assert_eq!(g.stats.decode_steps, 11);
    assert!(g.stats.decode_tokens_per_second() > 0.0);

    // A stop token ends it before it is emitted.
    let stop = manual[4];
    let first = manual.iter().position(|&t| t == stop).unwrap();
    let opts = GenerateOptions {
        max_tokens: 12,
        stop_tokens: vec![stop],
        ..Default::default()
    };
    let g = m
        .new_session()
        .unwrap()
        .generate(&prompt, &opts, |_| true)
        .unwrap();
    assert_eq!(g.tokens, manual[..first]);
    assert_eq!(g.stop, StopReason::StopToken(stop));

    // The callback can stop it.
    let g = m
        .new_session()
        .unwrap()
        .generate(&prompt, &opts, |_| false)
        .unwrap();
    assert_eq!(g.tokens.len(), 1);
    assert_eq!(g.stop, StopReason::Callback);
}

#[test]
fn sampling_is_seeded_and_context_full_stops() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tiny_laguna(tmp.path(), "m", false);
    let m = Model::load(&dir, ModelOptions::new().max_context(20)).unwrap();
    let prompt = token_ids(5, m.info().vocab_size as u32, 2);
    let opts = GenerateOptions {
        max_tokens: 100,
        sampling: SamplingParams {
            temperature: 0.9,
            top_k: 20,
            top_p: 0.95,
            seed: 42,
        },
        stop_tokens: vec![],
    };
    let a = m
        .new_session()
        .unwrap()
        .generate(&prompt, &opts, |_| true)
        .unwrap();
    let b = m
        .new_session()
        .unwrap()
        .generate(&prompt, &opts, |_| true)
        .unwrap();
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.stop, StopReason::ContextFull);
    assert_eq!(a.tokens.len(), 20 - 5 + 1);
}
