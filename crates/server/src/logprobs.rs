//! Prompt log-probabilities on the wire (the engine computes them:
//! [`fp4forge_engine::logprobs`]).

use std::collections::BTreeMap;

use fp4forge_api::{PromptLogprob, PromptLogprobs};
use fp4forge_engine::{TextCodec, TokenLogprob};

/// vLLM's `prompt_logprobs` of `prompt` from its per-position logprobs (`None` where there are
/// none, as for the first token): each position's `top` most likely tokens (ranks 1..) and the
/// prompt's own token.
pub(crate) fn prompt_logprobs_wire(
    codec: &TextCodec,
    prompt: &[u32],
    logprobs: &[Option<TokenLogprob>],
    top: usize,
) -> PromptLogprobs {
    let entry = |id: u32, logprob: f32, rank: u32| PromptLogprob {
        logprob: f64::from(logprob),
        rank: Some(u64::from(rank)),
        decoded_token: codec.decode(&[id], true).ok(),
    };
    prompt
        .iter()
        .zip(logprobs)
        .map(|(&id, lp)| {
            let lp = lp.as_ref()?;
            let mut map: BTreeMap<u32, PromptLogprob> = lp
                .top
                .iter()
                .take(top)
                .enumerate()
                .map(|(r, &(t, v))| (t, entry(t, v, r as u32 + 1)))
                .collect();
            map.insert(id, entry(id, lp.logprob, lp.rank));
            Some(map)
        })
        .collect()
}
