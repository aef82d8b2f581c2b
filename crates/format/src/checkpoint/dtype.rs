//! Element types of safetensors tensors, spelled as in the header (`"BF16"`, `"F8_E4M3"`, ...).

use std::fmt;
use std::str::FromStr;

/// A safetensors element type whose elements are whole bytes.
///
/// The sub-byte types of safetensors (`F4`, `F6_E2M3`, `F6_E3M2`) are not supported: NVFP4 stores
/// its codes as `U8`.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    /// Boolean, one byte.
    BOOL,
    /// Unsigned 8-bit integer (also packed FP4 codes).
    U8,
    /// Signed 8-bit integer.
    I8,
    /// FP8 E5M2.
    F8_E5M2,
    /// FP8 E4M3FN (torch `float8_e4m3fn`).
    F8_E4M3,
    /// FP8 E8M0 (MX block scales).
    F8_E8M0,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    U16,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
}

impl Dtype {
    /// Every supported dtype, in the order above (ascending size, as safetensors orders them).
    pub const ALL: [Dtype; 16] = [
        Dtype::BOOL,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8_E5M2,
        Dtype::F8_E4M3,
        Dtype::F8_E8M0,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::BF16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::F64,
        Dtype::I64,
        Dtype::U64,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Dtype::BOOL | Dtype::U8 | Dtype::I8 => 1,
            Dtype::F8_E5M2 | Dtype::F8_E4M3 | Dtype::F8_E8M0 => 1,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::F64 | Dtype::I64 | Dtype::U64 => 8,
        }
    }

    /// The header spelling, e.g. `"F8_E4M3"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Dtype::BOOL => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8_E5M2 => "F8_E5M2",
            Dtype::F8_E4M3 => "F8_E4M3",
            Dtype::F8_E8M0 => "F8_E8M0",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
        }
    }

    /// Whether the type is a floating-point format (F8/F16/BF16/F32/F64).
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            Dtype::F8_E5M2
                | Dtype::F8_E4M3
                | Dtype::F8_E8M0
                | Dtype::F16
                | Dtype::BF16
                | Dtype::F32
                | Dtype::F64
        )
    }

    /// Bytes taken by a tensor of `shape`; `None` when the size overflows `u64`.
    pub fn byte_len(self, shape: &[usize]) -> Option<u64> {
        shape
            .iter()
            .try_fold(self.size() as u64, |acc, &d| acc.checked_mul(d as u64))
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error of parsing an unknown or unsupported dtype string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownDtype(pub String);

impl fmt::Display for UnknownDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown or unsupported dtype `{}`", self.0)
    }
}

impl std::error::Error for UnknownDtype {}

impl FromStr for Dtype {
    type Err = UnknownDtype;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Dtype::ALL
            .into_iter()
            .find(|d| d.as_str() == s)
            .ok_or_else(|| UnknownDtype(s.to_owned()))
    }
}

impl serde::Serialize for Dtype {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for Dtype {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sizes() {
        for d in Dtype::ALL {
            assert_eq!(d.as_str().parse::<Dtype>(), Ok(d));
        }
        assert_eq!(Dtype::BF16.size(), 2);
        assert_eq!(Dtype::F8_E4M3.size(), 1);
        assert!("F4".parse::<Dtype>().is_err());
        assert_eq!(Dtype::F32.byte_len(&[3, 5]), Some(60));
        assert_eq!(Dtype::F32.byte_len(&[]), Some(4));
        assert_eq!(Dtype::U64.byte_len(&[usize::MAX, 2]), None);
        assert_eq!(
            serde_json::to_string(&Dtype::F8_E4M3).unwrap(),
            "\"F8_E4M3\""
        );
        let d: Dtype = serde_json::from_str("\"BF16\"").unwrap();
        assert_eq!(d, Dtype::BF16);
    }

    #[test]
    fn matches_safetensors_spelling() {
        for d in Dtype::ALL {
            let theirs: safetensors::Dtype =
                serde_json::from_value(serde_json::Value::String(d.as_str().into())).unwrap();
            assert_eq!(theirs.bitsize(), 8 * d.size(), "{d}");
        }
    }
}
