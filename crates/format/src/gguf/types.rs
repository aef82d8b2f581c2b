//! ggml element types (`ggml_type`) and GGUF metadata value types (`gguf_type`), with their ids
//! as stored in files.

use std::fmt;

/// A ggml tensor element type: plain floats/ints, or a block quantization of `block_size`
/// elements stored in `type_size` bytes.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    /// IEEE single precision.
    F32,
    /// IEEE half precision.
    F16,
    /// 32 elements: f16 scale `d`, 16 bytes of 4-bit codes; `x = (q - 8)·d`.
    Q4_0,
    /// 32 elements: f16 `d`, f16 `m`, 16 bytes of 4-bit codes; `x = q·d + m`.
    Q4_1,
    /// 32 elements: f16 `d`, 32 high bits, 16 bytes of low nibbles; `x = (q - 16)·d`.
    Q5_0,
    /// 32 elements: f16 `d`, f16 `m`, 32 high bits, 16 bytes of low nibbles; `x = q·d + m`.
    Q5_1,
    /// 32 elements: f16 `d`, 32 signed bytes; `x = q·d`.
    Q8_0,
    /// 32 elements: f16 `d`, f16 `s`, 32 signed bytes (an intermediate type of ggml's dot products).
    Q8_1,
    /// K-quant, 256 elements, 2 bits.
    Q2_K,
    /// K-quant, 256 elements, 3 bits.
    Q3_K,
    /// K-quant, 256 elements, 4 bits with 6-bit scales and mins.
    Q4_K,
    /// K-quant, 256 elements, 5 bits with 6-bit scales and mins.
    Q5_K,
    /// K-quant, 256 elements, 6 bits with 8-bit scales.
    Q6_K,
    /// K-quant, 256 elements, f32 `d` and 8-bit values (plus block sums).
    Q8_K,
    /// i-quant (layout known, not dequantized here).
    IQ2_XXS,
    /// i-quant (layout known, not dequantized here).
    IQ2_XS,
    /// i-quant (layout known, not dequantized here).
    IQ3_XXS,
    /// i-quant (layout known, not dequantized here).
    IQ1_S,
    /// i-quant (layout known, not dequantized here).
    IQ4_NL,
    /// i-quant (layout known, not dequantized here).
    IQ3_S,
    /// i-quant (layout known, not dequantized here).
    IQ2_S,
    /// i-quant (layout known, not dequantized here).
    IQ4_XS,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// IEEE double precision.
    F64,
    /// i-quant (layout known, not dequantized here).
    IQ1_M,
    /// bfloat16.
    BF16,
    /// Ternary quant (layout known, not dequantized here).
    TQ1_0,
    /// Ternary quant (layout known, not dequantized here).
    TQ2_0,
    /// OCP MXFP4 (layout known, not dequantized here).
    MXFP4,
}

impl GgmlType {
    /// Every type this crate knows the layout of.
    pub const ALL: [GgmlType; 32] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ1_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::IQ2_S,
        GgmlType::IQ4_XS,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
        GgmlType::IQ1_M,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
    ];

    /// The `ggml_type` id stored in GGUF tensor infos.
    pub const fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q8_1 => 9,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::Q8_K => 15,
            GgmlType::IQ2_XXS => 16,
            GgmlType::IQ2_XS => 17,
            GgmlType::IQ3_XXS => 18,
            GgmlType::IQ1_S => 19,
            GgmlType::IQ4_NL => 20,
            GgmlType::IQ3_S => 21,
            GgmlType::IQ2_S => 22,
            GgmlType::IQ4_XS => 23,
            GgmlType::I8 => 24,
            GgmlType::I16 => 25,
            GgmlType::I32 => 26,
            GgmlType::I64 => 27,
            GgmlType::F64 => 28,
            GgmlType::IQ1_M => 29,
            GgmlType::BF16 => 30,
            GgmlType::TQ1_0 => 34,
            GgmlType::TQ2_0 => 35,
            GgmlType::MXFP4 => 39,
        }
    }

    /// The type with `ggml_type` id `id`, if known.
    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.id() == id)
    }

    /// Elements per block (1 for plain types).
    pub const fn block_size(self) -> usize {
        match self {
            GgmlType::F32
            | GgmlType::F16
            | GgmlType::BF16
            | GgmlType::F64
            | GgmlType::I8
            | GgmlType::I16
            | GgmlType::I32
            | GgmlType::I64 => 1,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q8_1
            | GgmlType::IQ4_NL
            | GgmlType::MXFP4 => 32,
            _ => 256,
        }
    }

    /// Bytes per block (`sizeof(block_xxx)` in ggml).
    pub const fn type_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::I32 => 4,
            GgmlType::F16 | GgmlType::BF16 | GgmlType::I16 => 2,
            GgmlType::F64 | GgmlType::I64 => 8,
            GgmlType::I8 => 1,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q8_1 => 36,
            GgmlType::Q2_K => 84,
            GgmlType::Q3_K => 110,
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
            GgmlType::Q8_K => 292,
            GgmlType::IQ2_XXS => 66,
            GgmlType::IQ2_XS => 74,
            GgmlType::IQ3_XXS => 98,
            GgmlType::IQ1_S => 50,
            GgmlType::IQ4_NL => 18,
            GgmlType::IQ3_S => 110,
            GgmlType::IQ2_S => 82,
            GgmlType::IQ4_XS => 136,
            GgmlType::IQ1_M => 56,
            GgmlType::TQ1_0 => 54,
            GgmlType::TQ2_0 => 66,
            GgmlType::MXFP4 => 17,
        }
    }

    /// Bytes taken by `elements` elements; `None` when `elements` is not a whole number of
    /// blocks or the size overflows.
    pub fn byte_len(self, elements: u64) -> Option<u64> {
        let block = self.block_size() as u64;
        if !elements.is_multiple_of(block) {
            return None;
        }
        (elements / block).checked_mul(self.type_size() as u64)
    }

    /// Whether [`dequantize`](super::dequantize) supports this type.
    pub const fn is_dequantizable(self) -> bool {
        matches!(
            self,
            GgmlType::F32
                | GgmlType::F16
                | GgmlType::BF16
                | GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q5_0
                | GgmlType::Q5_1
                | GgmlType::Q8_0
                | GgmlType::Q2_K
                | GgmlType::Q3_K
                | GgmlType::Q4_K
                | GgmlType::Q5_K
                | GgmlType::Q6_K
                | GgmlType::Q8_K
        )
    }

    /// The dequantizable types, comma separated (for error messages).
    pub fn dequantizable_list() -> String {
        Self::ALL
            .iter()
            .filter(|t| t.is_dequantizable())
            .map(|t| t.name())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The ggml spelling, e.g. `"Q4_K"`.
    pub const fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q8_1 => "Q8_1",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
            GgmlType::Q8_K => "Q8_K",
            GgmlType::IQ2_XXS => "IQ2_XXS",
            GgmlType::IQ2_XS => "IQ2_XS",
            GgmlType::IQ3_XXS => "IQ3_XXS",
            GgmlType::IQ1_S => "IQ1_S",
            GgmlType::IQ4_NL => "IQ4_NL",
            GgmlType::IQ3_S => "IQ3_S",
            GgmlType::IQ2_S => "IQ2_S",
            GgmlType::IQ4_XS => "IQ4_XS",
            GgmlType::I8 => "I8",
            GgmlType::I16 => "I16",
            GgmlType::I32 => "I32",
            GgmlType::I64 => "I64",
            GgmlType::F64 => "F64",
            GgmlType::IQ1_M => "IQ1_M",
            GgmlType::BF16 => "BF16",
            GgmlType::TQ1_0 => "TQ1_0",
            GgmlType::TQ2_0 => "TQ2_0",
            GgmlType::MXFP4 => "MXFP4",
        }
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The type tag of a GGUF metadata value (`gguf_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// `u8`.
    U8,
    /// `i8`.
    I8,
    /// `u16`.
    U16,
    /// `i16`.
    I16,
    /// `u32`.
    U32,
    /// `i32`.
    I32,
    /// `f32`.
    F32,
    /// One byte, 0 or 1.
    Bool,
    /// `u64` length + UTF-8 bytes.
    String,
    /// Element type + `u64` count + elements.
    Array,
    /// `u64`.
    U64,
    /// `i64`.
    I64,
    /// `f64`.
    F64,
}

impl ValueType {
    /// The `gguf_type` id.
    pub const fn id(self) -> u32 {
        match self {
            ValueType::U8 => 0,
            ValueType::I8 => 1,
            ValueType::U16 => 2,
            ValueType::I16 => 3,
            ValueType::U32 => 4,
            ValueType::I32 => 5,
            ValueType::F32 => 6,
            ValueType::Bool => 7,
            ValueType::String => 8,
            ValueType::Array => 9,
            ValueType::U64 => 10,
            ValueType::I64 => 11,
            ValueType::F64 => 12,
        }
    }

    /// The type with `gguf_type` id `id`, if valid.
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => ValueType::U8,
            1 => ValueType::I8,
            2 => ValueType::U16,
            3 => ValueType::I16,
            4 => ValueType::U32,
            5 => ValueType::I32,
            6 => ValueType::F32,
            7 => ValueType::Bool,
            8 => ValueType::String,
            9 => ValueType::Array,
            10 => ValueType::U64,
            11 => ValueType::I64,
            12 => ValueType::F64,
            _ => return None,
        })
    }

    /// Bytes of one value for fixed-size types; `None` for strings and arrays.
    pub const fn fixed_size(self) -> Option<usize> {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => Some(1),
            ValueType::U16 | ValueType::I16 => Some(2),
            ValueType::U32 | ValueType::I32 | ValueType::F32 => Some(4),
            ValueType::U64 | ValueType::I64 | ValueType::F64 => Some(8),
            ValueType::String | ValueType::Array => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_are_unique() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::from_id(5), None);
        for id in 0..13 {
            assert_eq!(ValueType::from_id(id).map(ValueType::id), Some(id));
        }
        assert_eq!(ValueType::from_id(13), None);
    }

    #[test]
    fn block_layouts_match_ggml() {
        // (block elements, bytes) from ggml's type traits.
        assert_eq!(
            (GgmlType::Q4_1.block_size(), GgmlType::Q4_1.type_size()),
            (32, 20)
        );
        assert_eq!(
            (GgmlType::Q6_K.block_size(), GgmlType::Q6_K.type_size()),
            (256, 210)
        );
        assert_eq!(GgmlType::Q4_1.byte_len(64), Some(40));
        assert_eq!(GgmlType::Q4_1.byte_len(33), None);
        assert_eq!(GgmlType::F32.byte_len(u64::MAX), None);
    }
}
