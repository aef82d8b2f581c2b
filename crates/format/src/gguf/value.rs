//! GGUF metadata values: the thirteen `gguf_type`s, arrays typed by their element type.

use super::ValueType;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataValue {
    /// `u8`.
    U8(u8),
    /// `i8`.
    I8(i8),
    /// `u16`.
    U16(u16),
    /// `i16`.
    I16(i16),
    /// `u32`.
    U32(u32),
    /// `i32`.
    I32(i32),
    /// `f32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// UTF-8 string.
    String(String),
    /// An array (all elements of one type).
    Array(MetadataArray),
    /// `u64`.
    U64(u64),
    /// `i64`.
    I64(i64),
    /// `f64`.
    F64(f64),
}

/// A metadata array, stored by element type (a 49,152-token vocabulary is one `Vec<String>`).
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataArray {
    /// `u8` elements.
    U8(Vec<u8>),
    /// `i8` elements.
    I8(Vec<i8>),
    /// `u16` elements.
    U16(Vec<u16>),
    /// `i16` elements.
    I16(Vec<i16>),
    /// `u32` elements.
    U32(Vec<u32>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `f32` elements.
    F32(Vec<f32>),
    /// `bool` elements.
    Bool(Vec<bool>),
    /// String elements.
    String(Vec<String>),
    /// Array elements (each with its own element type).
    Array(Vec<MetadataArray>),
    /// `u64` elements.
    U64(Vec<u64>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `f64` elements.
    F64(Vec<f64>),
}

impl MetadataValue {
    /// The value's type tag.
    pub fn value_type(&self) -> ValueType {
        match self {
            MetadataValue::U8(_) => ValueType::U8,
            MetadataValue::I8(_) => ValueType::I8,
            MetadataValue::U16(_) => ValueType::U16,
            MetadataValue::I16(_) => ValueType::I16,
            MetadataValue::U32(_) => ValueType::U32,
            MetadataValue::I32(_) => ValueType::I32,
            MetadataValue::F32(_) => ValueType::F32,
            MetadataValue::Bool(_) => ValueType::Bool,
            MetadataValue::String(_) => ValueType::String,
            MetadataValue::Array(_) => ValueType::Array,
            MetadataValue::U64(_) => ValueType::U64,
            MetadataValue::I64(_) => ValueType::I64,
            MetadataValue::F64(_) => ValueType::F64,
        }
    }

    /// Any integer value that is non-negative, as `u64` (writers differ in the integer type
    /// they use for counts and ids).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetadataValue::U8(v) => Some(v.into()),
            MetadataValue::U16(v) => Some(v.into()),
            MetadataValue::U32(v) => Some(v.into()),
            MetadataValue::U64(v) => Some(v),
            MetadataValue::I8(v) => u64::try_from(v).ok(),
            MetadataValue::I16(v) => u64::try_from(v).ok(),
            MetadataValue::I32(v) => u64::try_from(v).ok(),
            MetadataValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any numeric value as `f64` (integers converted, floats widened exactly).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetadataValue::F32(v) => Some(v.into()),
            MetadataValue::F64(v) => Some(v),
            MetadataValue::I8(v) => Some(v.into()),
            MetadataValue::I16(v) => Some(v.into()),
            MetadataValue::I32(v) => Some(v.into()),
            MetadataValue::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The boolean, if this is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetadataValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetadataValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The array, if this is one.
    pub fn as_array(&self) -> Option<&MetadataArray> {
        match self {
            MetadataValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl MetadataArray {
    /// The element type tag.
    pub fn element_type(&self) -> ValueType {
        match self {
            MetadataArray::U8(_) => ValueType::U8,
            MetadataArray::I8(_) => ValueType::I8,
            MetadataArray::U16(_) => ValueType::U16,
            MetadataArray::I16(_) => ValueType::I16,
            MetadataArray::U32(_) => ValueType::U32,
            MetadataArray::I32(_) => ValueType::I32,
            MetadataArray::F32(_) => ValueType::F32,
            MetadataArray::Bool(_) => ValueType::Bool,
            MetadataArray::String(_) => ValueType::String,
            MetadataArray::Array(_) => ValueType::Array,
            MetadataArray::U64(_) => ValueType::U64,
            MetadataArray::I64(_) => ValueType::I64,
            MetadataArray::F64(_) => ValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            MetadataArray::U8(v) => v.len(),
            MetadataArray::I8(v) => v.len(),
            MetadataArray::U16(v) => v.len(),
            MetadataArray::I16(v) => v.len(),
            MetadataArray::U32(v) => v.len(),
            MetadataArray::I32(v) => v.len(),
            MetadataArray::F32(v) => v.len(),
            MetadataArray::Bool(v) => v.len(),
            MetadataArray::String(v) => v.len(),
            MetadataArray::Array(v) => v.len(),
            MetadataArray::U64(v) => v.len(),
            MetadataArray::I64(v) => v.len(),
            MetadataArray::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The strings, if this is a string array.
    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            MetadataArray::String(v) => Some(v),
            _ => None,
        }
    }

    /// The elements as `i64`, if this is an integer array (any width; `u64` above `i64::MAX`
    /// gives `None`).
    pub fn to_i64s(&self) -> Option<Vec<i64>> {
        Some(match self {
            MetadataArray::U8(v) => v.iter().map(|&x| x.into()).collect(),
            MetadataArray::I8(v) => v.iter().map(|&x| x.into()).collect(),
            MetadataArray::U16(v) => v.iter().map(|&x| x.into()).collect(),
            MetadataArray::I16(v) => v.iter().map(|&x| x.into()).collect(),
            MetadataArray::U32(v) => v.iter().map(|&x| x.into()).collect(),
            MetadataArray::I32(v) => v.iter().map(|&x| x.into()).collect(),
            MetadataArray::I64(v) => v.clone(),
            MetadataArray::U64(v) => v
                .iter()
                .map(|&x| i64::try_from(x).ok())
                .collect::<Option<_>>()?,
            _ => return None,
        })
    }

    /// The elements as `f32`, if this is an `f32` array.
    pub fn as_f32s(&self) -> Option<&[f32]> {
        match self {
            MetadataArray::F32(v) => Some(v),
            _ => None,
        }
    }
}

macro_rules! from_scalar {
    ($($t:ty => $v:ident),* $(,)?) => {$(
        impl From<$t> for MetadataValue {
            fn from(x: $t) -> Self {
                MetadataValue::$v(x)
            }
        }
        impl From<Vec<$t>> for MetadataArray {
            fn from(x: Vec<$t>) -> Self {
                MetadataArray::$v(x)
            }
        }
        impl From<Vec<$t>> for MetadataValue {
            fn from(x: Vec<$t>) -> Self {
                MetadataValue::Array(MetadataArray::$v(x))
            }
        }
    )*};
}

from_scalar!(
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, String => String, u64 => U64, i64 => I64, f64 => F64,
);

impl From<&str> for MetadataValue {
    fn from(s: &str) -> Self {
        MetadataValue::String(s.to_owned())
    }
}

impl From<MetadataArray> for MetadataValue {
    fn from(a: MetadataArray) -> Self {
        MetadataValue::Array(a)
    }
}

impl From<Vec<MetadataArray>> for MetadataValue {
    fn from(a: Vec<MetadataArray>) -> Self {
        MetadataValue::Array(MetadataArray::Array(a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_and_float_views() {
        assert_eq!(MetadataValue::U32(30).as_u64(), Some(30));
        assert_eq!(MetadataValue::I32(-1).as_u64(), None);
        assert_eq!(MetadataValue::I64(7).as_u64(), Some(7));
        assert_eq!(MetadataValue::F32(1e-5).as_f64(), Some(f64::from(1e-5f32)));
        assert_eq!(MetadataValue::from("x").as_str(), Some("x"));
        assert_eq!(MetadataValue::F32(1.0).as_u64(), None);
        let a = MetadataArray::from(vec![1u64, u64::MAX]);
        assert_eq!(a.to_i64s(), None);
        assert_eq!(
            MetadataArray::from(vec![3i32, -1]).to_i64s(),
            Some(vec![3, -1])
        );
    }
}
