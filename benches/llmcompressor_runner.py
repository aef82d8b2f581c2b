#!/usr/bin/env python3
"""Helper of benches/builder_vs_llmcompressor.sh: runs the llm-compressor side of the benchmark,
compares outputs tensor by tensor, and renders the result table.

Run with the reference venv (tools/reference/.venv, llmcompressor 0.14.0.1, compressed-tensors
0.20.1, transformers 5.17, torch 2.14 on CPU):

  python llmcompressor_runner.py model-free SRC DST --recipe all-linear|qkvo [--max-workers N]
  python llmcompressor_runner.py oneshot    SRC DST --recipe all-linear|qkvo
  python llmcompressor_runner.py compare    DIR_A DIR_B [--json OUT]
  python llmcompressor_runner.py report     RESULTS.tsv OUT.json [--machine TEXT]

Recipes (the same modules for all three tools):
  all-linear  every Linear except lm_head, the MoE routers (re:.*mlp\\.gate$) and the attention
              output gates (re:.*self_attn\\.g_proj$)
  qkvo        attention q/k/v/o only (re:.*self_attn\\.(q|k|v|o)_proj$)

model_free_ptq matches *tensor names*, not module classes: its "Linear" target takes every
2-D `*.weight` whose module name does not end in "norm" -- including `model.embed_tokens`. To
quantize the same modules as oneshot (where "Linear" is a class match), the all-linear recipe
adds `re:.*embed_tokens$` to model_free_ptq's ignore list.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

ATTN_QKVO = r"re:.*self_attn\.(q|k|v|o)_proj$"
IGNORE_ALL_LINEAR = ["lm_head", r"re:.*mlp\.gate$", r"re:.*self_attn\.g_proj$"]
# model_free_ptq only: its "Linear" would otherwise include the embedding (see module doc).
MFP_EXTRA_IGNORE = [r"re:.*embed_tokens$"]


def _log(msg: str) -> None:
    print(f"[runner {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# model_free_ptq
# --------------------------------------------------------------------------------------------
def run_model_free(src: str, dst: str, recipe: str, max_workers: int) -> None:
    import torch
    from compressed_tensors.quantization import preset_name_to_scheme
    from llmcompressor.entrypoints.model_free import model_free_ptq

    if recipe == "all-linear":
        scheme = "NVFP4A16"  # targets default to ["Linear"]
        ignore = IGNORE_ALL_LINEAR + MFP_EXTRA_IGNORE
    elif recipe == "qkvo":
        # A preset name gives targets=["Linear"]; a scheme object keeps our targets.
        scheme = preset_name_to_scheme("NVFP4A16", [ATTN_QKVO])
        ignore = []
    else:
        raise SystemExit(f"unknown recipe {recipe}")
    _log(f"model_free_ptq({src} -> {dst}, recipe={recipe}, max_workers={max_workers}, "
         f"torch threads={torch.get_num_threads()})")
    model_free_ptq(src, dst, scheme=scheme, ignore=ignore, max_workers=max_workers, device="cpu")


# --------------------------------------------------------------------------------------------
# oneshot (data-free)
# --------------------------------------------------------------------------------------------
def run_oneshot(src: str, dst: str, recipe: str) -> None:
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, LagunaForCausalLM

    # transformers' Laguna has no _keep_in_fp32_modules: without this the F32 router bias is
    # silently downcast to bf16 (see tools/reference/make_laguna_fixtures.py).
    LagunaForCausalLM._keep_in_fp32_modules_strict = ["e_score_correction_bias"]

    if recipe == "all-linear":
        mod = QuantizationModifier(targets="Linear", scheme="NVFP4A16", ignore=IGNORE_ALL_LINEAR)
    elif recipe == "qkvo":
        mod = QuantizationModifier(targets=[ATTN_QKVO], scheme="NVFP4A16")
    else:
        raise SystemExit(f"unknown recipe {recipe}")
    _log(f"oneshot({src} -> {dst}, recipe={recipe}, torch threads={torch.get_num_threads()})")
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    t1 = time.perf_counter()
    oneshot(model=model, recipe=mod)
    t2 = time.perf_counter()
    model.save_pretrained(dst, save_compressed=True)
    t3 = time.perf_counter()
    _log(f"oneshot phases: load {t1 - t0:.1f} s, quantize {t2 - t1:.1f} s, save {t3 - t2:.1f} s")


# --------------------------------------------------------------------------------------------
# compare
# --------------------------------------------------------------------------------------------
def _tensor_index(d: Path) -> dict[str, Path]:
    out: dict[str, Path] = {}
    from safetensors import safe_open

    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            for k in h.keys():
                out[k] = f
    return out


def _raw(t):
    """The tensor's bytes as a flat uint8 tensor (bit-exact comparison, NaN-safe)."""
    import torch

    t = t.contiguous().view(-1)
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def _pattern(name: str) -> str:
    return re.sub(r"\.\d+\.", ".N.", name)


def compare(a: Path, b: Path) -> dict:
    """Same tensor names, dtypes, shapes and bytes? Differences are summarised per name pattern
    (layer/expert indices replaced by N); for differing NVFP4 modules, whether their
    weight_global_scale differs too (a different fusion of global scales)."""
    import torch
    from safetensors import safe_open

    ia, ib = _tensor_index(a), _tensor_index(b)
    only_a = sorted(set(ia) - set(ib))
    only_b = sorted(set(ib) - set(ia))
    common = sorted(set(ia) & set(ib))
    handles: dict[Path, object] = {}

    def get(path: Path, name: str):
        if path not in handles:
            handles[path] = safe_open(str(path), "pt").__enter__()
        return handles[path].get_tensor(name)

    diff_names: list[str] = []
    meta_diff: list[str] = []
    for name in common:
        ta, tb = get(ia[name], name), get(ib[name], name)
        if ta.dtype != tb.dtype or tuple(ta.shape) != tuple(tb.shape):
            meta_diff.append(f"{name}: {ta.dtype}{tuple(ta.shape)} vs {tb.dtype}{tuple(tb.shape)}")
            diff_names.append(name)
            continue
        if not torch.equal(_raw(ta), _raw(tb)):
            diff_names.append(name)

    by_pattern: dict[str, int] = defaultdict(int)
    for n in diff_names:
        by_pattern[_pattern(n)] += 1
    # modules (prefix before weight_*) whose global scale differs
    gs_diff_modules = sorted({n.rsplit(".", 1)[0] for n in diff_names if n.endswith("weight_global_scale")})
    gs_diff_by_pattern: dict[str, int] = defaultdict(int)
    for m in gs_diff_modules:
        gs_diff_by_pattern[_pattern(m)] += 1
    packed_diff_modules = {n.rsplit(".", 1)[0] for n in diff_names if n.endswith("weight_packed")}
    packed_diff_without_gs = sorted(packed_diff_modules - set(gs_diff_modules))

    def qcfg(d: Path):
        try:
            return json.loads((d / "config.json").read_text()).get("quantization_config")
        except Exception:  # noqa: BLE001
            return None

    qa, qb = qcfg(a), qcfg(b)
    qcfg_diff = []
    if qa != qb:
        for k in sorted(set(qa or {}) | set(qb or {})):
            va, vb = (qa or {}).get(k), (qb or {}).get(k)
            if va != vb:
                same_set = isinstance(va, list) and isinstance(vb, list) and len(va) == len(vb) \
                    and set(map(json.dumps, va)) == set(map(json.dumps, vb))
                qcfg_diff.append(f"{k} (order only)" if same_set else k)
    n_packed = sum(1 for n in common if n.endswith("weight_packed"))
    return {
        "a": str(a), "b": str(b),
        "tensors_a": len(ia), "tensors_b": len(ib), "common": len(common),
        "nvfp4_modules_common": n_packed,
        "only_in_a": only_a[:20], "only_in_a_count": len(only_a),
        "only_in_b": only_b[:20], "only_in_b_count": len(only_b),
        "differing_tensors": len(diff_names),
        "differing_by_pattern": dict(sorted(by_pattern.items())),
        "dtype_or_shape_differences": meta_diff[:20],
        "global_scale_differs_modules": len(gs_diff_modules),
        "global_scale_differs_by_pattern": dict(sorted(gs_diff_by_pattern.items())),
        "packed_differs_but_global_scale_equal": packed_diff_without_gs[:20],
        "quantization_config_keys_differing": qcfg_diff,
        "identical_tensors": not only_a and not only_b and not diff_names,
    }


# --------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------
def report(results_tsv: Path, out_json: Path, machine: str, comparisons: list[Path], notes: list[str]) -> None:
    """results.tsv rows: tool, recipe, run, wall_s, maxrss_kb, exit code, src, dst, cpu_s."""
    rows: dict[tuple[str, str], dict] = {}
    order: list[tuple[str, str]] = []
    for line in results_tsv.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        tool, recipe, run, wall, rss, rc, src, dst, cpu = line.split("\t")
        key = (tool, recipe)
        if key not in rows:
            rows[key] = {"tool": tool, "recipe": recipe, "runs": [], "src": src, "dst": dst}
            order.append(key)
        rows[key]["runs"].append({"wall_s": float(wall), "cpu_s": float(cpu), "peak_rss_kb": int(rss), "rc": int(rc)})
    for r in rows.values():
        walls = sorted(x["wall_s"] for x in r["runs"])
        r["wall_s"] = walls[len(walls) // 2] if len(walls) % 2 else (walls[len(walls) // 2 - 1] + walls[len(walls) // 2]) / 2
        r["wall_s_min"] = walls[0]
        cpus = sorted(x["cpu_s"] for x in r["runs"])
        r["cpu_s"] = cpus[len(cpus) // 2]
        r["peak_rss_mib"] = max(x["peak_rss_kb"] for x in r["runs"]) / 1024
        r["ok"] = all(x["rc"] == 0 for x in r["runs"])
    for r in rows.values():
        # Only rows that read the same source (the bf16 checkpoint) are compared.
        base = rows.get(("llmcompressor model_free_ptq", r["recipe"]))
        same_src = base is not None and base["src"] == r["src"]
        r["speedup_vs_model_free_ptq"] = (base["wall_s"] / r["wall_s"]) if same_src and r["wall_s"] > 0 else None

    def du(p: str) -> float | None:
        d = Path(p)
        if not d.is_dir():
            return None
        return sum(f.stat().st_size for f in d.glob("*.safetensors")) / 1e9

    for r in rows.values():
        r["output_gb"] = du(r["dst"])

    comps = []
    for c in comparisons:
        try:
            comps.append(json.loads(c.read_text()))
        except Exception as e:  # noqa: BLE001
            comps.append({"file": str(c), "error": str(e)})

    doc = {"machine": machine, "cache": "warm (source safetensors read into the page cache before every run)",
           "results": [rows[k] for k in order], "comparisons": comps, "notes": notes}
    out_json.write_text(json.dumps(doc, indent=2) + "\n")

    print("| tool | recipe | wall s | CPU s (user+sys) | peak RSS MiB | speed-up vs model_free_ptq | output GB |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for k in order:
        r = rows[k]
        sp = f"{r['speedup_vs_model_free_ptq']:.1f}x" if r["speedup_vs_model_free_ptq"] else "—"
        nruns = len(r["runs"])
        wall = (f"{r['wall_s']:.2f}" if r["wall_s"] >= 1 else f"{r['wall_s']:.3f}") + (f" (median of {nruns})" if nruns > 1 else "")
        if not r["ok"]:
            wall += " FAILED"
        og = f"{r['output_gb']:.3f}" if r["output_gb"] is not None else "—"
        print(f"| {r['tool']} | {r['recipe']} | {wall} | {r['cpu_s']:.1f} | {r['peak_rss_mib']:.0f} | {sp} | {og} |")
    # The bar: fp4forge >= 10x faster than model_free_ptq on all-linear, peak RSS < 1 GB.
    ff = rows.get(("fp4forge quantize", "all-linear"))
    if ff and ff.get("speedup_vs_model_free_ptq"):
        fast = ff["speedup_vs_model_free_ptq"] >= 10
        ff_rss = max(r["peak_rss_mib"] for r in rows.values() if r["tool"].startswith("fp4forge"))
        lean = ff_rss * 1024 * 1024 < 1e9
        doc["bar"] = {"speedup_all_linear": ff["speedup_vs_model_free_ptq"], "speedup_ok": fast,
                      "fp4forge_max_peak_rss_mib": ff_rss, "rss_ok": lean}
        out_json.write_text(json.dumps(doc, indent=2) + "\n")
        print()
        print(f"Bar: fp4forge all-linear {ff['speedup_vs_model_free_ptq']:.1f}x model_free_ptq (>= 10x: "
              f"{'PASS' if fast else 'FAIL'}); fp4forge max peak RSS {ff_rss:.0f} MiB (< 1 GB: "
              f"{'PASS' if lean else 'FAIL'})")
    if comps:
        print()
        print("| comparison | identical tensors | differing tensors | only in A / B | global scale differs (modules) | quantization_config keys differing |")
        print("|---|---|---:|---:|---|---|")
        for c in comps:
            if "error" in c:
                print(f"| {c['file']} | error: {c['error']} | | | | |")
                continue
            gs = ", ".join(f"{p}: {n}" for p, n in c["global_scale_differs_by_pattern"].items()) or "—"
            print(f"| {Path(c['a']).name} vs {Path(c['b']).name} | {'yes' if c['identical_tensors'] else 'NO'} | "
                  f"{c['differing_tensors']} | {c['only_in_a_count']} / {c['only_in_b_count']} | {gs} | "
                  f"{', '.join(c['quantization_config_keys_differing']) or '—'} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("model-free")
    p.add_argument("src"), p.add_argument("dst")
    p.add_argument("--recipe", required=True, choices=["all-linear", "qkvo"])
    p.add_argument("--max-workers", type=int, default=1)
    p = sub.add_parser("oneshot")
    p.add_argument("src"), p.add_argument("dst")
    p.add_argument("--recipe", required=True, choices=["all-linear", "qkvo"])
    p = sub.add_parser("compare")
    p.add_argument("a", type=Path), p.add_argument("b", type=Path)
    p.add_argument("--json", type=Path)
    p = sub.add_parser("report")
    p.add_argument("results", type=Path), p.add_argument("out_json", type=Path)
    p.add_argument("--machine", default="")
    p.add_argument("--compare", type=Path, action="append", default=[])
    p.add_argument("--note", action="append", default=[])
    args = ap.parse_args()

    if args.cmd == "model-free":
        run_model_free(args.src, args.dst, args.recipe, args.max_workers)
    elif args.cmd == "oneshot":
        run_oneshot(args.src, args.dst, args.recipe)
    elif args.cmd == "compare":
        res = compare(args.a, args.b)
        txt = json.dumps(res, indent=2)
        if args.json:
            args.json.write_text(txt + "\n")
        print(txt)
    elif args.cmd == "report":
        report(args.results, args.out_json, args.machine, args.compare, args.note)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
