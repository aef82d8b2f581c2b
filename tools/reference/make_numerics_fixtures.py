#!/usr/bin/env python3
"""Golden vectors for fp4forge's numerics (crates/format/tests/fixtures/).

Produces, from the REAL reference implementations (torch, compressed-tensors 0.20.1,
llmcompressor 0.14.0.1; see requirements.txt):

  fp8_e4m3_table.safetensors  every bf16 bit pattern -> torch's fp8 e4m3fn cast (raw and saturated)
  e2m1_sweep.safetensors      dense f32 sweep around every E2M1 rounding threshold -> 4-bit code,
                              through compressed-tensors' CPU quantize + pack with scale = global = 1
  nvfp4_cases.safetensors     Linear weights quantized by llmcompressor's data-free NVFP4A16 flow
  nvfp4_cases.json            which modules share one global scale (fused groups), dtypes, notes

Every output is also checked against an independent numpy re-statement of the rules in
shared/spec/nvfp4-format.md (section 1); a mismatch is reported and makes the script fail.

Usage:  tools/reference/.venv/bin/python tools/reference/make_numerics_fixtures.py [--out DIR] [--only fp8,e2m1,nvfp4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "crates" / "format" / "tests" / "fixtures"

FP8_MAX = 448.0
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)


# --------------------------------------------------------------------------------------------
# independent numpy reference (spec section 1), used only to cross-check the real libraries
# --------------------------------------------------------------------------------------------

def round_bf16(x: np.ndarray) -> np.ndarray:
    """f32 -> nearest-even bf16, returned as f32 (finite values)."""
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if dtype == "bf16":
        return round_bf16(x)
    if dtype == "f16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    return x


def fp8_e4m3_rne_value(t: np.ndarray) -> np.ndarray:
    """Nearest-even fp8 e4m3fn value of non-negative finite t <= 448 (as f32)."""
    t = np.asarray(t, dtype=np.float64)
    out = np.zeros_like(t)
    sub = t < 2.0 ** -6
    out[sub] = np.round(t[sub] / 2.0 ** -9) * 2.0 ** -9  # np.round is half-to-even
    n = ~sub
    e = np.floor(np.log2(t[n]))
    m = t[n] / 2.0 ** e  # in [1, 2)
    out[n] = np.round(m * 8) / 8 * 2.0 ** e
    return out.astype(np.float32)


def e2m1_code(v: np.ndarray) -> np.ndarray:
    """Spec 1.5: threshold chain (RNE on the E2M1 grid), sign bit iff v < 0."""
    v = np.clip(np.asarray(v, dtype=np.float32), -6, 6)
    a = np.abs(v)
    idx = np.select(
        [a <= 0.25, a < 0.75, a <= 1.25, a < 1.75, a <= 2.5, a < 3.5, a <= 5.0],
        [0, 1, 2, 3, 4, 5, 6],
        default=7,
    ).astype(np.uint8)
    return idx | np.where(v < 0, 8, 0).astype(np.uint8)


def ref_global_scale(amax: float, dtype: str) -> np.float32:
    """Spec 1.3, generalised: both ops rounded to the weight dtype (torch: reciprocal * 2688)."""
    tiny = {"bf16": 2.0 ** -126, "f16": 2.0 ** -14, "f32": 2.0 ** -126}[dtype]
    a = np.float32(max(float(amax), tiny))
    with np.errstate(over="ignore", divide="ignore"):
        r = round_to(np.float32(1.0) / a, dtype)
        g = round_to(np.float32(r) * np.float32(2688.0), dtype)
    g = np.float32(g)
    if not np.isfinite(g):
        g = np.float32(1.0)
    return g


def ref_quantize(w: np.ndarray, g: np.float32, dtype: str):
    """Spec 1.4 + 1.5 + 2.1 for a [out, in] weight given as f32 values of the weight dtype."""
    out, inn = w.shape
    blk = w.reshape(out, inn // 16, 16)
    a = np.abs(blk).max(axis=2).astype(np.float32)
    s = round_to(a / np.float32(6.0), dtype)
    t = np.minimum(np.float32(g) * s, np.float32(FP8_MAX)).astype(np.float32)
    q = fp8_e4m3_rne_value(t)
    q = np.where(q == 0, np.float32(0.125), q).astype(np.float32)
    se = (q / np.float32(g)).astype(np.float32)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        v = (blk / se[:, :, None]).astype(np.float32)
    codes = e2m1_code(v).reshape(out, inn)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, q


# --------------------------------------------------------------------------------------------
# a) fp8 e4m3 table
# --------------------------------------------------------------------------------------------

def make_fp8_table(out_dir: Path) -> None:
    inp = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    raw = inp.to(torch.float8_e4m3fn)
    saturated = inp.float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    # sanity: NaN inputs stay NaN, the clamp saturates infinities, raw gives NaN out of range
    nan_in = torch.isnan(inp)
    assert torch.isnan(saturated.float()[nan_in]).all()
    assert not torch.isnan(saturated.float()[~nan_in]).any()
    assert saturated.float()[~nan_in].abs().max() == FP8_MAX
    # cross-check finite in-range values against the numpy RNE reference
    f = inp.float().numpy()
    ok = np.isfinite(f) & (np.abs(f) <= FP8_MAX)
    ref = np.sign(f[ok]) * fp8_e4m3_rne_value(np.abs(f[ok]))
    got = saturated.float().numpy()[ok]
    bad = np.flatnonzero(ref != got)
    if bad.size:
        raise SystemExit(f"fp8 table disagrees with numpy RNE reference at {bad.size} entries")
    save_file({"input": inp.contiguous(), "raw": raw.contiguous(), "saturated": saturated.contiguous()},
              str(out_dir / "fp8_e4m3_table.safetensors"),
              # one metadata key only: safetensors writes metadata in hash order
              metadata={"producer": f"torch {torch.__version__}; raw = input.to(torch.float8_e4m3fn); "
                                    "saturated = input.float().clamp(-448, 448).to(torch.float8_e4m3fn)"})
    n_raw_nan = int(torch.isnan(raw.float()).sum())
    print(f"fp8_e4m3_table: 65536 entries, raw NaNs {n_raw_nan}, saturated NaNs {int(nan_in.sum())}")


# --------------------------------------------------------------------------------------------
# b) E2M1 sweep through compressed-tensors' CPU path
# --------------------------------------------------------------------------------------------

def e2m1_sweep_inputs() -> np.ndarray:
    vals: list[float] = []
    thresholds = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0]
    for t in thresholds:
        for sgn in (1.0, -1.0):
            c = np.float32(sgn * t)
            lo = c
            hi = c
            vals.append(float(c))
            for _ in range(64):
                lo = np.nextafter(lo, np.float32(-np.inf), dtype=np.float32)
                hi = np.nextafter(hi, np.float32(np.inf), dtype=np.float32)
                vals.append(float(lo))
                vals.append(float(hi))
    # E2M1 grid points themselves and their midpoints
    for v in E2M1_VALUES:
        vals += [float(v), -float(v)]
    # zeros, tiny values, subnormals
    tiny = [0.0, -0.0, 1e-45, -1e-45, 1e-38, -1e-38, 1e-30, -1e-30, 1e-6, -1e-6, 0.1, -0.1, 0.24, -0.24]
    vals += tiny
    # beyond +-6
    vals += [6.5, -6.5, 7.0, -7.0, 8.0, -8.0, 12.0, -12.0, 448.0, -448.0, 1e4, -1e4, 1e30, -1e30,
             3.4e38, -3.4e38, float("inf"), float("-inf")]
    # a regular grid over [-8, 8]
    vals += list(np.linspace(-8.0, 8.0, 1025, dtype=np.float32).astype(float))
    # random values
    rng = np.random.default_rng(1234)
    vals += list((rng.standard_normal(512) * 3).astype(np.float32).astype(float))
    arr = np.array(vals, dtype=np.float32)
    pad = (-arr.size) % 16
    return np.concatenate([arr, np.zeros(pad, dtype=np.float32)])


def make_e2m1_sweep(out_dir: Path) -> None:
    from compressed_tensors.compressors.nvfp4.helpers import quantize_and_pack_fp4
    from compressed_tensors.quantization.lifecycle import forward_helpers

    x_np = e2m1_sweep_inputs()
    n = x_np.size
    x = torch.from_numpy(x_np.copy()).reshape(n // 16, 16)
    scale = torch.ones(n // 16, 1, dtype=torch.float32)
    gscale = torch.ones(1, dtype=torch.float32)

    # Verify that the CPU path really computes x / (scale / global_scale): spy on _quantize.
    seen = {}
    orig = forward_helpers._quantize

    def spy(x, scale, zero_point, q_min, q_max, args, dtype=None, global_scale=None):
        seen["x"], seen["scale"], seen["global"] = x.clone(), scale.clone(), global_scale
        return orig(x, scale, zero_point, q_min, q_max, args, dtype=dtype, global_scale=global_scale)

    forward_helpers._quantize = spy
    try:
        assert not x.is_cuda  # CPU fallback of the ImplBackend dispatch
        packed = quantize_and_pack_fp4(x.clone(), scale, global_scale=gscale, group_size=16)
    finally:
        forward_helpers._quantize = orig
    assert "x" in seen, "compressed-tensors did not go through forward_helpers._quantize"
    assert torch.equal(seen["scale"], torch.ones_like(seen["scale"])) and torch.equal(seen["global"], gscale)
    eff = seen["scale"] / seen["global"]
    assert torch.equal(eff, torch.ones_like(eff)), "effective scale is not exactly 1"
    sx = seen["x"].reshape(-1)
    assert torch.equal(sx.view(torch.int32), x.reshape(-1).view(torch.int32)), "input was altered before division"

    p = packed.numpy().reshape(-1)
    codes = np.empty(n, dtype=np.uint8)
    codes[0::2] = p & 0xF
    codes[1::2] = p >> 4
    ref = e2m1_code(x_np)
    bad = np.flatnonzero(ref != codes)
    if bad.size:
        for i in bad[:20]:
            print(f"  mismatch x={x_np[i]!r} ct=0x{codes[i]:x} ref=0x{ref[i]:x}")
        raise SystemExit(f"e2m1 sweep: {bad.size} codes disagree with the spec's threshold rule")
    save_file({"input": torch.from_numpy(x_np), "codes": torch.from_numpy(codes)},
              str(out_dir / "e2m1_sweep.safetensors"),
              metadata={"producer": "compressed_tensors.compressors.nvfp4.helpers.quantize_and_pack_fp4 (CPU) "
                                    "with scale=1, global_scale=1; codes unpacked low nibble first"})
    print(f"e2m1_sweep: {n} elements, codes agree with spec rule")


# --------------------------------------------------------------------------------------------
# c) NVFP4 cases through llmcompressor's data-free NVFP4A16 flow
# --------------------------------------------------------------------------------------------

def bf16_bits(vals) -> torch.Tensor:
    return torch.tensor(vals, dtype=torch.float32).to(torch.bfloat16)


def spec_ex1() -> torch.Tensor:
    row0 = [(i - 16) * 0.125 for i in range(32)]
    row1 = [0.01 * (-1) ** i * (i + 1) for i in range(32)]
    return torch.tensor([row0, row1], dtype=torch.float32)


def spec_ex2() -> torch.Tensor:
    r = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 6, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5, -6]
    row0 = r + r[::-1]
    h = [0, -0.0, 0.1, -0.1, 0.26, -0.26, 7, -7, 0.5, 1, 1.5, 2, 3, 4, 4.5, -4.5]
    row1 = h + h
    return torch.tensor([row0, row1], dtype=torch.float32)


def spec_ex3() -> torch.Tensor:
    row0 = list(np.linspace(-0.3, 0.3, 16).astype(float)) + [5e-6, -5e-6] * 8
    row1 = [1e-9, -1e-9] * 8 + [-1e-3] + [0.02] * 15
    return torch.tensor([row0, row1], dtype=torch.float32)


# Bytes printed in spec section 7 (global scale f32 LE, per row: packed, scale).
SPEC_EXPECT = {
    "spec.ex1": ("0000a844", [("ffefeededdccab9a1022435465667677", "7e7d"),
                              ("91b2c4d5e5e6f6f7d5e6e6e6e6f7f7f7", "6169")]),
    "spec.ex2": ("0000c043", [("20426476a8caecfeefceac8a67462402", "7c7c"),
                              ("008080f7213355e6008080f7213355e6", "7e7e")]),
    "spec.ex3": ("00000c46", [("ffeecd9a21546677f7f7f7f7f7f7f7f7", "7e04"),
                              ("80808080808080807977777777777777", "205f")]),
    "spec.ex4": ("0000803f", [("00" * 16, "2020"), ("00" * 16, "2020")]),
}


def case_tensors(dtype: str) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """Returns {module_name: weight (in the model dtype)} and the list of groups."""
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dtype]
    gen = torch.Generator().manual_seed({"bf16": 1, "f16": 2, "f32": 3}[dtype])

    def randn(o, i, std=1.0):
        return (torch.randn(o, i, generator=gen) * std).to(tdt)

    cases: dict[str, torch.Tensor] = {}
    groups: list[dict] = []

    def single(name, w, note):
        cases[name] = w.to(tdt)
        groups.append({"members": [name], "dtype": dtype, "note": note})

    if dtype == "bf16":
        for o, i in [(16, 16), (32, 64), (64, 256), (128, 1024), (3, 48)]:
            single(f"rand.r{o}x{i}", randn(o, i, 0.02 if o == 128 else 1.0), f"random normal {o}x{i}")
        single("spec.ex1", spec_ex1(), "spec section 7 Ex1 (ramp; small alternating row)")
        single("spec.ex2", spec_ex2(), "spec section 7 Ex2 (exact rounding ties, signed zeros)")
        single("spec.ex3", spec_ex3(), "spec section 7 Ex3 (fp8-subnormal scale, eps 0x20)")
        single("spec.ex4", torch.zeros(2, 32), "spec section 7 Ex4 (all-zero tensor, g = 1.0)")
        # ties at many scales: multiples of a power of two times E2M1 midpoints
        w = randn(8, 64)
        mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
        for r in range(8):
            k = 2.0 ** (r - 4)
            w[r, :16] = (torch.cat([mids, -mids]) * k).to(tdt)
        single("edge.ties", w, "rows whose first block is exactly E2M1 midpoints times 2^k")
        w = randn(16, 128)
        w[0, :16] = 0
        w[3, 32:64] = 0
        w[7, 112:] = 0
        w[:, 80:96] = 0
        single("edge.zero_blocks", w, "nonzero tensor with all-zero 16-blocks (scale 0x20)")
        single("edge.all_zero", torch.zeros(8, 64), "all-zero tensor (g = 1.0, scales 0x20)")
        # block amaxes sweeping from 1 down to 1e-9: normal, subnormal and underflowing fp8 scales
        rows = 32
        w = torch.empty(rows, 64)
        expo = torch.linspace(0, -9, rows * 4).reshape(rows, 4)
        for r in range(rows):
            for j in range(4):
                blk = torch.rand(16, generator=gen) * 2 - 1
                blk = blk / blk.abs().max() * (10.0 ** expo[r, j])
                w[r, 16 * j:16 * j + 16] = blk
        single("edge.scale_underflow", w,
               "block amax from 1 down to 1e-9: fp8-subnormal block scales and underflow to eps 0x20")
        w = randn(8, 64) * 1e-3
        w[0, ::2] = -0.0
        w[1, :] = -0.0
        w[2, :32] = -1e-7
        w[3, :] = torch.tensor([-1e-7, 1e-7] * 32)
        w[4, 0] = 1.0
        w[5, :16] = torch.tensor([-0.0, 0.0] * 8)
        single("edge.neg_zero", w, "-0.0 entries (code 0x0) and tiny negatives (code 0x8)")
        single("edge.scaled_1e30", (torch.randn(16, 64, generator=gen).to(tdt) * 1e-30).to(tdt),
               "random bf16 times 1e-30 (bf16 arithmetic)")
        w = randn(16, 64) * 0.01
        w[5, 17] = w.abs().max().float() * 1e4
        single("edge.outlier", w, "one element 1e4x larger than the rest")
        w = randn(4, 32) * 1e37
        w[0, 0] = 3.3895e38
        w[2, 5] = -3.3e38
        single("edge.near_max", w, "values near bf16 max (1/amax is a bf16 subnormal)")
        # pick an amax whose bf16 double rounding makes g * bf16(amax/6) exceed 448 (scale clamps)
        sat = next(float(a) for a in torch.linspace(1.0, 2.0, 257).to(tdt).float()
                   if float(ref_global_scale(float(a), "bf16")) * float(round_bf16(np.float32(float(a) / 6.0)))
                   > FP8_MAX)
        w = randn(4, 32) * 0.2
        w[1, 3] = sat
        single("edge.saturate", w, f"amax {sat}: g * bf16(amax/6) > 448, the fp8 block scale clamps at 448")
    elif dtype == "f16":
        single("rand.r32x64", randn(32, 64), "random normal fp16")
        single("rand.r16x256", randn(16, 256, 0.05), "random normal fp16, std 0.05")
        single("edge.small_amax", (torch.rand(16, 64, generator=gen) * 2 - 1).mul(0.03).to(tdt),
               "fp16 amax < 0.041: 2688/amax overflows fp16 -> inf -> g = 1.0")
        w = (torch.rand(8, 64, generator=gen) * 2 - 1).mul(0.041).to(tdt)
        w[0, 0] = 0.041015625
        single("edge.amax_0p041", w, "fp16 amax at the overflow boundary 2688/65504")
        single("edge.tiny", (torch.randn(8, 64, generator=gen) * 1e-6).to(tdt),
               "fp16 tiny values (fp16 subnormals)")
        single("edge.all_zero", torch.zeros(4, 32), "fp16 all-zero")
        w = randn(8, 64)
        w[0, :16] = 0
        w[1, 16:32] = 1e-5
        single("edge.mixed", w, "fp16 random with a zero block and a tiny block")
    else:
        single("rand.r32x64", randn(32, 64), "random normal f32")
        single("rand.r16x256", randn(16, 256, 0.05), "random normal f32, std 0.05")
        single("edge.scaled_1e30", randn(16, 64) * 1e-30, "random f32 times 1e-30")
        single("edge.all_zero", torch.zeros(4, 32), "f32 all-zero")
        w = randn(8, 64) * 0.1
        w[1, 16:32] = 1e-9
        w[2, 0] = 5.0
        single("edge.mixed", w, "f32 random with tiny block and an outlier")

    # fused groups: q/k/v share one global scale, gate/up share one; o_proj/down_proj alone
    L = "model.layers.0"
    q = randn(64, 64, 0.5)
    k = randn(32, 64, 0.05)
    v = randn(32, 64, 2.0)
    o = randn(64, 64, 0.01)
    for n_, w in [("q_proj", q), ("k_proj", k), ("v_proj", v), ("o_proj", o)]:
        cases[f"{L}.self_attn.{n_}"] = w
    groups.append({"members": [f"{L}.self_attn.{n}" for n in ("q_proj", "k_proj", "v_proj")],
                   "dtype": dtype, "note": "fused q/k/v: one global scale from the union amax"})
    groups.append({"members": [f"{L}.self_attn.o_proj"], "dtype": dtype, "note": "o_proj is never fused"})
    gate, up, down = randn(96, 64, 0.02), randn(96, 64, 0.3), randn(64, 96, 0.1)
    for n_, w in [("gate_proj", gate), ("up_proj", up), ("down_proj", down)]:
        cases[f"{L}.mlp.{n_}"] = w
    groups.append({"members": [f"{L}.mlp.gate_proj", f"{L}.mlp.up_proj"], "dtype": dtype,
                   "note": "fused gate/up (dense MLP)"})
    groups.append({"members": [f"{L}.mlp.down_proj"], "dtype": dtype, "note": "down_proj is never fused"})
    if dtype == "bf16":
        E = "model.layers.1.mlp.experts.0"
        eg, eu, ed = randn(32, 64, 1.0), randn(32, 64, 0.01), randn(64, 32, 0.1)
        for n_, w in [("gate_proj", eg), ("up_proj", eu), ("down_proj", ed)]:
            cases[f"{E}.{n_}"] = w
        groups.append({"members": [f"{E}.gate_proj", f"{E}.up_proj"], "dtype": dtype,
                       "note": "fused gate/up of a routed expert"})
        groups.append({"members": [f"{E}.down_proj"], "dtype": dtype, "note": "expert down_proj alone"})
    for g in groups:
        for m in g["members"]:
            cases[m] = cases[m].to(tdt).contiguous()
    return cases, groups


from transformers import AutoConfig, PretrainedConfig, PreTrainedModel  # noqa: E402


class CasesConfig(PretrainedConfig):
    """A model that is nothing but named bias-free Linears of given shapes."""

    model_type = "fp4forge_cases"

    def __init__(self, shapes=None, **kw):
        self.shapes = shapes or {}
        super().__init__(**kw)


class CasesModel(PreTrainedModel):
    config_class = CasesConfig
    base_model_prefix = "cases"
    _no_split_modules = []

    def __init__(self, config):
        super().__init__(config)
        for name, (o, i) in config.shapes.items():
            parent = self
            parts = name.split(".")
            for p in parts[:-1]:
                if not hasattr(parent, p):
                    parent.add_module(p, torch.nn.Module())
                parent = getattr(parent, p)
            parent.add_module(parts[-1], torch.nn.Linear(i, o, bias=False))
        self.post_init()

    def _init_weights(self, module):
        pass

    def forward(self, input_ids=None, **kwargs):
        return None


AutoConfig.register(CasesConfig.model_type, CasesConfig)


def build_model(cases: dict[str, torch.Tensor], tdt: torch.dtype, src_dir: Path):
    cfg = CasesConfig(shapes={k: list(v.shape) for k, v in cases.items()})
    model = CasesModel(cfg).to(tdt)
    with torch.no_grad():
        for name, w in cases.items():
            model.get_submodule(name).weight.copy_(w)
    for name, w in cases.items():
        got = model.get_submodule(name).weight
        assert got.dtype == tdt and torch.equal(got.view(torch.uint8), w.view(torch.uint8)), name
    # oneshot re-reads the config from model.config.name_or_path: give it a real directory
    model.save_pretrained(str(src_dir))
    model.config.name_or_path = str(src_dir)
    return model


def quantize_with_llmcompressor(cases: dict[str, torch.Tensor], tdt: torch.dtype, workdir: Path):
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    tag = str(tdt).split('.')[-1]
    model = build_model(cases, tdt, workdir / f"src_{tag}")
    recipe = QuantizationModifier(targets="Linear", scheme="NVFP4A16")
    oneshot(model=model, recipe=recipe)
    out = workdir / f"model_{tag}"
    model.save_pretrained(str(out), save_compressed=True)
    cfg = json.loads((out / "config.json").read_text())
    tensors = {}
    for f in sorted(out.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return tensors, cfg


def make_nvfp4_cases(out_dir: Path) -> None:
    all_tensors: dict[str, torch.Tensor] = {}
    all_groups: list[dict] = []
    qconfigs = {}
    workdir = Path(tempfile.mkdtemp(prefix="fp4forge_nvfp4_"))
    try:
        for dtype in ("bf16", "f16", "f32"):
            tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dtype]
            cases, groups = case_tensors(dtype)
            q, cfg = quantize_with_llmcompressor(cases, tdt, workdir)
            qconfigs[dtype] = cfg.get("quantization_config")
            for name, w in cases.items():
                P = f"{dtype}.{name}"
                all_tensors[f"{P}.weight"] = w
                for suffix in ("weight_packed", "weight_scale", "weight_global_scale"):
                    t = q[f"{name}.{suffix}"]
                    all_tensors[f"{P}.{suffix}"] = t.contiguous()
                assert f"{name}.input_global_scale" not in q
                assert f"{name}.weight" not in q
                assert q[f"{name}.weight_packed"].dtype == torch.uint8
                assert q[f"{name}.weight_scale"].dtype == torch.float8_e4m3fn
                assert q[f"{name}.weight_global_scale"].dtype == torch.float32
                assert list(q[f"{name}.weight_global_scale"].shape) == [1]
            for g in groups:
                all_groups.append({**g, "members": [f"{dtype}.{m}" for m in g["members"]]})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    # --- checks --------------------------------------------------------------------------
    problems = []
    gs = lambda P: float(all_tensors[f"{P}.weight_global_scale"][0])
    for g in all_groups:
        vals = {m: gs(m) for m in g["members"]}
        if len(set(vals.values())) != 1:
            problems.append(f"fused group {g['members']} has different global scales {vals}")
        g["global_scale"] = next(iter(vals.values()))
    # fused groups must be discriminating: some member's own g differs from the shared one
    for g in all_groups:
        if len(g["members"]) > 1:
            own = {float(ref_global_scale(float(all_tensors[f"{m}.weight"].float().abs().max()), g["dtype"]))
                   for m in g["members"]}
            if len(own) < 2:
                problems.append(f"fused group {g['members']}: members would have equal g unfused (weak case)")
    # unfused siblings must really have their own g (the cases are built so that they differ)
    for dtype in ("bf16", "f16", "f32"):
        L = f"{dtype}.model.layers.0"
        if gs(f"{L}.self_attn.o_proj") == gs(f"{L}.self_attn.q_proj"):
            problems.append(f"{L}: o_proj shares q's global scale (test case not discriminating)")
        if gs(f"{L}.mlp.down_proj") == gs(f"{L}.mlp.gate_proj"):
            problems.append(f"{L}: down_proj shares gate's global scale")
    # independent reference
    n_checked = 0
    for g in all_groups:
        dtype = g["dtype"]
        amax = max(float(all_tensors[f"{m}.weight"].float().abs().max()) for m in g["members"])
        g_ref = ref_global_scale(amax, dtype)
        if np.float32(g["global_scale"]) != g_ref:
            problems.append(f"{g['members']}: global scale {g['global_scale']} != reference {g_ref}")
        for m in g["members"]:
            w = all_tensors[f"{m}.weight"].float().numpy()
            packed, q = ref_quantize(w, np.float32(g["global_scale"]), dtype)
            got_p = all_tensors[f"{m}.weight_packed"].numpy()
            got_s = all_tensors[f"{m}.weight_scale"].float().numpy()
            if not np.array_equal(q, got_s):
                problems.append(f"{m}: weight_scale differs from reference at {np.count_nonzero(q != got_s)} blocks")
            if not np.array_equal(packed, got_p):
                problems.append(f"{m}: weight_packed differs from reference at {np.count_nonzero(packed != got_p)} bytes")
            n_checked += 1
    # spec section 7 bytes
    for name, (g_hex, rows) in SPEC_EXPECT.items():
        P = f"bf16.{name}"
        got_g = all_tensors[f"{P}.weight_global_scale"].numpy().tobytes().hex()
        if got_g != g_hex:
            problems.append(f"{P}: global scale bytes {got_g} != spec {g_hex}")
        for r, (p_hex, s_hex) in enumerate(rows):
            got_p = all_tensors[f"{P}.weight_packed"][r].numpy().tobytes().hex()
            got_s = all_tensors[f"{P}.weight_scale"][r].view(torch.uint8).numpy().tobytes().hex()
            if got_p != p_hex or got_s != s_hex:
                problems.append(f"{P} row {r}: packed {got_p} scale {got_s} != spec {p_hex} {s_hex}")

    # f32: is the global scale double-rounded (reciprocal * 2688) or a single division?
    f32_notes = []
    for g in all_groups:
        if g["dtype"] != "f32":
            continue
        amax = np.float32(max(float(all_tensors[f"{m}.weight"].abs().max()) for m in g["members"]))
        single = np.float32(2688.0) / amax if amax > 0 else np.float32(np.inf)
        if np.isfinite(single) and single != np.float32(g["global_scale"]):
            f32_notes.append(f"{g['members'][0]}: single-division {single} != stored {g['global_scale']}")

    if problems:
        print("PROBLEMS:")
        for p in problems:
            print("  " + p)
        raise SystemExit(1)

    meta = {
        "producer": "llmcompressor 0.14.0.1 oneshot QuantizationModifier(targets='Linear', scheme='NVFP4A16') "
                    "data-free, save_pretrained(save_compressed=True), compressed-tensors 0.20.1, "
                    f"torch {torch.__version__}",
    }
    save_file(all_tensors, str(out_dir / "nvfp4_cases.safetensors"), metadata=meta)
    doc = {
        "producer": meta["producer"],
        "naming": "each module P has P.weight (original input, original dtype), P.weight_packed (U8), "
                  "P.weight_scale (F8_E4M3), P.weight_global_scale (F32 [1]); P is '<dtype>.<module name in "
                  "the quantized model>'. Each group lists modules that share one global scale.",
        "quantization_config": qconfigs,
        "groups": all_groups,
    }
    (out_dir / "nvfp4_cases.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"nvfp4_cases: {len(all_groups)} groups, {n_checked} modules; all agree with the spec reference "
          f"and spec section 7 bytes")
    for n in f32_notes:
        print("  note (f32 double rounding): " + n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", default="fp8,e2m1,nvfp4")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    only = set(args.only.split(","))
    if "fp8" in only:
        make_fp8_table(args.out)
    if "e2m1" in only:
        make_e2m1_sweep(args.out)
    if "nvfp4" in only:
        make_nvfp4_cases(args.out)


if __name__ == "__main__":
    main()
