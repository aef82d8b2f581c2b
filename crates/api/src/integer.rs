//! [`Integer`]: a JSON integer as clients send it.

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A JSON integer field, kept wide so validation can tell "negative" from "too big" and name
/// the bound. An integral float (`3.0`, `1e3`) counts as an integer, as Python clients send
/// them; a fractional or non-finite one, or one beyond ±1e30, is not an integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Integer(pub i128);

impl Integer {
    /// The value as `usize`, `None` when negative or too big.
    pub fn to_usize(self) -> Option<usize> {
        usize::try_from(self.0).ok()
    }

    /// The value as `u64`, `None` when negative or too big.
    pub fn to_u64(self) -> Option<u64> {
        u64::try_from(self.0).ok()
    }
}

impl std::fmt::Display for Integer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

macro_rules! integer_from {
    ($($t:ty),*) => {$(
        impl From<$t> for Integer {
            fn from(v: $t) -> Self {
                Self(i128::from(v))
            }
        }
    )*};
}
integer_from!(u8, u16, u32, u64, i8, i16, i32, i64);

impl From<usize> for Integer {
    fn from(v: usize) -> Self {
        Self(v as i128)
    }
}

impl PartialEq<u32> for Integer {
    fn eq(&self, other: &u32) -> bool {
        self.0 == i128::from(*other)
    }
}

impl Serialize for Integer {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if let Ok(v) = i64::try_from(self.0) {
            s.serialize_i64(v)
        } else if let Ok(v) = u64::try_from(self.0) {
            s.serialize_u64(v)
        } else {
            s.serialize_f64(self.0 as f64)
        }
    }
}

struct IntegerVisitor;

impl Visitor<'_> for IntegerVisitor {
    type Value = Integer;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an integer")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Integer, E> {
        Ok(Integer(i128::from(v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Integer, E> {
        Ok(Integer(i128::from(v)))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Integer, E> {
        Ok(Integer(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Integer, E> {
        if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e30 {
            Ok(Integer(v as i128))
        } else {
            Err(E::invalid_type(de::Unexpected::Float(v), &self))
        }
    }
}

impl<'de> Deserialize<'de> for Integer {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(IntegerVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integral_floats_count_and_fractions_do_not() {
        let ok: Vec<Integer> =
            serde_json::from_str("[3, 3.0, -2, 1e3, 99999999999999999999]").expect("integers");
        assert_eq!(ok[1], Integer(3));
        assert_eq!(ok[3], Integer(1000));
        assert!(ok[4].0 > i128::from(u64::MAX));
        assert!(serde_json::from_str::<Integer>("2.5").is_err());
        assert!(serde_json::from_str::<Integer>("\"2\"").is_err());
        assert_eq!(serde_json::to_string(&Integer(-7)).expect("json"), "-7");
    }
}
