//! A tiny servable checkpoint: the synthetic tiny Laguna preset (random weights, vocabulary 512,
//! sliding window 16) plus what a server needs beside weights: a byte-level BPE `tokenizer.json`
//! whose 512 ids match the model's vocabulary (256 byte tokens, four special tokens at the
//! model's BOS/EOS/pad ids, and merges learned from a fixed English text), and a ChatML chat
//! template. Shared by the integration tests and `examples/tiny_model.rs` (which the real-client
//! scripts use).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

/// The model's vocabulary.
pub const VOCAB: usize = 512;
/// Special tokens at the ids the synthetic config names (eos 2 and 24, bos 2, pad 9).
pub const SPECIALS: [(u32, &str); 4] = [
    (1, "<|im_start|>"),
    (2, "<|im_end|>"),
    (9, "<|pad|>"),
    (24, "<|endoftext|>"),
];

const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const CORPUS: &str = "The quick brown fox jumps over the lazy dog. A model reads the text and \
writes the next word, one token at a time. The server sends each token to the client as soon \
as it is made, and the client prints it. Paris is the capital of France; Berlin is the \
capital of Germany; Rome is the capital of Italy. One, two, three, four, five, six, seven, \
eight, nine, ten. Hello world! How are you today? I am fine, thank you. What is the answer? \
The answer is forty two. Water boils at one hundred degrees. The sun is a star and the moon \
is not. We test the batching of many requests together, and every answer must be the same \
as when it runs alone. Cats and dogs are friends in this story about numbers and letters.";

/// GPT-2's byte → printable character map.
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut map = vec!['\0'; 256];
    for &b in &printable {
        map[b as usize] = char::from_u32(b).unwrap();
    }
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            map[b as usize] = char::from_u32(256 + n).unwrap();
            printable.push(b);
            n += 1;
        }
    }
    map
}

/// Learns `count` BPE merges from the corpus (most frequent pair first, ties to the smallest
/// pair: deterministic).
fn learn_merges(chars: &[char], count: usize) -> Vec<(String, String)> {
    let mut words: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    for (i, w) in CORPUS.split(' ').enumerate() {
        let text = if i == 0 {
            w.to_string()
        } else {
            format!(" {w}")
        };
        let symbols = text
            .bytes()
            .map(|b| chars[b as usize].to_string())
            .collect();
        *words.entry(symbols).or_insert(0) += 1;
    }
    let mut merges = Vec::new();
    while merges.len() < count {
        let mut pairs: BTreeMap<(String, String), usize> = BTreeMap::new();
        for (w, n) in &words {
            for p in w.windows(2) {
                *pairs.entry((p[0].clone(), p[1].clone())).or_insert(0) += n;
            }
        }
        let Some(best) = pairs
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map(|(p, _)| p.clone())
        else {
            break;
        };
        let joined = format!("{}{}", best.0, best.1);
        words = words
            .into_iter()
            .map(|(w, n)| {
                let mut out = Vec::with_capacity(w.len());
                let mut i = 0;
                while i < w.len() {
                    if i + 1 < w.len() && w[i] == best.0 && w[i + 1] == best.1 {
                        out.push(joined.clone());
                        i += 2;
                    } else {
                        out.push(w[i].clone());
                        i += 1;
                    }
                }
                (out, n)
            })
            .fold(BTreeMap::new(), |mut m, (w, n)| {
                *m.entry(w).or_insert(0) += n;
                m
            });
        merges.push(best);
    }
    merges
}

/// The `tokenizer.json` of [`VOCAB`] ids.
pub fn tokenizer_json() -> Value {
    let chars = byte_chars();
    let special_ids: Vec<u32> = SPECIALS.iter().map(|s| s.0).collect();
    let mut free = (0..VOCAB as u32).filter(|i| !special_ids.contains(i));
    let mut vocab = serde_json::Map::new();
    for (id, s) in SPECIALS {
        vocab.insert(s.to_string(), json!(id));
    }
    for c in &chars {
        vocab.insert(c.to_string(), json!(free.next().unwrap()));
    }
    let room = VOCAB - vocab.len();
    let merges = learn_merges(&chars, room);
    for (a, b) in &merges {
        let id = free.next().unwrap();
        vocab.insert(format!("{a}{b}"), json!(id));
    }
    // Should the corpus run out of pairs, the remaining ids still decode (as filler tokens).
    for (i, id) in free.enumerate() {
        vocab.insert(format!("<|unused{i}|>"), json!(id));
    }
    let added: Vec<Value> = SPECIALS
        .iter()
        .map(|(id, s)| {
            json!({"id": id, "content": s, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false,
                            "trim_offsets": true, "use_regex": true});
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": merges.iter().map(|(a, b)| json!([a, b])).collect::<Vec<_>>(),
        }
    })
}

/// Writes `tokenizer.json` and `tokenizer_config.json` (ChatML template) into `dir`.
pub fn write_text_files(dir: &Path) -> std::io::Result<()> {
    let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap();
    std::fs::write(dir.join("tokenizer.json"), pretty(&tokenizer_json()))?;
    std::fs::write(
        dir.join("tokenizer_config.json"),
        pretty(&json!({
            "add_bos_token": false,
            "bos_token": null,
            "eos_token": "<|im_end|>",
            "pad_token": "<|pad|>",
            "chat_template": CHATML,
            "model_max_length": 4096,
        })),
    )
}

/// Writes the whole tiny checkpoint (weights seeded with `seed`) to `dir` (which must not
/// exist).
pub fn write_tiny_model(dir: &Path, seed: u64) -> Result<(), Box<dyn std::error::Error>> {
    use fp4forge_builder::build::NoProgress;
    use fp4forge_builder::synth::{Preset, SynthBuilder};
    let builder = SynthBuilder::new().seed(seed);
    let plan = builder.plan_preset(Preset::Tiny)?;
    builder.write(&plan, dir, &NoProgress)?;
    write_text_files(dir)?;
    Ok(())
}
