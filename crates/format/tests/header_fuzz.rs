//! Robustness of the safetensors reader: mutated files (byte flips, truncations, bad length
//! prefixes, garbage or hostile JSON) are rejected with an error, never a panic, and whatever
//! the reader accepts the `safetensors` crate accepts too.

use std::collections::HashMap;
use std::path::Path;

use fp4forge_format::checkpoint::SafetensorsHeader;
use fp4forge_format::{CheckpointError, SafetensorsFile};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

const DTYPES: [(safetensors::Dtype, usize); 6] = [
    (safetensors::Dtype::U8, 1),
    (safetensors::Dtype::F8_E4M3, 1),
    (safetensors::Dtype::BF16, 2),
    (safetensors::Dtype::F16, 2),
    (safetensors::Dtype::F32, 4),
    (safetensors::Dtype::I64, 8),
];

/// A valid safetensors file with 1..5 small tensors, written by the `safetensors` crate.
fn valid_file() -> impl Strategy<Value = Vec<u8>> {
    let tensor = (0..DTYPES.len(), prop::collection::vec(0usize..5, 0..3));
    (prop::collection::vec(tensor, 1..5), any::<bool>()).prop_map(|(tensors, meta)| {
        let data: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = tensors
            .into_iter()
            .enumerate()
            .map(|(i, (d, shape))| {
                let (dtype, size) = DTYPES[d];
                let len = shape.iter().product::<usize>() * size;
                (format!("t{i}.weight"), dtype, shape, vec![i as u8; len])
            })
            .collect();
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = data
            .iter()
            .map(|(n, d, s, b)| {
                let view = safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap();
                (n.clone(), view)
            })
            .collect();
        let meta = meta.then(|| HashMap::from([("format".to_owned(), "pt".to_owned())]));
        safetensors::serialize(views, meta).unwrap()
    })
}

fn parse(bytes: &[u8]) -> Result<SafetensorsHeader, CheckpointError> {
    SafetensorsHeader::parse(Path::new("fuzz.safetensors"), bytes)
}

fn header_len(file: &[u8]) -> usize {
    u64::from_le_bytes(file[..8].try_into().unwrap()) as usize
}

/// Replaces the JSON header of `file` by `json` (re-padded, new prefix), keeping the data.
fn with_header(file: &[u8], json: &Value) -> Vec<u8> {
    let data = &file[8 + header_len(file)..];
    let mut text = serde_json::to_vec(json).unwrap();
    text.resize(text.len().next_multiple_of(8), b' ');
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(data);
    out
}

fn header_json(file: &[u8]) -> Map<String, Value> {
    serde_json::from_slice(&file[8..8 + header_len(file)]).unwrap()
}

/// Whatever we accept, the reference accepts with the same tensors.
fn agrees_with_reference(bytes: &[u8]) {
    if let Ok(ours) = parse(bytes) {
        let theirs = safetensors::SafeTensors::deserialize(bytes)
            .expect("fp4forge accepted a file the safetensors crate rejects");
        assert_eq!(ours.tensors.len(), theirs.len());
        for t in &ours.tensors {
            let v = theirs.tensor(&t.name).unwrap();
            assert_eq!(v.shape(), t.shape.as_slice());
            assert_eq!(v.data().len(), t.byte_len());
        }
    }
}

/// A hostile rewrite of one tensor entry's JSON.
fn hostile_entry() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!({"dtype": "F32", "shape": [u64::MAX, 2], "data_offsets": [0, 8]})),
        Just(json!({"dtype": "F32", "shape": [1u64 << 62, 1u64 << 62], "data_offsets": [0, 0]})),
        Just(json!({"dtype": "I64", "shape": [1u64 << 61], "data_offsets": [0, u64::MAX]})),
        Just(json!({"dtype": "U8", "shape": [4], "data_offsets": [u64::MAX - 1, 2]})),
        Just(json!({"dtype": "U8", "shape": [4], "data_offsets": [u64::MAX - 3, u64::MAX]})),
        Just(json!({"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]})),
        Just(json!({"dtype": "U8", "shape": [1.5], "data_offsets": [0, 1]})),
        Just(json!({"dtype": "U8", "shape": [1], "data_offsets": [0]})),
        Just(json!({"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]})),
        Just(json!({"dtype": "U8", "shape": [1]})),
        Just(json!({"dtype": "F4", "shape": [2], "data_offsets": [0, 1]})),
        Just(json!({"dtype": 7, "shape": [1], "data_offsets": [0, 1]})),
        Just(json!({"dtype": "U8", "shape": "1", "data_offsets": [0, 1]})),
        Just(json!([1, 2, 3])),
        Just(Value::Null),
        Just(json!("x")),
    ]
}

/// A mutation that always makes a valid file invalid.
#[derive(Debug, Clone)]
enum Breaking {
    /// Cut the file to `frac` of its length (strictly shorter).
    Truncate(f64),
    /// Append bytes after the data.
    Append(Vec<u8>),
    /// Set the length prefix to a value that cannot be right.
    Prefix(u64),
    /// Replace one tensor's entry with a hostile one.
    Entry(usize, Value),
    /// Replace the whole header with bytes that are not a JSON object.
    Garbage(Vec<u8>),
    /// Set `__metadata__` to something other than a map of strings.
    Metadata(Value),
}

fn breaking() -> impl Strategy<Value = Breaking> {
    prop_oneof![
        (0.0f64..1.0).prop_map(Breaking::Truncate),
        prop::collection::vec(any::<u8>(), 1..16).prop_map(Breaking::Append),
        prop_oneof![
            Just(u64::MAX),
            Just(u64::MAX - 7),
            Just(1u64 << 63),
            Just(100_000_001),
            0u64..8,
            any::<u64>(),
        ]
        .prop_map(Breaking::Prefix),
        (any::<usize>(), hostile_entry()).prop_map(|(i, v)| Breaking::Entry(i, v)),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(Breaking::Garbage),
        prop_oneof![Just(json!({"a": 1})), Just(json!([])), Just(json!("pt"))]
            .prop_map(Breaking::Metadata),
    ]
}

fn apply(file: &[u8], m: &Breaking) -> Vec<u8> {
    match m {
        Breaking::Truncate(frac) => {
            let keep = ((file.len() as f64) * frac) as usize;
            file[..keep.min(file.len() - 1)].to_vec()
        }
        Breaking::Append(extra) => [file, extra.as_slice()].concat(),
        Breaking::Prefix(n) => {
            let mut out = file.to_vec();
            // Any prefix other than the true one misplaces the JSON end: invalid either way.
            let n = if *n == header_len(file) as u64 {
                n + 1
            } else {
                *n
            };
            out[..8].copy_from_slice(&n.to_le_bytes());
            out
        }
        Breaking::Entry(i, v) => {
            let mut json = header_json(file);
            let names: Vec<String> = json
                .keys()
                .filter(|k| *k != "__metadata__")
                .cloned()
                .collect();
            json.insert(names[i % names.len()].clone(), v.clone());
            with_header(file, &Value::Object(json))
        }
        Breaking::Garbage(bytes) => {
            let mut bytes = bytes.clone();
            bytes.retain(|b| *b != b'{'); // never an object
            let mut out = (bytes.len() as u64).to_le_bytes().to_vec();
            out.extend_from_slice(&bytes);
            out.extend_from_slice(&file[8 + header_len(file)..]);
            out
        }
        Breaking::Metadata(v) => {
            let mut json = header_json(file);
            json.insert("__metadata__".into(), v.clone());
            with_header(file, &Value::Object(json))
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn valid_files_parse(file in valid_file()) {
        let h = parse(&file).unwrap();
        agrees_with_reference(&file);
        prop_assert_eq!(h.data_start() + h.tensors.iter().map(|t| t.byte_len()).sum::<usize>(), file.len());
    }

    #[test]
    fn breaking_mutations_are_errors(file in valid_file(), m in breaking()) {
        let bad = apply(&file, &m);
        // Every mutation here is invalid whatever the rest of the file holds.
        prop_assert!(parse(&bad).is_err(), "accepted after {:?}", m);
    }

    #[test]
    fn byte_flips_never_panic(
        file in valid_file(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..6),
    ) {
        let mut bad = file.clone();
        for (at, x) in &flips {
            let i = at.index(bad.len());
            bad[i] ^= x;
        }
        let _ = parse(&bad);
        agrees_with_reference(&bad);
    }

    #[test]
    fn header_flips_and_cuts_never_panic(
        file in valid_file(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        // Flips confined to the JSON, where they hit the parser rather than the data.
        let n = header_len(&file);
        let mut bad = file.clone();
        for (at, x) in &flips {
            bad[8 + at.index(n)] = *x;
        }
        let _ = parse(&bad);
        agrees_with_reference(&bad);
        let cut = cut.index(bad.len());
        prop_assert!(parse(&bad[..cut]).is_err() || parse(&bad).is_err());
    }
}

#[test]
fn files_on_disk_get_the_same_checks() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("short", vec![1, 2, 3]),
        ("prefix too big", u64::MAX.to_le_bytes().to_vec()),
        (
            "prefix past end",
            [16u64.to_le_bytes().as_slice(), b"{}"].concat(),
        ),
        ("not json", [2u64.to_le_bytes().as_slice(), b"{]"].concat()),
        (
            "not an object",
            [2u64.to_le_bytes().as_slice(), b"[]"].concat(),
        ),
        (
            "trailing data",
            [2u64.to_le_bytes().as_slice(), b"{}", b"x"].concat(),
        ),
    ];
    for (what, bytes) in cases {
        let path = dir
            .path()
            .join(format!("{}.safetensors", what.replace(' ', "_")));
        std::fs::write(&path, &bytes).unwrap();
        let err = SafetensorsFile::open(&path).unwrap_err();
        assert!(
            err.to_string().contains(path.to_str().unwrap()),
            "{what}: {err}"
        );
    }
    let ok = dir.path().join("ok.safetensors");
    std::fs::write(&ok, [2u64.to_le_bytes().as_slice(), b"{}"].concat()).unwrap();
    assert!(SafetensorsFile::open(&ok).unwrap().is_empty());
    let missing = SafetensorsFile::open(dir.path().join("missing.safetensors")).unwrap_err();
    assert!(matches!(missing, CheckpointError::Io { .. }));
}

/// The two byte flips a `byte_flips_never_panic` run found (2026-12-05): `"dtype"` of the
/// first entry became `"etype"` and `t3.weight` became a second `t1.weight`. A JSON map keeps
/// the last of repeated keys, so the broken entry was silently replaced by the later one; the
/// `safetensors` crate rejects the file, and so must we, naming the repeated key.
#[test]
fn a_repeated_key_is_an_error_not_a_silent_overwrite() {
    let header = br#"{"__metadata__":{"format":"pt"},"t1.weight":{"etype":"F32","shape":[0,0],"data_offsets":[0,0]},"t0.weight":{"dtype":"F16","shape":[0,0],"data_offsets":[0,0]},"t2.weight":{"dtype":"F16","shape":[],"data_offsets":[0,2]},"t1.weight":{"dtype":"U8","shape":[0],"data_offsets":[2,2]}}"#;
    let file = |json: &[u8]| {
        let mut text = json.to_vec();
        text.resize(text.len().next_multiple_of(8), b' ');
        let mut out = (text.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&text);
        out.extend_from_slice(&[2, 2]);
        out
    };
    // both readers refuse the file, ours naming the repeated key
    let refused = |bad: &[u8], key: &str| {
        assert!(safetensors::SafeTensors::deserialize(bad).is_err());
        let err = parse(bad)
            .expect_err("a header that repeats a key")
            .to_string();
        assert!(err.contains(&format!("`{key}` appears twice")), "{err}");
    };
    refused(&file(header), "t1.weight");
    // A key repeated inside one entry: the reference refuses a duplicate field.
    let inner = br#"{"t":{"dtype":"U8","shape":[2],"dtype":"U8","data_offsets":[0,2]}}"#;
    refused(&file(inner), "dtype");

    // The same files without the repetition parse.
    let fixed = String::from_utf8_lossy(header)
        .replacen("etype", "dtype", 1)
        .replacen(
            "\"t1.weight\":{\"dtype\":\"U8\"",
            "\"t3.weight\":{\"dtype\":\"U8\"",
            1,
        );
    let good = file(fixed.as_bytes());
    assert_eq!(parse(&good).expect("the unflipped header").tensors.len(), 4);
    agrees_with_reference(&good);
    let good = file(br#"{"t":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#);
    assert_eq!(parse(&good).expect("one U8 tensor").tensors.len(), 1);
}
