#!/usr/bin/env bash
# Record sparksim trace sets for Qwen3-8B with DeepSpec's released DSpark and DFlash drafters (γ = 7)
# on the DSpark paper's nine evaluation sets, at temperature 0 (greedy: exact replay) and 1 (Table 1).
#
#   scripts/record_qwen3_8b.sh TARGET_DIR DSPARK_DIR DFLASH_DIR OUT_DIR
#
#   TARGET_DIR  local copy of Qwen/Qwen3-8B (config.json, weights, tokenizer files)
#   DSPARK_DIR  local copy of deepseek-ai/dspark_qwen3_8b_block7
#   DFLASH_DIR  local copy of deepseek-ai/dflash_qwen3_8b_block7
#   OUT_DIR     receives OUT_DIR/qwen3-8b-{dspark,dflash}-t{0,1}/ (trace sets), OUT_DIR/calibration/
#               (the STS fits) and OUT_DIR/responses/ (the target's responses, reused on a rerun)
#
# Environment (default in brackets):
#   EVAL_DIR        DeepSpec's eval_datasets/ folder [./DeepSpec/eval_datasets]
#   EAGLE3_DIR      also record deepseek-ai/eagle3_qwen3_8b_ttt7 from this folder [unset]
#   TEMPERATURES    sampling temperatures [0 1]
#   TASKS           NAME[:CAP[:DOMAIN]] sets [the paper's nine, capped as DeepSpec's eval.py]
#                   e.g. TASKS="gsm8k:50 humaneval:50 mt-bench:50" for a first, short run
#   CAL_FRACTION    share of every set held out to fit STS, not recorded [0.2]
#   MAX_NEW_TOKENS  [2048, as DeepSpec's evaluation]   DEVICE [cuda]   DTYPE [bf16]
#   GEN_BATCH       prompts per HF generate call [32]  ANCHOR_CHUNK anchors per verify pass [256]
#   PYTHON          the interpreter of the environment sparksim[torch] is installed in [python]
#
# Fetch the inputs first, e.g.:
#   huggingface-cli download Qwen/Qwen3-8B --local-dir models/Qwen3-8B
#   huggingface-cli download deepseek-ai/dspark_qwen3_8b_block7 --local-dir models/dspark_qwen3_8b_block7
#   huggingface-cli download deepseek-ai/dflash_qwen3_8b_block7 --local-dir models/dflash_qwen3_8b_block7
#   git clone https://github.com/deepseek-ai/DeepSpec     # eval_datasets/; check alpaca.jsonl is complete
#
# One H100 80 GB: the target and both drafters in bf16 take about 20 GB. The work is two generations
# of about 3,300 responses (one per temperature, shared by the drafters) and four recordings; expect
# several hours in all (an estimate, not a measurement). Outputs are written atomically per trace set;
# a rerun reuses the cached responses. Docs: docs/drafter.md, "Record your own drafter".
set -euo pipefail

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "record_qwen3_8b.sh: $*" >&2; exit 1; }

[[ $# -eq 4 ]] || usage
TARGET_DIR=$1 DSPARK_DIR=$2 DFLASH_DIR=$3 OUT_DIR=$4
EVAL_DIR=${EVAL_DIR:-./DeepSpec/eval_datasets}
EAGLE3_DIR=${EAGLE3_DIR:-}
TEMPERATURES=${TEMPERATURES:-0 1}
TASKS=${TASKS:-gsm8k:500 math500:500 aime25:30 humaneval:164 mbpp:256 livecodebench:500 mt-bench:80 alpaca:500 arena-hard-v2:500}
CAL_FRACTION=${CAL_FRACTION:-0.2}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-2048}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bf16}
GEN_BATCH=${GEN_BATCH:-32}
ANCHOR_CHUNK=${ANCHOR_CHUNK:-256}
PYTHON=${PYTHON:-python}

# Every input is checked before anything loads: a wrong path must not cost a model load.
need_model() {  # LABEL DIR
  [[ -d $2 ]] || die "$1 folder '$2' does not exist"
  [[ -f $2/config.json ]] || die "$1 folder '$2' has no config.json (is it a downloaded checkpoint?)"
  compgen -G "$2/*.safetensors" > /dev/null || die "$1 folder '$2' has no *.safetensors weights"
}
need_model "target (Qwen3-8B)" "$TARGET_DIR"
[[ -f $TARGET_DIR/tokenizer.json || -f $TARGET_DIR/tokenizer_config.json ]] \
  || die "target folder '$TARGET_DIR' has no tokenizer files (tokenizer.json / tokenizer_config.json)"
need_model "DSpark drafter" "$DSPARK_DIR"
need_model "DFlash drafter" "$DFLASH_DIR"
DRAFTERS=(--drafter "dspark=$DSPARK_DIR" --drafter "dflash=$DFLASH_DIR")
if [[ -n $EAGLE3_DIR ]]; then
  need_model "Eagle3 drafter" "$EAGLE3_DIR"
  DRAFTERS+=(--drafter "eagle3=$EAGLE3_DIR")
fi
[[ -d $EVAL_DIR ]] || die "EVAL_DIR '$EVAL_DIR' does not exist (set EVAL_DIR to DeepSpec's eval_datasets/ folder)"
for task in $TASKS; do
  name=${task%%:*}
  [[ -s $EVAL_DIR/$name.jsonl ]] || die "evaluation set '$EVAL_DIR/$name.jsonl' is missing or empty"
done

"$PYTHON" -c 'import torch, transformers, safetensors, sparksim.drafter.deepspec' 2> /dev/null \
  || die "'$PYTHON' cannot import torch, transformers, safetensors and sparksim: pip install -e '.[torch]'"
if [[ $DEVICE == cuda* ]]; then
  "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
    || die "DEVICE=$DEVICE but torch sees no CUDA device (set DEVICE=cpu to try anyway)"
fi

"$PYTHON" -m sparksim.drafter.deepspec check --target "$TARGET_DIR" "${DRAFTERS[@]}"

TEMP_ARGS=()
for t in $TEMPERATURES; do TEMP_ARGS+=(--temperature "$t"); done
# shellcheck disable=SC2086  # TASKS is a list of words on purpose
"$PYTHON" -m sparksim.drafter.deepspec record \
  --target "$TARGET_DIR" "${DRAFTERS[@]}" \
  --eval-dir "$EVAL_DIR" --tasks $TASKS \
  --out-dir "$OUT_DIR" --name qwen3-8b --gamma 7 "${TEMP_ARGS[@]}" \
  --max-new-tokens "$MAX_NEW_TOKENS" --calibration-fraction "$CAL_FRACTION" \
  --device "$DEVICE" --dtype "$DTYPE" --generate-batch "$GEN_BATCH" --anchor-chunk "$ANCHOR_CHUNK"

echo "trace sets written under $OUT_DIR:"
ls -d "$OUT_DIR"/qwen3-8b-*
