#!/usr/bin/env python3
"""Tiny Laguna checkpoints for the builder's tests (crates/builder/tests/fixtures/tiny-laguna/).

  bf16/            a seeded random bf16 LagunaForCausalLM saved by transformers' save_pretrained
  ref_qkvo/        llmcompressor data-free NVFP4A16 on re:.*self_attn\\.(q|k|v|o)_proj$
  ref_all_linear/  data-free NVFP4A16 on every Linear except lm_head, the router and g_proj
  stock/           the vendor stock layout: routed experts NVFP4 (W4A4, calibrated), rest bf16
  ref_stock_qkvo/  stock + attention q/k/v/o NVFP4A16 (same calibration)

Each directory keeps only config.json, model.safetensors (+ index if sharded) and
generation_config.json. See README.md for what each file contains and the surprises found.

Usage:  tools/reference/.venv/bin/python tools/reference/make_laguna_fixtures.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path


import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "crates" / "builder" / "tests" / "fixtures" / "tiny-laguna"
SEED = 20260801
KEEP = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json")

ATTN_QKVO = r"re:.*self_attn\.(q|k|v|o)_proj$"
EXPERTS = r"re:.*mlp\.experts\.\d+\.(gate|up|down)_proj$"
IGNORE = ["lm_head", r"re:.*mlp\.gate$", r"re:.*self_attn\.g_proj$"]

# Calibration: fixed random token ids (seeded), 8 samples x 32 tokens.
CALIB_SAMPLES = 8
CALIB_LEN = 32


def keep_router_bias_fp32() -> None:
    """transformers' LagunaForCausalLM has no _keep_in_fp32_modules, so loading with dtype=bf16
    (or "auto") silently downcasts the F32 e_score_correction_bias to bf16, and save_pretrained
    then writes it as BF16. The real checkpoints and vLLM keep it F32; so do we, by marking it
    keep-in-fp32 before any load. Quantization bytes are unaffected (the bias is never quantized;
    in calibration it only picks experts for the *next* layer's activations)."""
    from transformers import LagunaForCausalLM

    LagunaForCausalLM._keep_in_fp32_modules_strict = ["e_score_correction_bias"]


def tiny_config():
    from transformers import LagunaConfig

    n_layers = 3
    layer_types = ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(n_layers)]
    return LagunaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=n_layers,
        num_attention_heads=4,
        # like the real model: more query heads on sliding layers (S-2.1: 48 full / 72 sliding)
        num_attention_heads_per_layer=[4 if t == "full_attention" else 6 for t in layer_types],
        num_key_value_heads=2,
        head_dim=16,
        layer_types=layer_types,
        mlp_layer_types=["dense"] + ["sparse"] * (n_layers - 1),
        sliding_window=8,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        moe_routed_scaling_factor=2.5,
        gating=True,
        max_position_embeddings=4096,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
        },
        initializer_range=0.05,
        tie_word_embeddings=False,
        bos_token_id=2,
        eos_token_id=[2, 24],
        pad_token_id=9,
    )


def make_bf16(dst: Path) -> dict:
    from transformers import LagunaForCausalLM

    torch.manual_seed(SEED)
    model = LagunaForCausalLM(tiny_config()).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("e_score_correction_bias"):
                # random, non-zero; kept f32 like the real checkpoint
                p.data = (torch.randn(p.shape, generator=gen) * 0.1).to(torch.float32)
            elif p.ndim == 1:  # RMSNorm weights: not all ones
                p.copy_((1.0 + 0.1 * torch.randn(p.shape, generator=gen)).to(p.dtype))
    tmp = Path(tempfile.mkdtemp(prefix="tiny_laguna_"))
    model.save_pretrained(str(tmp))
    keep_only(tmp, dst)
    shutil.rmtree(tmp)
    t = load_tensors(dst)
    for k, v in t.items():
        if v.ndim == 2 and not k.endswith("embed_tokens.weight"):
            std = v.float().std().item()
            assert std > 0.01, f"{k}: std {std} too small"
    return t


def keep_only(src: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        if f.name in KEEP or (f.name.startswith("model-") and f.name.endswith(".safetensors")):
            shutil.copy2(f, dst / f.name)


def load_tensors(d: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def calibration_dataset():
    from datasets import Dataset

    gen = torch.Generator().manual_seed(SEED + 2)
    ids = torch.randint(10, 256, (CALIB_SAMPLES, CALIB_LEN), generator=gen)
    return Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": [[1] * CALIB_LEN] * CALIB_SAMPLES})


def tiny_tokenizer():
    """An in-memory word-level tokenizer over the 256 ids (the dataset is pre-tokenized; oneshot
    only insists on having a processor when a dataset is given). Never saved."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(256)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t9", bos_token="t2",
                                   eos_token="t24")


def quantize(src: Path, dst: Path, recipe, calibrate: bool) -> None:
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.bfloat16)
    kw = {}
    if calibrate:
        kw = dict(dataset=calibration_dataset(), num_calibration_samples=CALIB_SAMPLES,
                  max_seq_length=CALIB_LEN, shuffle_calibration_samples=False,
                  processor=tiny_tokenizer())
    oneshot(model=model, recipe=recipe, **kw)
    tmp = Path(tempfile.mkdtemp(prefix="tiny_laguna_q_"))
    model.save_pretrained(str(tmp), save_compressed=True)
    keep_only(tmp, dst)
    shutil.rmtree(tmp)


def main() -> None:
    from llmcompressor.modifiers.quantization import QuantizationModifier

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    keep_router_bias_fp32()

    src = out / "bf16"
    bf16 = make_bf16(src)

    quantize(src, out / "ref_qkvo",
             QuantizationModifier(targets=[ATTN_QKVO], scheme="NVFP4A16"), calibrate=False)
    quantize(src, out / "ref_all_linear",
             QuantizationModifier(targets="Linear", scheme="NVFP4A16", ignore=IGNORE), calibrate=False)
    quantize(src, out / "stock",
             QuantizationModifier(scheme={"NVFP4": [EXPERTS]}, ignore=IGNORE), calibrate=True)
    quantize(src, out / "ref_stock_qkvo",
             QuantizationModifier(scheme={"NVFP4": [EXPERTS], "NVFP4A16": [ATTN_QKVO]}, ignore=IGNORE),
             calibrate=True)

    report(out, bf16)


FUSED = {"q_proj": ("q_proj", "k_proj", "v_proj"), "k_proj": ("q_proj", "k_proj", "v_proj"),
         "v_proj": ("q_proj", "k_proj", "v_proj"), "gate_proj": ("gate_proj", "up_proj"),
         "up_proj": ("gate_proj", "up_proj")}


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.dtype != torch.uint8 else t


def report(out: Path, bf16: dict) -> None:
    """Checks every quantized dir against the source and the numpy reference; fails loudly."""
    import numpy as np
    from make_numerics_fixtures import ref_global_scale, ref_quantize

    problems = []
    print("bf16/ keys of layer 1 (expert 0 shown):")
    for k in sorted(bf16):
        if k.startswith("model.layers.1.") and not any(f".experts.{e}." in k for e in range(1, 64)):
            print(f"  {k} {str(bf16[k].dtype).split('.')[-1]} {list(bf16[k].shape)}")
    for d in ("ref_qkvo", "ref_all_linear", "stock", "ref_stock_qkvo"):
        t = load_tensors(out / d)
        quant = sorted({k.rsplit(".", 1)[0] for k in t if k.endswith(".weight_packed")})
        for k in bf16:
            mod = k.rsplit(".", 1)[0]
            if mod in quant:
                continue
            if k not in t:
                problems.append(f"{d}: {k} missing")
            elif t[k].dtype != bf16[k].dtype or not torch.equal(raw_bytes(t[k]), raw_bytes(bf16[k])):
                problems.append(f"{d}: untouched tensor {k} changed ({bf16[k].dtype} -> {t[k].dtype})")
        extra = [k for k in t if k not in bf16 and k.rsplit(".", 1)[0] not in quant]
        if extra:
            problems.append(f"{d}: unexpected tensors {extra[:5]}")
        groups, seen = [], set()
        for m in quant:
            parent, leaf = m.rsplit(".", 1)
            grp = tuple(f"{parent}.{x}" for x in FUSED.get(leaf, (leaf,)) if f"{parent}.{x}" in quant)
            if grp not in seen:
                seen.add(grp)
                groups.append(grp)
        for grp in groups:
            gs = {float(t[f"{m}.weight_global_scale"][0]) for m in grp}
            if len(gs) != 1:
                problems.append(f"{d}: fused {grp} has unequal global scales {gs}")
            amax = max(bf16[f"{m}.weight"].float().abs().max().item() for m in grp)
            g = ref_global_scale(amax, "bf16")
            for m in grp:
                if np.float32(t[f"{m}.weight_global_scale"][0]) != g:
                    problems.append(f"{d}: {m} global scale != reference {g}")
                p, q = ref_quantize(bf16[f"{m}.weight"].float().numpy(), g, "bf16")
                if not np.array_equal(p, t[f"{m}.weight_packed"].numpy()):
                    problems.append(f"{d}: {m} weight_packed != reference")
                if not np.array_equal(q, t[f"{m}.weight_scale"].float().numpy()):
                    problems.append(f"{d}: {m} weight_scale != reference")
        n_in = sum(k.endswith(".input_global_scale") for k in t)
        print(f"{d}: {len(t)} tensors, {len(quant)} NVFP4 modules in {len(groups)} global-scale groups, "
              f"{n_in} input_global_scale; untouched tensors byte-identical to bf16/; "
              f"all NVFP4 bytes equal the spec reference")
    stock = load_tensors(out / "stock")
    both = load_tensors(out / "ref_stock_qkvo")
    exp = [k for k in stock if ".mlp.experts." in k]
    diff = [k for k in exp if k not in both or stock[k].dtype != both[k].dtype
            or not torch.equal(raw_bytes(stock[k]), raw_bytes(both[k]))]
    print(f"stock vs ref_stock_qkvo: {len(exp)} expert tensors, {len(diff)} differ")
    for k in diff:
        problems.append(f"expert tensor {k} differs between stock/ and ref_stock_qkvo/")
    for d in ("ref_qkvo", "ref_all_linear", "stock", "ref_stock_qkvo"):
        cfg = json.loads((out / d / "config.json").read_text())
        print(f"{d}/config.json quantization_config:")
        print(json.dumps(cfg.get("quantization_config"), sort_keys=True))
    if problems:
        print("PROBLEMS:")
        for p in problems:
            print("  " + p)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
