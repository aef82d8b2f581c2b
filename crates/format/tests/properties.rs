//! Property tests of the NVFP4 numerics: packing round trips, and quantization is a fixed point on
//! values it produced itself.
use fp4forge_format::nvfp4::{pack_codes, unpack_codes};
use fp4forge_format::{
    dequantize_bf16, global_scale, quantize_with_global_scale, Nvfp4View, SourceDtype, WeightView,
};
use proptest::prelude::*;

fn bf16_bytes(bits: &[u16]) -> Vec<u8> {
    bits.iter().flat_map(|b| b.to_le_bytes()).collect()
}

proptest! {
    #[test]
    fn unpack_inverts_pack(codes in prop::collection::vec(0u8..16, 0..256usize).prop_filter("even", |c| c.len() % 2 == 0)) {
        prop_assert_eq!(unpack_codes(&pack_codes(&codes)), codes);
    }

    #[test]
    fn pack_inverts_unpack(bytes in prop::collection::vec(any::<u8>(), 0..128)) {
        prop_assert_eq!(pack_codes(&unpack_codes(&bytes)), bytes);
    }

    /// Values already on the NVFP4 grid (each block holding a full-scale ±6 code, normal fp8 block
    /// scales) quantize back to exactly the codes and scales that produced them. The only change
    /// allowed is the reference's sign-of-zero rule: -0 (code 0x8) dequantizes to -0.0, which
    /// re-encodes as +0 (code 0x0).
    #[test]
    fn quantize_is_idempotent_on_quantized_values(
        amax in 1e-3f32..1e3,
        rows in 1usize..4,
        blocks in 1usize..6,
        scale_codes in prop::collection::vec(0x08u8..=0x7E, 3 * 5),
        element_codes in prop::collection::vec(0u8..16, 3 * 5 * 16),
        full_scale_negative in any::<bool>(),
    ) {
        let cols = 16 * blocks;
        let g = global_scale(amax, SourceDtype::Bf16);
        let scales: Vec<u8> = scale_codes.iter().cycle().take(rows * blocks).copied().collect();
        let mut codes: Vec<u8> = element_codes.iter().cycle().take(rows * cols).copied().collect();
        for block in codes.chunks_exact_mut(16) {
            block[0] = if full_scale_negative { 0xF } else { 0x7 };
        }
        let packed = pack_codes(&codes);
        let view = Nvfp4View { rows, cols, packed: &packed, scales: &scales, global_scale: g };
        let values = bf16_bytes(&dequantize_bf16(&view));
        let w = WeightView::new("grid", SourceDtype::Bf16, rows, cols, &values).unwrap();
        let again = quantize_with_global_scale(&w, g).unwrap();
        prop_assert_eq!(&again.scales, &scales);
        let positive_zero = |c: &u8| if *c == 0x8 { 0x0 } else { *c };
        let expected: Vec<u8> = codes.iter().map(positive_zero).collect();
        prop_assert_eq!(unpack_codes(&again.packed), expected);
    }
}
