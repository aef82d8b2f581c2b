//! The unquantized tensor set an architecture implies ([`fp4forge_arch::ShapeSpec::tensors`]:
//! the family's HF checkpoint names and shapes), as inspect's [`TensorDesc`]s.

use super::arch::Architecture;
use super::tensor::TensorDesc;
use crate::BuilderError;

/// Every tensor of the unquantized checkpoint, in model order; `source` names the config in
/// errors. Fails (naming `model_type`) for a `model_type` whose tensor names no family knows.
pub fn unquantized_tensors(
    arch: &Architecture,
    source: &str,
) -> Result<Vec<TensorDesc>, BuilderError> {
    let tensors = arch.tensors().map_err(|e| match BuilderError::from(e) {
        BuilderError::Config { field, reason, .. } => BuilderError::Config {
            source_name: source.to_string(),
            field,
            reason,
        },
        other => other,
    })?;
    Ok(tensors
        .into_iter()
        .map(|t| TensorDesc::new(t.name, t.dtype, t.shape))
        .collect())
}
