//! WikiText-2 perplexity over fixed windows, and the per-token KL divergence between two
//! endpoints.
//!
//! **Windows.** With a tokenizer (`--tokenizer`), the whole file is tokenized once (no special
//! tokens) and cut into windows of `window` token ids every `stride` tokens, sent as token-id
//! prompts; each window scores only the tokens no earlier window scored (the first window all but
//! its first token), the sliding-window perplexity of the Hugging Face guide (`stride = window`:
//! disjoint windows, llama.cpp-style). Without a tokenizer the text is cut at whitespace into
//! chunks of about `4 × window` characters, sent as text, and every token the server returns a
//! logprob for is scored; the token count is then the server's.
//!
//! **Perplexity** = exp(Σ NLL / Σ tokens) over all windows; its σ comes from the ratio estimate
//! of the per-token NLL (one sample per window).
//!
//! **KL divergence** KL(A‖B) = Σ_v p_A(v) ln(p_A(v)/p_B(v)) per position, averaged over scored
//! tokens, where A is the first endpoint and B the `--compare` one. Servers return only the top-N
//! logprobs per position (`logprobs: N`, vLLM allows up to 20 by default), so it is computed on a
//! coarsened vocabulary: the union U of both top-N sets plus one "rest" bucket. For a token of U
//! missing from an endpoint's list its probability is estimated as
//! `min(smallest listed probability, rest mass / (missing + 1))`, the rest bucket gets what
//! remains of `1 − Σ listed`, and every probability is floored at 1e-10. Coarsening can only lower
//! KL (data-processing inequality), so with exact estimates this is a lower bound of the true KL;
//! tokens outside both top-N sets carry little mass when N = 20 and the models are close. It is
//! exact when the lists cover the vocabulary. Top-1 agreement (same most likely token) is
//! reported beside it.

use std::path::{Path, PathBuf};

use super::{MetricKind, MetricSpec, Request, Response, Task, TokenScores};
use crate::api::Prompt;
use crate::bench::load_tokenizer;
use crate::error::{ClientError, Result};
use crate::stats::Sample;

/// The default `--data` for `--task wikitext`, relative to the project root.
pub const DEFAULT_WIKITEXT: &str = "../shared/data/wikitext-2-raw-test.txt";

/// Probability floor in the KL estimate.
pub const KL_FLOOR: f64 = 1e-10;

/// One window.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    /// The prompt.
    pub prompt: Prompt,
    /// Index of the first token to score (tokens before it are context only).
    pub score_from: usize,
}

/// Token-id windows over `len` tokens: `(begin, end, score_from)` triples, see the module docs.
pub fn token_windows(len: usize, window: usize, stride: usize) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    let mut prev_end = 0;
    let mut begin = 0;
    while begin < len {
        let end = (begin + window).min(len);
        let target = end - prev_end;
        let score_from = ((end - begin) - target).max(1);
        if end - begin >= 2 && score_from < end - begin {
            out.push((begin, end, score_from));
        }
        prev_end = end;
        if end == len {
            break;
        }
        begin += stride;
    }
    out
}

/// Text chunks of about `chars` characters, cut after whitespace (each chunk keeps its trailing
/// whitespace, so the chunks concatenate back to `text`).
pub fn text_chunks(text: &str, chars: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let Some((cut, _)) = rest.char_indices().nth(chars) else {
            out.push(rest);
            break;
        };
        let end = rest[cut..]
            .find(char::is_whitespace)
            .map(|i| {
                let ws = cut + i;
                ws + rest[ws..].chars().next().map_or(0, char::len_utf8)
            })
            .unwrap_or(rest.len());
        out.push(&rest[..end]);
        rest = &rest[end..];
    }
    out
}

/// KL(P‖Q) in nats from the top-N lists of two distributions (see the module docs).
pub fn kl_top_n(p: &[(String, f64)], q: &[(String, f64)]) -> f64 {
    let mut union: Vec<&str> = p.iter().chain(q).map(|(t, _)| t.as_str()).collect();
    union.sort_unstable();
    union.dedup();
    let complete = |list: &[(String, f64)]| -> (Vec<f64>, f64) {
        let probs: Vec<(&str, f64)> = list.iter().map(|(t, lp)| (t.as_str(), lp.exp())).collect();
        let listed: f64 = probs.iter().map(|x| x.1).sum();
        let rest = (1.0 - listed).max(0.0);
        let smallest = probs.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
        let missing = union
            .iter()
            .filter(|u| !probs.iter().any(|(t, _)| t == *u))
            .count();
        let estimate = smallest.min(rest / (missing + 1) as f64);
        let dist: Vec<f64> = union
            .iter()
            .map(|u| {
                probs
                    .iter()
                    .find(|(t, _)| t == u)
                    .map_or(estimate, |x| x.1)
                    .max(KL_FLOOR)
            })
            .collect();
        let other = (rest - estimate * missing as f64).max(KL_FLOOR);
        (dist, other)
    };
    let (pd, po) = complete(p);
    let (qd, qo) = complete(q);
    let mut kl: f64 = pd.iter().zip(&qd).map(|(a, b)| a * (a / b).ln()).sum();
    kl += po * (po / qo).ln();
    kl.max(0.0)
}

/// The most likely token of a top-N list (ties: the lexicographically smallest token, so the
/// answer does not depend on the server's JSON key order).
fn top1(list: &[(String, f64)]) -> Option<&str> {
    list.iter()
        .max_by(|a, b| a.1.total_cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
        .map(|(t, _)| t.as_str())
}

/// Perplexity (and KL with two endpoints) over fixed windows of a text file.
#[derive(Debug, Clone)]
pub struct Wikitext {
    source: String,
    windows: Vec<Window>,
    top_n: u32,
}

impl Wikitext {
    /// A task over given windows, asking for `top_n` alternatives per position.
    pub fn new(source: impl Into<String>, windows: Vec<Window>, top_n: u32) -> Self {
        Self {
            source: source.into(),
            windows,
            top_n,
        }
    }

    /// The windows.
    pub fn windows(&self) -> &[Window] {
        &self.windows
    }

    /// Windows over the text file `path` (see the module docs); `tokenizer` is a tokenizer.json
    /// or a directory holding one.
    pub fn from_file(
        path: &Path,
        tokenizer: Option<&Path>,
        window: usize,
        stride: usize,
        top_n: u32,
    ) -> Result<Self> {
        if window < 2 {
            return Err(ClientError::config("--window", "must be at least 2 tokens"));
        }
        if stride == 0 || stride > window {
            return Err(ClientError::config("--stride", "must be in 1..=window"));
        }
        let text = std::fs::read_to_string(path).map_err(|e| ClientError::io(path, e))?;
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        match tokenizer {
            Some(tok) => {
                let (tokenizer, file): (_, PathBuf) = load_tokenizer(tok)?;
                let enc =
                    tokenizer
                        .encode(text.as_str(), false)
                        .map_err(|e| ClientError::Tokenizer {
                            path: file.clone(),
                            message: e.to_string(),
                        })?;
                let ids = enc.get_ids();
                let windows: Vec<Window> = token_windows(ids.len(), window, stride)
                    .into_iter()
                    .map(|(b, e, s)| Window {
                        prompt: Prompt::Tokens(ids[b..e].to_vec()),
                        score_from: s,
                    })
                    .collect();
                Ok(Self::new(
                    format!(
                        "{name}: {} tokens ({}), {} windows of {window} tokens, stride {stride}",
                        ids.len(),
                        file.display(),
                        windows.len()
                    ),
                    windows,
                    top_n,
                ))
            }
            None => {
                if stride != window {
                    return Err(ClientError::config(
                        "--stride",
                        "overlapping windows need --tokenizer (text windows are disjoint)",
                    ));
                }
                let windows: Vec<Window> = text_chunks(&text, 4 * window)
                    .into_iter()
                    .filter(|c| !c.trim().is_empty())
                    .map(|c| Window {
                        prompt: Prompt::Text(c.to_string()),
                        score_from: 0,
                    })
                    .collect();
                Ok(Self::new(
                    format!(
                        "{name}: {} text windows of ~{} characters (~{window} tokens; no --tokenizer, token counts are the server's)",
                        windows.len(),
                        4 * window
                    ),
                    windows,
                    top_n,
                ))
            }
        }
    }

    fn scores<'a>(
        &self,
        item: usize,
        responses: &'a [Response],
    ) -> std::result::Result<&'a TokenScores, String> {
        match responses {
            [Response::Tokens(t)] => Ok(t),
            _ => Err(format!("window {item}: expected one token-score response")),
        }
    }
}

impl Task for Wikitext {
    fn name(&self) -> &str {
        "wikitext"
    }

    fn source(&self) -> String {
        self.source.clone()
    }

    fn len(&self) -> usize {
        self.windows.len()
    }

    fn metrics(&self) -> Vec<MetricSpec> {
        vec![MetricSpec::new("nll", MetricKind::Nll)]
    }

    fn requests(&self, item: usize) -> Vec<Request> {
        vec![Request::Score {
            prompt: self.windows[item].prompt.clone(),
            top_n: self.top_n,
        }]
    }

    fn score(
        &self,
        item: usize,
        responses: &[Response],
    ) -> std::result::Result<Vec<Sample>, String> {
        let t = self.scores(item, responses)?;
        let from = self.windows[item].score_from;
        let (mut nll, mut n) = (0.0, 0usize);
        for lp in t.logprobs.iter().skip(from).flatten() {
            nll -= lp;
            n += 1;
        }
        if n == 0 {
            return Err(format!("window {item}: no token logprobs returned"));
        }
        Ok(vec![Sample {
            num: nll,
            den: n as f64,
        }])
    }

    fn paired_metrics(&self) -> Vec<MetricSpec> {
        vec![
            MetricSpec::new("kl", MetricKind::Mean),
            MetricSpec::new("top1_agreement", MetricKind::Accuracy),
        ]
    }

    fn score_pair(
        &self,
        item: usize,
        a: &[Response],
        b: &[Response],
    ) -> std::result::Result<Vec<Sample>, String> {
        let (ta, tb) = (self.scores(item, a)?, self.scores(item, b)?);
        if ta.tokens != tb.tokens {
            return Err(format!(
                "window {item}: the endpoints tokenized it differently ({} vs {} tokens); KL needs the same tokenizer",
                ta.tokens.len(),
                tb.tokens.len()
            ));
        }
        let from = self.windows[item].score_from;
        let (mut kl, mut agree, mut n) = (0.0, 0.0, 0usize);
        for i in from..ta.tokens.len() {
            let (Some(Some(pa)), Some(Some(pb))) = (ta.top.get(i), tb.top.get(i)) else {
                continue;
            };
            if pa.is_empty() || pb.is_empty() {
                continue;
            }
            kl += kl_top_n(pa, pb);
            if top1(pa) == top1(pb) {
                agree += 1.0;
            }
            n += 1;
        }
        if n == 0 {
            return Err(format!(
                "window {item}: no top_logprobs returned (ask for --top-logprobs > 0)"
            ));
        }
        Ok(vec![
            Sample {
                num: kl,
                den: n as f64,
            },
            Sample {
                num: agree,
                den: n as f64,
            },
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dist(v: &[(&str, f64)]) -> Vec<(String, f64)> {
        v.iter().map(|(t, p)| (t.to_string(), p.ln())).collect()
    }

    #[test]
    fn disjoint_and_sliding_windows() {
        assert_eq!(
            token_windows(10, 4, 4),
            vec![(0, 4, 1), (4, 8, 1), (8, 10, 1)]
        );
        // stride 2: each later window scores only its last 2 tokens
        assert_eq!(
            token_windows(8, 4, 2),
            vec![(0, 4, 1), (2, 6, 2), (4, 8, 2)]
        );
        // overlapping windows score every token after the first exactly once
        let w = token_windows(100, 16, 8);
        let scored: usize = w.iter().map(|(b, e, s)| e - b - s).sum();
        assert_eq!(scored, 99);
        assert!(token_windows(1, 4, 4).is_empty());
    }

    #[test]
    fn text_chunks_cut_after_whitespace_and_rejoin() {
        let text = "alpha beta gamma delta epsilon\nzeta";
        let c = text_chunks(text, 8);
        assert_eq!(c.concat(), text);
        assert_eq!(c[0], "alpha beta ");
        assert!(c.iter().all(|s| !s.is_empty()));
        assert_eq!(text_chunks("ééé", 10), vec!["ééé"]);
    }

    #[test]
    fn kl_is_exact_on_full_lists() {
        let p: [(&str, f64); 3] = [("a", 0.5), ("b", 0.3), ("c", 0.2)];
        let q: [(&str, f64); 3] = [("a", 0.2), ("b", 0.3), ("c", 0.5)];
        let exact: f64 = p
            .iter()
            .zip(&q)
            .map(|((_, x), (_, y))| x * (x / y).ln())
            .sum();
        let got = kl_top_n(&dist(&p), &dist(&q));
        assert!((got - exact).abs() < 1e-6, "{got} vs {exact}");
        assert!(kl_top_n(&dist(&p), &dist(&p)).abs() < 1e-9);
    }

    #[test]
    fn kl_estimates_missing_tokens_from_the_rest_mass() {
        // P lists a, b (0.9 total); Q lists a, c. Coarsened: U = {a, b, c} + rest.
        let p = dist(&[("a", 0.6), ("b", 0.3)]);
        let q = dist(&[("a", 0.6), ("c", 0.3)]);
        // P: c missing -> min(0.3, 0.1/2) = 0.05, rest 0.05; Q: b -> 0.05, rest 0.05
        let pd: [f64; 4] = [0.6, 0.3, 0.05, 0.05];
        let qd: [f64; 4] = [0.6, 0.05, 0.3, 0.05];
        let exact: f64 = pd.iter().zip(&qd).map(|(x, y)| x * (x / y).ln()).sum();
        assert!((kl_top_n(&p, &q) - exact).abs() < 1e-9);
        assert!(kl_top_n(&p, &q) > 0.0);
    }

    #[test]
    fn nll_and_kl_scoring() {
        let t = Wikitext::new(
            "t",
            vec![Window {
                prompt: Prompt::Tokens(vec![1, 2, 3]),
                score_from: 1,
            }],
            2,
        );
        let scores = |lps: [f64; 2], tops: [[f64; 2]; 2]| TokenScores {
            tokens: vec!["x".into(), "y".into(), "z".into()],
            logprobs: vec![None, Some(lps[0]), Some(lps[1])],
            top: vec![
                None,
                Some(vec![("y".into(), tops[0][0]), ("q".into(), tops[0][1])]),
                Some(vec![("z".into(), tops[1][0]), ("q".into(), tops[1][1])]),
            ],
        };
        let half = 0.5f64.ln();
        let a = [Response::Tokens(scores(
            [half, half],
            [[half, half], [half, half]],
        ))];
        assert_eq!(
            t.score(0, &a).unwrap(),
            vec![Sample {
                num: 2.0 * 0.5f64.ln().abs(),
                den: 2.0
            }]
        );
        let pair = t.score_pair(0, &a, &a).unwrap();
        assert!(pair[0].num.abs() < 1e-9);
        assert_eq!(pair[1], Sample { num: 2.0, den: 2.0 });
    }
}
