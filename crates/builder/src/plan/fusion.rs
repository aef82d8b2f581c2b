//! Fused sibling groups that share one NVFP4 global scale, exactly as llmcompressor's
//! `FUSED_LAYER_NAMES` links observers: siblings with these leaf names under one parent module.

use std::collections::BTreeMap;

/// Leaf-name sets whose members (under the same parent) share a global scale.
pub const FUSED_LAYER_NAMES: [&[&str]; 4] = [
    &["q_proj", "k_proj", "v_proj"],
    &["gate_proj", "up_proj"],
    &["q_a_proj", "kv_a_proj_with_mqa"],
    &["w1", "w3"],
];

/// `(parent, leaf)` of a module name.
pub fn split_leaf(module: &str) -> (&str, &str) {
    module.rsplit_once('.').unwrap_or(("", module))
}

/// The fusion key of a module (`parent` + index into [`FUSED_LAYER_NAMES`]), if it is fusable.
pub fn fusion_key(module: &str) -> Option<(String, usize)> {
    let (parent, leaf) = split_leaf(module);
    FUSED_LAYER_NAMES
        .iter()
        .position(|set| set.contains(&leaf))
        .map(|i| (parent.to_string(), i))
}

/// Partition `modules` (names, in order) into global-scale groups: fused siblings together (in
/// the order given), everything else alone. Groups are ordered by their first member.
pub fn global_scale_groups<'a>(modules: impl IntoIterator<Item = &'a str>) -> Vec<Vec<&'a str>> {
    let mut groups: Vec<Vec<&'a str>> = Vec::new();
    let mut by_key: BTreeMap<(String, usize), usize> = BTreeMap::new();
    for m in modules {
        match fusion_key(m) {
            Some(key) => match by_key.get(&key) {
                Some(&i) => groups[i].push(m),
                None => {
                    by_key.insert(key, groups.len());
                    groups.push(vec![m]);
                }
            },
            None => groups.push(vec![m]),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qkv_and_gate_up_fuse_per_parent() {
        let names = [
            "l0.self_attn.q_proj",
            "l0.self_attn.k_proj",
            "l0.self_attn.v_proj",
            "l0.self_attn.o_proj",
            "l0.mlp.experts.0.gate_proj",
            "l0.mlp.experts.0.up_proj",
            "l0.mlp.experts.0.down_proj",
            "l0.mlp.experts.1.gate_proj",
            "l0.mlp.experts.1.up_proj",
            "l1.self_attn.q_proj",
        ];
        let groups = global_scale_groups(names);
        assert_eq!(
            groups[0],
            [
                "l0.self_attn.q_proj",
                "l0.self_attn.k_proj",
                "l0.self_attn.v_proj"
            ]
        );
        assert_eq!(groups[1], ["l0.self_attn.o_proj"]);
        assert_eq!(
            groups[2],
            ["l0.mlp.experts.0.gate_proj", "l0.mlp.experts.0.up_proj"]
        );
        assert_eq!(groups[3], ["l0.mlp.experts.0.down_proj"]);
        assert_eq!(
            groups[4],
            ["l0.mlp.experts.1.gate_proj", "l0.mlp.experts.1.up_proj"]
        );
        assert_eq!(groups[5], ["l1.self_attn.q_proj"]);
        assert_eq!(groups.len(), 6);
    }
}
