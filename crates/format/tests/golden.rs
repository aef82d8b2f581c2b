//! Bit-exactness against golden vectors written by the reference implementations
//! (`tools/reference/make_numerics_fixtures.py`: torch casts, compressed-tensors 0.20.1 and the
//! llmcompressor 0.14.0.1 data-free NVFP4A16 path). Every byte of every tensor must match.

use std::path::PathBuf;

use fp4forge_format::float::bf16_bits_to_f32;
use fp4forge_format::fp4::f32_to_e2m1;
use fp4forge_format::fp8::{f32_to_e4m3, f32_to_e4m3_saturating};
use fp4forge_format::{
    dequantize_bf16, dequantize_f32, quantize_fused, Dtype, Nvfp4View, SafetensorsFile,
    SourceDtype, WeightView,
};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn open(name: &str) -> SafetensorsFile {
    SafetensorsFile::open(fixture(name)).expect("fixture opens")
}

#[test]
fn fp8_e4m3_exhaustive_over_every_bf16_value() {
    let file = open("fp8_e4m3_table.safetensors");
    let input = file.bytes("input").unwrap();
    let raw = file.bytes("raw").unwrap();
    let saturated = file.bytes("saturated").unwrap();
    assert_eq!(input.len(), 2 * 65536);
    let mut mismatches = Vec::new();
    for i in 0..65536 {
        let bits = u16::from_le_bytes([input[2 * i], input[2 * i + 1]]);
        let x = bf16_bits_to_f32(bits);
        let (got_raw, got_sat) = (f32_to_e4m3(x), f32_to_e4m3_saturating(x));
        if got_raw != raw[i] || got_sat != saturated[i] {
            mismatches.push((bits, got_raw, raw[i], got_sat, saturated[i]));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of 65536 differ; first (bf16 bits, raw ours/ref, saturated ours/ref): {:x?}",
        mismatches.len(),
        &mismatches[..mismatches.len().min(8)]
    );
}

#[test]
fn e2m1_codes_of_a_dense_threshold_sweep() {
    let file = open("e2m1_sweep.safetensors");
    let input = file.bytes("input").unwrap();
    let codes = file.bytes("codes").unwrap();
    assert_eq!(input.len(), 4 * codes.len());
    let mut bad = Vec::new();
    for (i, c) in input.chunks_exact(4).enumerate() {
        let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        // Block scale 1 and global scale 1: the reference divides by s_eff = 1/1 = 1.
        let ours = f32_to_e2m1((v / (1.0f32 / 1.0)).clamp(-6.0, 6.0));
        if ours != codes[i] {
            bad.push((v, ours, codes[i]));
        }
    }
    assert!(
        bad.is_empty(),
        "{} differ, first: {:?}",
        bad.len(),
        &bad[..bad.len().min(8)]
    );
    assert!(codes.len() > 1000, "the sweep is dense");
}

#[derive(serde::Deserialize)]
struct Cases {
    groups: Vec<Group>,
}

#[derive(serde::Deserialize)]
struct Group {
    members: Vec<String>,
    dtype: String,
    note: String,
}

fn source_dtype(d: Dtype) -> SourceDtype {
    match d {
        Dtype::BF16 => SourceDtype::Bf16,
        Dtype::F16 => SourceDtype::F16,
        Dtype::F32 => SourceDtype::F32,
        other => panic!("unexpected fixture dtype {other}"),
    }
}

#[test]
fn llmcompressor_nvfp4a16_cases_are_bit_exact() {
    let cases: Cases =
        serde_json::from_slice(&std::fs::read(fixture("nvfp4_cases.json")).unwrap()).unwrap();
    let file = open("nvfp4_cases.safetensors");
    let mut checked_tensors = 0;
    let mut dtypes_seen = std::collections::BTreeSet::new();
    for group in &cases.groups {
        let names: Vec<String> = group
            .members
            .iter()
            .map(|m| format!("{m}.weight"))
            .collect();
        let views: Vec<WeightView<'_>> = names
            .iter()
            .map(|name| {
                let info = file
                    .info(name)
                    .unwrap_or_else(|| panic!("{name} in fixture"));
                dtypes_seen.insert(info.dtype.to_string());
                WeightView::new(
                    name,
                    source_dtype(info.dtype),
                    info.shape[0],
                    info.shape[1],
                    file.bytes(name).unwrap(),
                )
                .unwrap()
            })
            .collect();
        let ours = quantize_fused(&views).unwrap();
        for (member, q) in group.members.iter().zip(&ours) {
            let expect = |suffix: &str| file.bytes(&format!("{member}.{suffix}")).unwrap();
            let what = format!("{member} ({}, {})", group.dtype, group.note);
            assert_eq!(
                q.global_scale.to_le_bytes(),
                expect("weight_global_scale"),
                "global scale of {what}"
            );
            assert_eq!(q.scales, expect("weight_scale"), "weight_scale of {what}");
            assert_eq!(q.packed, expect("weight_packed"), "weight_packed of {what}");
            checked_tensors += 3;

            // Decompression as compressed-tensors does it, for bf16 models: e2m1 * fp8 / g.
            let view = Nvfp4View::of(q);
            let f32s = dequantize_f32(&view);
            let bf16s = dequantize_bf16(&view);
            for (a, b) in f32s.iter().zip(&bf16s) {
                assert_eq!(fp4forge_format::float::round_bf16(*a), bf16_bits_to_f32(*b));
            }
        }
    }
    assert!(
        checked_tensors >= 3 * 40,
        "only {checked_tensors} tensors checked"
    );
    assert!(
        dtypes_seen.len() == 3,
        "bf16, f16 and f32 inputs: {dtypes_seen:?}"
    );
}
