#!/usr/bin/env python3
"""Compares lm-evaluation-harness's per-item log-likelihoods (its --log_samples output) with
fp4forge's on the same items (items.jsonl from the eval_items example, which carries
`fp4forge_loglik` per choice), and both tools' accuracies.

Usage: compare_lm_eval.py ITEMS.jsonl LM_EVAL_OUTPUT_DIR FP4FORGE_EVAL.json [TOLERANCE]
Exit status 1 when a per-choice difference exceeds TOLERANCE (default 1e-3) or items are missing.
"""

import glob
import json
import sys

items_path, lm_dir, fp4_json = sys.argv[1:4]
tol = float(sys.argv[4]) if len(sys.argv) > 4 else 1e-3

items = {}
with open(items_path) as f:
    for line in f:
        d = json.loads(line)
        items[d["item"]] = d

samples = sorted(glob.glob(f"{lm_dir}/**/samples_*.jsonl", recursive=True))
results = sorted(glob.glob(f"{lm_dir}/**/results_*.json", recursive=True))
if not samples or not results:
    sys.exit(f"no lm-eval samples/results under {lm_dir}")
lm = {}
with open(samples[-1]) as f:
    for line in f:
        s = json.loads(line)
        lls = []
        for r in s["resps"]:
            ll = r[0][0] if isinstance(r[0], (list, tuple)) else r[0]
            lls.append(float(ll))
        lm[s["doc"]["item"]] = (lls, s)

worst = 0.0
worst_at = None
rows = []
for item, d in sorted(items.items()):
    if item not in lm:
        sys.exit(f"item {item} missing from lm-eval's samples")
    ours = d["fp4forge_loglik"]
    theirs, _ = lm[item]
    if len(ours) != len(theirs):
        sys.exit(f"item {item}: {len(ours)} choices vs {len(theirs)}")
    for c, (a, b) in enumerate(zip(ours, theirs)):
        diff = abs(a - b)
        if diff > worst:
            worst, worst_at = diff, (item, c)
        rows.append((item, c, a, b, diff))

print(f"{'item':>5} {'choice':>6} {'fp4forge eval':>14} {'lm-eval':>14} {'|diff|':>10}")
for item, c, a, b, diff in rows[:12]:
    print(f"{item:>5} {c:>6} {a:>14.6f} {b:>14.6f} {diff:>10.2e}")
print(f"... {len(rows)} (item, choice) pairs over {len(items)} items")
print(f"max |fp4forge - lm-eval| = {worst:.3e} at (item, choice) {worst_at}")

# Accuracies: lm-eval's results file vs `fp4forge eval --json`.
with open(results[-1]) as f:
    res = json.load(f)["results"]
task = next(iter(res))
lm_acc, lm_norm = res[task]["acc,none"], res[task]["acc_norm,none"]
with open(fp4_json) as f:
    rep = json.load(f)
scores = {s["metric"]: s["value"] for s in rep["endpoints"][0]["scores"]}
print(f"fp4forge eval ({rep['items']} items): " + ", ".join(f"{k} {v:.4f}" for k, v in scores.items()))
print(f"lm-eval       ({len(lm)} items): acc {lm_acc:.4f}, acc_norm {lm_norm:.4f}")
ok = worst <= tol
if "acc" in scores and abs(scores["acc"] - lm_acc) > 1e-9:
    print("accuracies differ")
    ok = False
print(("AGREE" if ok else "DISAGREE") + f" (tolerance {tol:g})")
sys.exit(0 if ok else 1)
