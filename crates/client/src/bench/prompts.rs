//! Benchmark prompts of a wanted length: exactly N token ids with the model's `tokenizer.json`
//! (tokenized filler prose, or ids drawn at random from its vocabulary), or text sized by a
//! calibration against the server's own token counts.
//!
//! Every prompt is seeded and every request gets its own seed, so no two requests share a prefix
//! and a server's prefix cache cannot flatter prefill.

use std::path::{Path, PathBuf};

use tokenizers::Tokenizer;

use crate::api::Prompt;
use crate::error::{ClientError, Result};
use crate::stats::SplitMix64;

/// Common English words: filler that tokenizes like ordinary prose.
const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "had",
    "they",
    "you",
    "were",
    "their",
    "one",
    "all",
    "we",
    "can",
    "her",
    "has",
    "there",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "time",
    "people",
    "year",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "student",
    "group",
    "country",
    "problem",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "government",
    "number",
    "night",
    "point",
    "home",
    "water",
    "room",
    "mother",
    "area",
    "money",
    "story",
    "fact",
    "month",
    "lot",
    "right",
    "study",
    "book",
    "eye",
    "job",
    "word",
    "business",
    "issue",
    "side",
    "kind",
    "head",
    "house",
    "service",
    "friend",
    "father",
    "power",
    "hour",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "city",
    "community",
    "name",
    "president",
    "team",
    "minute",
    "idea",
    "kid",
    "body",
    "information",
    "back",
    "parent",
    "face",
    "others",
    "level",
    "office",
    "door",
    "health",
    "person",
    "art",
    "war",
    "history",
    "party",
    "result",
    "change",
    "morning",
    "reason",
    "research",
    "girl",
    "guy",
    "moment",
    "air",
    "teacher",
    "force",
    "education",
    "river",
    "mountain",
    "small",
    "large",
    "new",
    "old",
    "good",
    "great",
    "little",
    "own",
    "other",
    "long",
    "high",
    "different",
    "early",
    "important",
    "public",
    "bad",
    "same",
    "able",
    "young",
    "few",
    "political",
    "national",
    "late",
    "make",
    "know",
    "take",
    "see",
    "come",
    "think",
    "look",
    "want",
    "give",
    "use",
    "find",
    "tell",
    "ask",
    "seem",
    "feel",
    "try",
    "leave",
    "call",
    "keep",
    "begin",
    "help",
    "talk",
    "turn",
    "start",
    "show",
    "hear",
    "play",
    "run",
    "move",
    "like",
    "live",
    "believe",
    "hold",
    "bring",
    "happen",
    "write",
    "provide",
    "sit",
    "stand",
    "lose",
    "pay",
    "meet",
    "include",
    "continue",
    "learn",
];

/// `words` words of seeded filler prose (sentences of 8–20 words).
pub fn filler_text(words: usize, seed: u64) -> String {
    let mut rng = SplitMix64::new(seed);
    let mut out = String::with_capacity(words * 7);
    let mut left_in_sentence = 0;
    for i in 0..words {
        if left_in_sentence == 0 {
            left_in_sentence = 8 + rng.below(13);
            if i > 0 {
                out.push_str(". ");
            }
            let w = WORDS[rng.below(WORDS.len())];
            let mut c = w.chars();
            if let Some(first) = c.next() {
                out.extend(first.to_uppercase());
                out.push_str(c.as_str());
            }
        } else {
            out.push(' ');
            out.push_str(WORDS[rng.below(WORDS.len())]);
        }
        left_in_sentence -= 1;
    }
    if words > 0 {
        out.push('.');
    }
    out
}

/// How prompts are sized.
pub enum PromptSource {
    /// Exactly N token ids, cut from tokenized filler with the model's tokenizer.
    Tokenizer {
        /// The tokenizer.
        tokenizer: Box<Tokenizer>,
        /// The tokenizer.json it came from.
        path: PathBuf,
    },
    /// Exactly N token ids drawn uniformly (seeded) from the tokenizer's vocabulary, its added
    /// (special) tokens left out, as llama-bench draws its prompts. For synthetic checkpoints:
    /// a stand-in tokenizer such as a WordLevel `t0 … tN-1` maps all prose to one unknown id, and
    /// a prompt of one id repeated sends every token of an MoE down the same experts.
    RandomIds {
        /// The ids drawn from, ascending.
        ids: Vec<u32>,
        /// The tokenizer.json they came from.
        path: PathBuf,
    },
    /// Text of `round((N − intercept) / slope)` words, where the server counts
    /// `intercept + slope · words` tokens for a filler prompt (measured by [`calibrate`]).
    Text {
        /// Tokens per word.
        slope: f64,
        /// Tokens of an empty prompt (BOS and the like).
        intercept: f64,
    },
}

impl std::fmt::Debug for PromptSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tokenizer { path, .. } => write!(f, "Tokenizer({})", path.display()),
            Self::RandomIds { ids, path } => {
                write!(f, "RandomIds({} ids, {})", ids.len(), path.display())
            }
            Self::Text { slope, intercept } => write!(f, "Text({intercept} + {slope}·words)"),
        }
    }
}

/// Finds `tokenizer.json`: `path` itself, or inside the directory `path`.
pub fn tokenizer_file(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join("tokenizer.json")
    } else {
        path.to_path_buf()
    }
}

/// Loads a tokenizer from `tokenizer.json` (or a directory holding one).
pub fn load_tokenizer(path: &Path) -> Result<(Tokenizer, PathBuf)> {
    let file = tokenizer_file(path);
    if !file.is_file() {
        return Err(ClientError::Tokenizer {
            path: file,
            message: "no such file".into(),
        });
    }
    let tok = Tokenizer::from_file(&file).map_err(|e| ClientError::Tokenizer {
        path: file.clone(),
        message: e.to_string(),
    })?;
    Ok((tok, file))
}

impl PromptSource {
    /// Token-exact prompts from the `tokenizer.json` at `path` (or in the directory `path`).
    pub fn from_tokenizer(path: &Path) -> Result<Self> {
        let (tokenizer, path) = load_tokenizer(path)?;
        Ok(Self::Tokenizer {
            tokenizer: Box::new(tokenizer),
            path,
        })
    }

    /// Token-exact prompts of ids drawn at random from the vocabulary of the `tokenizer.json` at
    /// `path` (or in the directory `path`), its added tokens left out.
    pub fn random_ids(path: &Path) -> Result<Self> {
        let (tokenizer, path) = load_tokenizer(path)?;
        let added = tokenizer.get_added_tokens_decoder();
        let mut ids: Vec<u32> = tokenizer
            .get_vocab(false)
            .into_values()
            .filter(|id| !added.contains_key(id))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() {
            return Err(ClientError::Tokenizer {
                path,
                message: "no token ids in the vocabulary but added tokens".into(),
            });
        }
        Ok(Self::RandomIds { ids, path })
    }

    /// True when prompts are exactly the asked length (tokenizer modes).
    pub fn is_exact(&self) -> bool {
        matches!(self, Self::Tokenizer { .. } | Self::RandomIds { .. })
    }

    /// A one-line description for reports.
    pub fn describe(&self) -> String {
        match self {
            Self::Tokenizer { path, .. } => {
                format!("token ids, exact length ({})", path.display())
            }
            Self::RandomIds { ids, path } => format!(
                "random token ids of a {}-id vocabulary, exact length ({})",
                ids.len(),
                path.display()
            ),
            Self::Text { slope, intercept } => format!(
                "text sized by calibration ({slope:.4} tokens/word + {intercept:.1}); lengths are the server's usage.prompt_tokens"
            ),
        }
    }

    /// A prompt of `tokens` tokens (exactly, in tokenizer mode), seeded by `seed`.
    pub fn prompt(&self, tokens: usize, seed: u64) -> Result<Prompt> {
        match self {
            Self::Tokenizer { tokenizer, path } => {
                let mut words = tokens + 16;
                loop {
                    let text = filler_text(words, seed);
                    let enc = tokenizer.encode(text.as_str(), false).map_err(|e| {
                        ClientError::Tokenizer {
                            path: path.clone(),
                            message: e.to_string(),
                        }
                    })?;
                    let ids = enc.get_ids();
                    if ids.len() >= tokens {
                        return Ok(Prompt::Tokens(ids[..tokens].to_vec()));
                    }
                    if ids.is_empty() {
                        return Err(ClientError::Tokenizer {
                            path: path.clone(),
                            message: "the tokenizer produced no tokens for filler text".into(),
                        });
                    }
                    words = words * 2 + 16;
                }
            }
            Self::RandomIds { ids, .. } => {
                let mut rng = SplitMix64::new(seed);
                Ok(Prompt::Tokens(
                    (0..tokens).map(|_| ids[rng.below(ids.len())]).collect(),
                ))
            }
            Self::Text { slope, intercept } => {
                let words = ((tokens as f64 - intercept) / slope).round().max(1.0) as usize;
                Ok(Prompt::Text(filler_text(words, seed)))
            }
        }
    }
}

/// Word counts of the two calibration prompts.
pub const CALIBRATION_WORDS: [usize; 2] = [64, 1088];

/// The text source from two measured prompt sizes: `(words, server tokens)` pairs.
pub fn calibrate(points: [(usize, u64); 2]) -> Result<PromptSource> {
    let [(w1, t1), (w2, t2)] = points;
    let slope = (t2 as f64 - t1 as f64) / (w2 as f64 - w1 as f64);
    if !(slope.is_finite() && slope > 0.0) {
        return Err(ClientError::config(
            "--tokenizer",
            format!(
                "cannot size text prompts: the server counted {t1} tokens for {w1} words and {t2} for {w2}; pass --tokenizer"
            ),
        ));
    }
    let intercept = t1 as f64 - slope * w1 as f64;
    Ok(PromptSource::Text { slope, intercept })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filler_is_seeded_and_sized() {
        let a = filler_text(100, 1);
        assert_eq!(a, filler_text(100, 1));
        assert_ne!(a, filler_text(100, 2));
        assert_eq!(a.split_whitespace().count(), 100);
        assert!(a.ends_with('.'));
        assert_eq!(filler_text(0, 3), "");
    }

    #[test]
    fn calibration_fits_a_line() {
        let src = calibrate([(64, 81), (1088, 1361)]).unwrap();
        match &src {
            PromptSource::Text { slope, intercept } => {
                assert!((slope - 1.25).abs() < 1e-12);
                assert!((intercept - 1.0).abs() < 1e-12);
            }
            _ => unreachable!(),
        }
        match src.prompt(1251, 9).unwrap() {
            Prompt::Text(t) => assert_eq!(t.split_whitespace().count(), 1000),
            _ => unreachable!(),
        }
        assert!(calibrate([(64, 10), (1088, 10)]).is_err());
    }

    /// A WordLevel `t0 … t9` tokenizer (as word_tokenizer.py writes one) plus an added `<s>`.
    fn word_tokenizer(dir: &Path) -> PathBuf {
        let vocab: serde_json::Map<String, serde_json::Value> =
            (0..10).map(|i| (format!("t{i}"), i.into())).collect();
        let tok = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [{"id": 10, "content": "<s>", "single_word": false, "lstrip": false,
                              "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}
        });
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, tok.to_string()).unwrap();
        path
    }

    #[test]
    fn random_ids_are_exact_seeded_and_spread_over_the_vocabulary() {
        let dir = tempfile::tempdir().unwrap();
        let path = word_tokenizer(dir.path());
        let ids = |src: &PromptSource, n, seed| match src.prompt(n, seed).unwrap() {
            Prompt::Tokens(t) => t,
            _ => unreachable!(),
        };
        // filler prose through a stand-in tokenizer: one unknown id repeated
        let filler = PromptSource::from_tokenizer(&path).unwrap();
        assert!(ids(&filler, 50, 1).iter().all(|&t| t == 0));

        let src = PromptSource::random_ids(dir.path()).unwrap();
        assert!(src.is_exact());
        assert!(
            src.describe().contains("10-id vocabulary"),
            "{}",
            src.describe()
        );
        let a = ids(&src, 1000, 7);
        assert_eq!(a.len(), 1000);
        assert_eq!(a, ids(&src, 1000, 7));
        assert_ne!(a, ids(&src, 1000, 8));
        // every id of the vocabulary turns up, the added <s> (10) never
        let seen: std::collections::BTreeSet<u32> = a.iter().copied().collect();
        assert_eq!(seen, (0..10).collect());
        assert!(ids(&src, 0, 1).is_empty());
    }
}
