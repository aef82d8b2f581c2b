//! Where each declared tensor goes: shard assignment, offsets and header bytes, all decided
//! before any data is written.

use indexmap::IndexMap;
use serde_json::{json, Map, Value};

use crate::checkpoint::Dtype;

/// One output tensor, declared before any data is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// The tensor's name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
}

impl TensorSpec {
    /// A spec from its parts.
    pub fn new(name: impl Into<String>, dtype: Dtype, shape: impl Into<Vec<usize>>) -> Self {
        Self {
            name: name.into(),
            dtype,
            shape: shape.into(),
        }
    }

    /// Bytes of data; `None` when the size overflows `u64`.
    pub fn byte_len(&self) -> Option<u64> {
        self.dtype.byte_len(&self.shape)
    }
}

/// The planned tensors of one shard: indexes into the spec list, header bytes, file size.
#[derive(Debug)]
pub(crate) struct ShardPlan {
    /// Output file name.
    pub name: String,
    /// The length prefix and the padded JSON header.
    pub header: Vec<u8>,
    /// Total file size: header plus data.
    pub file_len: u64,
}

/// Where one tensor's bytes go.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placement {
    pub shard: usize,
    /// Absolute byte offset within the shard file.
    pub offset: u64,
    pub len: u64,
}

/// Splits `sizes` (in declaration order) into contiguous runs of at most `max` bytes; a tensor
/// larger than `max` gets a shard of its own, and an empty tensor never opens a new shard.
/// Returns the shard of each tensor.
pub(crate) fn assign(sizes: &[u64], max: u64) -> Vec<usize> {
    let mut out = Vec::with_capacity(sizes.len());
    let (mut shard, mut used, mut count) = (0usize, 0u64, 0usize);
    for &size in sizes {
        if count > 0 && size > 0 && used.saturating_add(size) > max {
            shard += 1;
            used = 0;
            count = 0;
        }
        out.push(shard);
        used = used.saturating_add(size);
        count += 1;
    }
    out
}

/// The file name of shard `i` (0-based) of `n`: `model.safetensors` when `n == 1`, else
/// `model-0000{i+1}-of-0000{n}.safetensors` as transformers names them.
pub(crate) fn shard_file_name(i: usize, n: usize) -> String {
    if n == 1 {
        "model.safetensors".to_owned()
    } else {
        format!("model-{:05}-of-{:05}.safetensors", i + 1, n)
    }
}

/// The bytes before the data section of a shard holding `tensors` (in this order, with these
/// sizes): `u64 LE N` then the compact JSON header, space-padded to a multiple of 8 bytes,
/// exactly as the `safetensors` crate writes it.
pub(crate) fn header_bytes(
    metadata: Option<&IndexMap<String, String>>,
    tensors: &[(&TensorSpec, u64)],
) -> Vec<u8> {
    let mut root = Map::new();
    if let Some(meta) = metadata {
        let meta: Map<String, Value> = meta
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        root.insert("__metadata__".to_owned(), Value::Object(meta));
    }
    let mut offset = 0u64;
    for (spec, len) in tensors {
        let entry = json!({
            "dtype": spec.dtype.as_str(),
            "shape": spec.shape,
            "data_offsets": [offset, offset + len],
        });
        root.insert(spec.name.clone(), entry);
        offset += len;
    }
    // Serializing a map of strings, numbers and arrays cannot fail.
    let mut json = serde_json::to_vec(&Value::Object(root)).unwrap_or_default();
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignment_is_greedy_and_keeps_order() {
        assert_eq!(assign(&[4, 4, 4, 4], 8), vec![0, 0, 1, 1]);
        assert_eq!(assign(&[4, 20, 4], 8), vec![0, 1, 2]);
        assert_eq!(assign(&[20], 8), vec![0]);
        assert_eq!(assign(&[0, 0, 9, 0], 8), vec![0, 0, 1, 1]);
        assert_eq!(assign(&[], 8), Vec::<usize>::new());
    }

    #[test]
    fn names_follow_transformers() {
        assert_eq!(shard_file_name(0, 1), "model.safetensors");
        assert_eq!(shard_file_name(1, 12), "model-00002-of-00012.safetensors");
    }
}
