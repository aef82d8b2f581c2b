//! JSON objects that round-trip: fields that remember absent vs `null`, key order, unknown keys.
//!
//! A config read and written back must be the same JSON: the same keys, `null`s where there
//! were `null`s, nothing added where a key was absent, and the same key order. The typed structs
//! of this module are declared with [`json_object!`], which gives each one `Field<T>` members,
//! an `extra` map for keys it does not model and a [`KeyOrder`].

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

/// One member of a JSON object: absent, present as `null`, or set to a value.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Field<T> {
    /// The key is not in the object (and is not written back).
    #[default]
    Absent,
    /// The key is present with value `null`.
    Null,
    /// The key is present with a value.
    Set(T),
}

impl<T> Field<T> {
    /// The value, when set.
    pub fn get(&self) -> Option<&T> {
        match self {
            Field::Set(v) => Some(v),
            _ => None,
        }
    }

    /// The value mutably, when set.
    pub fn get_mut(&mut self) -> Option<&mut T> {
        match self {
            Field::Set(v) => Some(v),
            _ => None,
        }
    }

    /// The value, when set, by value.
    pub fn into_option(self) -> Option<T> {
        match self {
            Field::Set(v) => Some(v),
            _ => None,
        }
    }

    /// Whether the key is absent.
    pub fn is_absent(&self) -> bool {
        matches!(self, Field::Absent)
    }

    /// Whether the key is present as `null`.
    pub fn is_null(&self) -> bool {
        matches!(self, Field::Null)
    }

    /// Whether the key holds a value.
    pub fn is_set(&self) -> bool {
        matches!(self, Field::Set(_))
    }
}

impl<T: Copy> Field<T> {
    /// The value, when set, copied.
    pub fn value(&self) -> Option<T> {
        self.get().copied()
    }
}

impl<T> From<T> for Field<T> {
    fn from(v: T) -> Self {
        Field::Set(v)
    }
}

/// The order in which an object's keys are written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum KeyOrder {
    /// All keys sorted, as compressed-tensors and transformers write them (objects built in code).
    #[default]
    Sorted,
    /// The keys of the object as read first, in that order; keys added since, sorted, after.
    Recorded(Vec<String>),
}

/// Takes the typed members out of a parsed object, leaving the unknown keys.
pub(crate) struct ObjectReader {
    map: Map<String, Value>,
    order: Vec<String>,
}

impl ObjectReader {
    /// Starts reading `map`, recording its key order.
    pub(crate) fn new(map: Map<String, Value>) -> Self {
        let order = map.keys().cloned().collect();
        Self { map, order }
    }

    /// Removes `key` and parses it; the error message is prefixed with the key.
    pub(crate) fn take<T: DeserializeOwned>(&mut self, key: &str) -> Result<Field<T>, String> {
        match self.map.shift_remove(key) {
            None => Ok(Field::Absent),
            Some(Value::Null) => Ok(Field::Null),
            Some(v) => serde_json::from_value(v)
                .map(Field::Set)
                .map_err(|e| format!("{key}: {e}")),
        }
    }

    /// The remaining (unknown) keys and the recorded key order.
    pub(crate) fn finish(self) -> (Map<String, Value>, KeyOrder) {
        (self.map, KeyOrder::Recorded(self.order))
    }
}

/// Builds an object from typed members, then merges the unknown keys and orders the result.
#[derive(Default)]
pub(crate) struct ObjectWriter {
    map: Map<String, Value>,
}

impl ObjectWriter {
    /// Writes `key` unless the field is absent.
    pub(crate) fn put<T: Serialize>(
        &mut self,
        key: &str,
        field: &Field<T>,
    ) -> Result<(), serde_json::Error> {
        match field {
            Field::Absent => {}
            Field::Null => {
                self.map.insert(key.to_owned(), Value::Null);
            }
            Field::Set(v) => {
                self.map.insert(key.to_owned(), serde_json::to_value(v)?);
            }
        }
        Ok(())
    }

    /// Adds `extra` (a typed member wins over an extra key of the same name) and orders the
    /// keys by `order`.
    pub(crate) fn finish(self, extra: &Map<String, Value>, order: &KeyOrder) -> Map<String, Value> {
        let mut all = self.map;
        for (k, v) in extra {
            if !all.contains_key(k) {
                all.insert(k.clone(), v.clone());
            }
        }
        let mut entries: Vec<(String, Value)> = all.into_iter().collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        if let KeyOrder::Recorded(keys) = order {
            let rank: std::collections::HashMap<&str, usize> = keys
                .iter()
                .enumerate()
                .map(|(i, k)| (k.as_str(), i))
                .collect();
            // Stable: unrecorded keys keep their sorted order after the recorded ones.
            entries.sort_by_key(|(k, _)| rank.get(k.as_str()).copied().unwrap_or(usize::MAX));
        }
        entries.into_iter().collect()
    }
}

/// Declares a JSON object type: every member a [`Field`], plus `extra` and `key_order`, with
/// `Serialize`/`Deserialize` that round-trip exactly and a `PartialEq` that ignores key order.
macro_rules! json_object {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$fmeta:meta])* $field:ident : $ty:ty = $key:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Default)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $crate::config::Field<$ty>, )*
            /// Keys this type does not model, kept as read.
            pub extra: serde_json::Map<String, serde_json::Value>,
            /// The order keys are written in.
            pub key_order: $crate::config::KeyOrder,
        }

        impl PartialEq for $name {
            fn eq(&self, other: &Self) -> bool {
                $( self.$field == other.$field && )* self.extra == other.extra
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut w = $crate::config::field::ObjectWriter::default();
                $( w.put($key, &self.$field).map_err(serde::ser::Error::custom)?; )*
                serde::Serialize::serialize(&w.finish(&self.extra, &self.key_order), serializer)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let map: serde_json::Map<String, serde_json::Value> =
                    serde::Deserialize::deserialize(deserializer)?;
                let mut r = $crate::config::field::ObjectReader::new(map);
                $( let $field = r.take($key).map_err(serde::de::Error::custom)?; )*
                let (extra, key_order) = r.finish();
                Ok(Self { $( $field, )* extra, key_order })
            }
        }
    };
}

pub(crate) use json_object;
