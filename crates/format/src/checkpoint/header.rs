//! Parsing and validation of a safetensors header, on the bytes of a whole file.
//!
//! Layout: `u64 LE N`, then N bytes of UTF-8 JSON, then the data section. The JSON maps each
//! tensor name to `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets relative to the
//! data section) plus an optional `"__metadata__"` map of strings. A valid file has tensors that
//! tile the data section exactly: sorted by offset they start at 0, follow each other without
//! gap or overlap, each spans `product(shape) × dtype size` bytes, and the last ends at the end
//! of the file. Everything is checked with overflow-safe arithmetic; nothing here panics.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use indexmap::IndexMap;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use super::{CheckpointError, Dtype};

/// Largest accepted JSON header, in bytes (the limit of the `safetensors` crate).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// Bytes of the little-endian length prefix.
const PREFIX_LEN: usize = 8;

/// The name of the header's free-form string map.
const METADATA_KEY: &str = "__metadata__";

/// One tensor of a safetensors file, as its header describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions, outermost first (row-major data).
    pub shape: Vec<usize>,
    /// Byte range within the data section (the header's `data_offsets`).
    pub data_offsets: Range<usize>,
}

impl TensorInfo {
    /// Number of elements (product of the shape; 1 for a scalar). Exact for a parsed header,
    /// which was checked not to overflow; saturates otherwise.
    pub fn numel(&self) -> usize {
        self.shape.iter().fold(1usize, |n, &d| n.saturating_mul(d))
    }

    /// Bytes of data (`end - begin` of `data_offsets`).
    pub fn byte_len(&self) -> usize {
        self.data_offsets.len()
    }
}

/// A validated safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafetensorsHeader {
    /// N, the JSON length given by the prefix (including any padding).
    pub header_len: usize,
    /// The `__metadata__` map, in file order; `None` when absent or `null`.
    pub metadata: Option<IndexMap<String, String>>,
    /// The tensors, in data order (ascending offsets).
    pub tensors: Vec<TensorInfo>,
}

impl SafetensorsHeader {
    /// Parses and validates the header of `file` (the whole file's bytes); `path` only names
    /// the file in errors.
    pub fn parse(path: &Path, file: &[u8]) -> Result<Self, CheckpointError> {
        let header_err = |reason: String| CheckpointError::Header {
            path: path.to_path_buf(),
            reason,
        };
        let prefix: [u8; PREFIX_LEN] = file
            .get(..PREFIX_LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| {
                header_err(format!(
                    "file is {} bytes, shorter than the 8-byte length prefix",
                    file.len()
                ))
            })?;
        let n = u64::from_le_bytes(prefix);
        if n > MAX_HEADER_LEN {
            return Err(header_err(format!(
                "header length {n} exceeds the {MAX_HEADER_LEN}-byte limit"
            )));
        }
        let available = (file.len() - PREFIX_LEN) as u64;
        if n > available {
            return Err(header_err(format!(
                "header length {n} exceeds the {available} bytes after the prefix (truncated file?)"
            )));
        }
        // n <= available < usize::MAX, so these conversions and additions are exact.
        let header_len = n as usize;
        let data_start = PREFIX_LEN + header_len;
        let json = &file[PREFIX_LEN..data_start];
        let data_len = file.len() - data_start;

        let UniqueKeys(root) = serde_json::from_slice(json)
            .map_err(|e| header_err(format!("header is not valid JSON: {e}")))?;
        let Value::Object(root) = root else {
            return Err(header_err("header JSON is not an object".into()));
        };

        let mut metadata = None;
        let mut tensors = Vec::with_capacity(root.len());
        for (name, entry) in root {
            if name == METADATA_KEY {
                metadata = parse_metadata(entry).map_err(header_err)?;
                continue;
            }
            let info = parse_entry(&name, entry).map_err(|reason| CheckpointError::Tensor {
                path: path.to_path_buf(),
                tensor: name.clone(),
                reason,
            })?;
            tensors.push(info);
        }
        // Stable: zero-sized tensors sharing an offset keep their header order.
        tensors.sort_by_key(|t| (t.data_offsets.start, t.data_offsets.end));
        check_tiling(path, &tensors, data_len)?;
        Ok(Self {
            header_len,
            metadata,
            tensors,
        })
    }

    /// Byte offset of the data section within the file (`8 + N`).
    pub fn data_start(&self) -> usize {
        PREFIX_LEN + self.header_len
    }

    /// Map from tensor name to its position in [`SafetensorsHeader::tensors`].
    pub(crate) fn name_index(&self) -> HashMap<String, usize> {
        self.tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect()
    }
}

/// A JSON value in which no object repeats a key, at any depth. `serde_json::Value` keeps the
/// last of repeated keys, which would let a corrupted header hide a broken tensor entry behind a
/// later one of the same name; the `safetensors` crate rejects such a file, and so do we.
struct UniqueKeys(Value);

impl<'de> Deserialize<'de> for UniqueKeys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(UniqueKeysVisitor)
            .map(UniqueKeys)
    }
}

/// Builds a [`Value`] like serde_json's own, failing on the first repeated object key.
struct UniqueKeysVisitor;

impl<'de> Visitor<'de> for UniqueKeysVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom(format!("number {v} is not finite")))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(UniqueKeys(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let UniqueKeys(value) = map.next_value()?;
            if object.contains_key(&key) {
                return Err(de::Error::custom(format!("key `{key}` appears twice")));
            }
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

fn parse_metadata(entry: Value) -> Result<Option<IndexMap<String, String>>, String> {
    match entry {
        Value::Null => Ok(None),
        Value::Object(map) => map
            .into_iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k, s)),
                other => Err(format!(
                    "`__metadata__.{k}` must be a string, found {}",
                    kind(&other)
                )),
            })
            .collect::<Result<_, _>>()
            .map(Some),
        other => Err(format!(
            "`__metadata__` must be an object of strings, found {}",
            kind(&other)
        )),
    }
}

fn parse_entry(name: &str, entry: Value) -> Result<TensorInfo, String> {
    let Value::Object(mut obj) = entry else {
        return Err(format!("entry must be an object, found {}", kind(&entry)));
    };
    let dtype = match take(&mut obj, "dtype")? {
        Value::String(s) => s.parse::<Dtype>().map_err(|e| e.to_string())?,
        other => return Err(format!("`dtype` must be a string, found {}", kind(&other))),
    };
    let shape = usize_array(take(&mut obj, "shape")?, "shape")?;
    let offsets = usize_array(take(&mut obj, "data_offsets")?, "data_offsets")?;
    let [begin, end] = offsets[..] else {
        return Err(format!(
            "`data_offsets` must hold 2 numbers, found {}",
            offsets.len()
        ));
    };
    if end < begin {
        return Err(format!(
            "`data_offsets` [{begin}, {end}] end before they begin"
        ));
    }
    let expected = dtype
        .byte_len(&shape)
        .ok_or_else(|| format!("shape {shape:?} × {dtype} overflows"))?;
    if (end - begin) as u64 != expected || usize::try_from(expected).is_err() {
        return Err(format!(
            "`data_offsets` [{begin}, {end}] span {} bytes, but shape {shape:?} of {dtype} needs {expected}",
            end - begin
        ));
    }
    Ok(TensorInfo {
        name: name.to_owned(),
        dtype,
        shape,
        data_offsets: begin..end,
    })
}

/// Checks that the sorted tensors tile `0..data_len` exactly.
fn check_tiling(
    path: &Path,
    tensors: &[TensorInfo],
    data_len: usize,
) -> Result<(), CheckpointError> {
    let mut cursor = 0usize;
    for t in tensors {
        let Range { start, end } = t.data_offsets;
        if start != cursor {
            let what = if start < cursor { "overlap" } else { "gap" };
            return Err(CheckpointError::Tensor {
                path: path.to_path_buf(),
                tensor: t.name.clone(),
                reason: format!(
                    "data_offsets [{start}, {end}] leave a {what}: the previous tensor ends at {cursor}"
                ),
            });
        }
        if end > data_len {
            return Err(CheckpointError::Truncated {
                path: path.to_path_buf(),
                tensor: t.name.clone(),
                needed: end as u64,
                available: data_len as u64,
            });
        }
        cursor = end;
    }
    if cursor != data_len {
        return Err(CheckpointError::Header {
            path: path.to_path_buf(),
            reason: format!(
                "{} bytes after the last tensor's data (data section is {data_len} bytes, tensors cover {cursor})",
                data_len - cursor
            ),
        });
    }
    Ok(())
}

fn take(obj: &mut Map<String, Value>, key: &str) -> Result<Value, String> {
    obj.remove(key).ok_or_else(|| format!("missing `{key}`"))
}

fn usize_array(value: Value, field: &str) -> Result<Vec<usize>, String> {
    let Value::Array(items) = value else {
        return Err(format!(
            "`{field}` must be an array, found {}",
            kind(&value)
        ));
    };
    items
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| format!("`{field}` holds {v}, not a non-negative integer"))
        })
        .collect()
}

/// A short name for the JSON type of `v`, for messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
