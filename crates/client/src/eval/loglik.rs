//! Reading log-likelihoods out of an echoed `/v1/completions` response.
//!
//! The request is `prompt = context + continuation, echo: true, max_tokens: 0, logprobs: N`;
//! the response's `logprobs` holds every prompt token with its text, its logprob given the tokens
//! before it, and its character offset `text_offset` into the echoed text. The continuation's
//! tokens are found by character offset, as lm-evaluation-harness's OpenAI backend did before it
//! tokenized client-side:
//!
//! * the boundary is the context's length in characters (Unicode scalar values, Python's
//!   indexing, which vLLM's offsets use);
//! * leading tokens that are not prompt text (a BOS rendered as `<s>`, at most two) shift every
//!   offset: the prompt starts at the offset of the first token the prompt starts with;
//! * the continuation starts at the first token whose offset is at or past the boundary; if the
//!   boundary falls inside a token (the tokenizer merged the context's last characters with the
//!   continuation's first), that straddling token is counted as the continuation's first, and the
//!   result says so;
//! * servers render a token that holds part of a multi-byte character as U+FFFD, so offsets
//!   accumulated from token texts drift; when such tokens occur, token starts are recomputed by
//!   matching the token texts against the prompt (a run of partial tokens spans up to where the
//!   next whole token's text appears), falling back to `text_offset` if the texts do not spell
//!   the prompt;
//! * with `max_tokens: 1` (servers that refuse 0) the generated token(s) at the end are dropped.
//!
//! With a tokenizer, [`encode_pair`] splits the ids as lm-evaluation-harness does and the
//! continuation is simply the last `k` prompt tokens (no offsets involved).

use crate::api::CompletionLogprobs;

/// log p(continuation | context) as one echoed request measured it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Loglikelihood {
    /// Sum of the continuation tokens' logprobs (natural log).
    pub logprob: f64,
    /// Number of continuation tokens.
    pub tokens: usize,
    /// The context/continuation boundary fell inside a token.
    pub straddled: bool,
}

/// Where the continuation starts: `(token index, straddled)` for character `boundary` of the
/// echoed text, given each token's start `offsets` (ascending). `None` if no token reaches it.
pub fn continuation_start(offsets: &[usize], boundary: usize) -> Option<(usize, bool)> {
    let first_at_or_after = offsets.iter().position(|&o| o >= boundary);
    match first_at_or_after {
        Some(i) if offsets[i] == boundary => Some((i, false)),
        // the boundary is inside token i−1
        Some(i) if i > 0 => Some((i - 1, true)),
        Some(_) => None,
        None if !offsets.is_empty() => Some((offsets.len() - 1, true)),
        None => None,
    }
}

/// Number of characters (Unicode scalar values) of `s`.
pub fn char_len(s: &str) -> usize {
    s.chars().count()
}

/// The prompt's part of an echoed logprobs object: all entries but the last `generated`.
pub fn prompt_entries(lp: &CompletionLogprobs, generated: usize) -> usize {
    lp.tokens
        .len()
        .min(lp.token_logprobs.len())
        .min(lp.text_offset.len())
        .saturating_sub(generated)
}

/// Leading tokens that are not prompt text: the smallest `k ≤ 2` such that the prompt starts
/// with token `k`'s (non-empty, whole-character) text; 0 when there is none.
fn prefix_tokens(tokens: &[String], prompt: &str) -> usize {
    (0..tokens.len().min(3))
        .find(|&k| {
            let t = &tokens[k];
            !t.is_empty() && !t.contains('\u{FFFD}') && prompt.starts_with(t.as_str())
        })
        .unwrap_or(0)
}

/// Character start of each token within `prompt`, from the token texts alone (prefix tokens at
/// 0); runs of tokens holding U+FFFD end where the next whole token's text occurs. `None` if the
/// texts do not spell the prompt.
fn align(tokens: &[String], prompt: &[char], prefix: usize) -> Option<Vec<usize>> {
    let mut starts = vec![0; prefix];
    let (mut pos, mut i) = (0, prefix);
    while i < tokens.len() {
        if !tokens[i].contains('\u{FFFD}') {
            let t: Vec<char> = tokens[i].chars().collect();
            if !prompt[pos..].starts_with(&t) {
                return None;
            }
            starts.push(pos);
            pos += t.len();
            i += 1;
            continue;
        }
        let mut j = i;
        while j < tokens.len() && tokens[j].contains('\u{FFFD}') {
            j += 1;
        }
        let end = match tokens.get(j) {
            Some(next) => {
                let next: Vec<char> = next.chars().collect();
                (pos + 1..=prompt.len()).find(|&p| prompt[p..].starts_with(&next))?
            }
            None => prompt.len(),
        };
        starts.extend(std::iter::repeat_n(pos, j - i));
        pos = end;
        i = j;
    }
    (pos == prompt.len()).then_some(starts)
}

/// log p(continuation | context) from the echoed logprobs of `context + continuation`, with
/// `generated` generated tokens at the end to ignore. Errors say which field is unusable.
pub fn continuation_loglikelihood(
    lp: &CompletionLogprobs,
    context: &str,
    continuation: &str,
    generated: usize,
) -> Result<Loglikelihood, String> {
    let n = prompt_entries(lp, generated);
    if n == 0 {
        return Err("logprobs.tokens: empty (does the server support echo with logprobs?)".into());
    }
    let prompt = format!("{context}{continuation}");
    let tokens = &lp.tokens[..n];
    let prefix = prefix_tokens(tokens, &prompt);
    let ctx = char_len(context);
    let by_offset = || {
        let boundary = lp.text_offset[prefix] + ctx;
        continuation_start(&lp.text_offset[..n], boundary)
            .ok_or_else(|| format!("logprobs.text_offset: no token at character {boundary}"))
    };
    let (start, straddled) = if tokens.iter().any(|t| t.contains('\u{FFFD}')) {
        let chars: Vec<char> = prompt.chars().collect();
        match align(tokens, &chars, prefix) {
            Some(starts) => continuation_start(&starts, ctx)
                .ok_or_else(|| format!("logprobs.tokens: no token at character {ctx}"))?,
            None => by_offset()?,
        }
    } else {
        by_offset()?
    };
    sum_logprobs(&lp.token_logprobs, start, n, straddled)
}

fn sum_logprobs(
    logprobs: &[Option<f64>],
    start: usize,
    end: usize,
    straddled: bool,
) -> Result<Loglikelihood, String> {
    let mut sum = 0.0;
    for (i, v) in logprobs[start..end].iter().enumerate() {
        match v {
            Some(x) => sum += x,
            None => {
                return Err(format!(
                "logprobs.token_logprobs[{}]: null inside the continuation (is the context empty?)",
                start + i
            ))
            }
        }
    }
    Ok(Loglikelihood {
        logprob: sum,
        tokens: end - start,
        straddled,
    })
}

/// log p(continuation | context) when the prompt was sent as token ids: the last
/// `continuation_tokens` prompt entries.
pub fn last_tokens_loglikelihood(
    lp: &CompletionLogprobs,
    continuation_tokens: usize,
    generated: usize,
) -> Result<Loglikelihood, String> {
    let n = prompt_entries(lp, generated);
    if continuation_tokens == 0 || continuation_tokens > n {
        return Err(format!(
            "logprobs.token_logprobs: {n} prompt entries, continuation of {continuation_tokens} tokens"
        ));
    }
    sum_logprobs(&lp.token_logprobs, n - continuation_tokens, n, false)
}

/// lm-evaluation-harness's `_encode_pair`: trailing whitespace of the context moves to the
/// continuation, `context + continuation` is encoded whole, and the continuation is what follows
/// the context's own encoding. Returns `(context ids, continuation ids)` (no special tokens).
pub fn encode_pair(
    tokenizer: &tokenizers::Tokenizer,
    context: &str,
    continuation: &str,
) -> Result<(Vec<u32>, Vec<u32>), String> {
    let trimmed = context.trim_end();
    let (context, continuation) = (
        trimmed,
        format!("{}{continuation}", &context[trimmed.len()..]),
    );
    let encode = |s: &str| -> Result<Vec<u32>, String> {
        tokenizer
            .encode(s, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| e.to_string())
    };
    let whole = encode(&format!("{context}{continuation}"))?;
    let ctx_len = encode(context)?.len().min(whole.len());
    Ok((whole[..ctx_len].to_vec(), whole[ctx_len..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A logprobs object for `tokens`, offsets accumulated from their lengths, logprob −(i+1).
    fn lp(tokens: &[&str]) -> CompletionLogprobs {
        let mut off = 0;
        let mut text_offset = Vec::new();
        for t in tokens {
            text_offset.push(off);
            off += char_len(t);
        }
        CompletionLogprobs {
            tokens: tokens.iter().map(|s| s.to_string()).collect(),
            token_logprobs: (0..tokens.len())
                .map(|i| {
                    if i == 0 {
                        None
                    } else {
                        Some(-(i as f64 + 1.0))
                    }
                })
                .collect(),
            top_logprobs: None,
            text_offset,
        }
    }

    #[test]
    fn start_at_a_clean_boundary_and_inside_a_token() {
        let off = [0, 3, 7, 10];
        assert_eq!(continuation_start(&off, 7), Some((2, false)));
        assert_eq!(continuation_start(&off, 8), Some((2, true)));
        assert_eq!(continuation_start(&off, 12), Some((3, true)));
        assert_eq!(continuation_start(&off, 0), Some((0, false)));
        assert_eq!(continuation_start(&[], 0), None);
        // tokens with empty text share an offset: the first of them starts the continuation
        assert_eq!(continuation_start(&[0, 4, 4, 5], 4), Some((1, false)));
    }

    #[test]
    fn sums_the_continuation_tokens() {
        // "Question: 2+2?\nAnswer:" + " four"
        let l = lp(&[
            "Question", ":", " 2", "+", "2", "?\n", "Answer", ":", " four",
        ]);
        let r = continuation_loglikelihood(&l, "Question: 2+2?\nAnswer:", " four", 0).unwrap();
        assert_eq!(
            r,
            Loglikelihood {
                logprob: -9.0,
                tokens: 1,
                straddled: false
            }
        );
        let r = continuation_loglikelihood(&l, "Question: 2+2?\nAnswer", ": four", 0).unwrap();
        assert_eq!(
            r,
            Loglikelihood {
                logprob: -17.0,
                tokens: 2,
                straddled: false
            }
        );
    }

    #[test]
    fn offsets_count_characters_not_bytes() {
        let l = lp(&["Café", " é", "t", "é"]);
        let r = continuation_loglikelihood(&l, "Café é", "té", 0).unwrap();
        assert_eq!((r.logprob, r.tokens), (-7.0, 2));
    }

    #[test]
    fn a_bos_prefix_shifts_offsets() {
        let l = lp(&["<s>", "The", " cat", " sat"]);
        let r = continuation_loglikelihood(&l, "The cat", " sat", 0).unwrap();
        assert_eq!((r.logprob, r.tokens, r.straddled), (-4.0, 1, false));
    }

    #[test]
    fn a_straddling_token_counts_as_continuation() {
        // context "ab", continuation "cd", tokenised "a" "bc" "d"
        let l = lp(&["a", "bc", "d"]);
        let r = continuation_loglikelihood(&l, "ab", "cd", 0).unwrap();
        assert_eq!((r.logprob, r.tokens, r.straddled), (-5.0, 2, true));
    }

    #[test]
    fn generated_tokens_are_dropped() {
        let l = lp(&["The", " cat", " sat", " down"]);
        let r = continuation_loglikelihood(&l, "The cat", " sat", 1).unwrap();
        assert_eq!((r.logprob, r.tokens), (-3.0, 1));
    }

    #[test]
    fn partial_character_tokens_are_realigned() {
        // "é" split into two byte tokens rendered "�": offsets accumulated from texts drift by 1
        let l = lp(&["The", " caf", "\u{FFFD}", "\u{FFFD}", " is", " good"]);
        let r = continuation_loglikelihood(&l, "The café is", " good", 0).unwrap();
        assert_eq!((r.logprob, r.tokens, r.straddled), (-6.0, 1, false));
        let r = continuation_loglikelihood(&l, "The café", " is good", 0).unwrap();
        assert_eq!((r.logprob, r.tokens, r.straddled), (-11.0, 2, false));
        let r = continuation_loglikelihood(&l, "The", " café is good", 0).unwrap();
        assert_eq!((r.logprob, r.tokens), (-20.0, 5));
        // with a BOS in front as well
        let l = lp(&["<s>", "The", " caf", "\u{FFFD}", "\u{FFFD}", " is"]);
        let r = continuation_loglikelihood(&l, "The café", " is", 0).unwrap();
        assert_eq!((r.logprob, r.tokens), (-6.0, 1));
    }

    #[test]
    fn pairs_are_split_as_lm_eval_does() {
        let json = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
            "normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
            "model":{"type":"WordLevel","vocab":{"[UNK]":0,"the":1,"cat":2,"sat":3},"unk_token":"[UNK]"}}"#;
        let tok: tokenizers::Tokenizer = json.parse().unwrap();
        assert_eq!(
            encode_pair(&tok, "the cat", " sat").unwrap(),
            (vec![1, 2], vec![3])
        );
        // trailing context whitespace moves to the continuation
        assert_eq!(
            encode_pair(&tok, "the cat  ", "sat the").unwrap(),
            (vec![1, 2], vec![3, 1])
        );
    }

    #[test]
    fn token_id_prompts_take_the_last_tokens() {
        let l = lp(&["a", "b", "c", "d"]);
        assert_eq!(last_tokens_loglikelihood(&l, 2, 0).unwrap().logprob, -7.0);
        assert_eq!(last_tokens_loglikelihood(&l, 2, 1).unwrap().logprob, -5.0);
        assert!(last_tokens_loglikelihood(&l, 4, 0).is_err()); // the first has no logprob
        assert!(last_tokens_loglikelihood(&l, 5, 0).is_err());
    }

    #[test]
    fn an_empty_context_cannot_be_scored() {
        let l = lp(&["The", " cat"]);
        assert!(continuation_loglikelihood(&l, "", "The cat", 0).is_err());
        assert!(continuation_loglikelihood(&CompletionLogprobs::default(), "a", "b", 0).is_err());
    }
}
