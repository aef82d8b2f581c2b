//! The model's shape, as inspect names it: [`fp4forge_arch::ShapeSpec`] (the lenient,
//! sizes-only read of `config.json`: partial configs, `model_type`s the engine does not run), under
//! the names inspect's API has always used.

pub use fp4forge_arch::{
    AttentionKind, LayerShape as LayerArch, MlpShape as Mlp, MoeShape as MoeArch,
    ShapeSpec as Architecture,
};
