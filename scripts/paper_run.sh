#!/usr/bin/env bash
# The paper's base run (§5, §6.1, Table 3 "base"): WMT14 English→German on 8 GPUs.
#   1. a shared BPE vocabulary of 37,000 tokens on the training pairs (§5.1);
#   2. the corpus prepared once: tokenized into memory-mapped Arrow files that every rank and every restart maps;
#   3. `accelerate launch` on NUM_GPUS GPUs in bf16, the paper's recipe, 100,000 steps of about 25,000 source and
#      25,000 target tokens each (TOKENS_PER_STEP split over the GPUs; padding counts, so a step holds slightly fewer),
#      a checkpoint about every 10 minutes;
#   4. the last 5 checkpoints averaged, sacreBLEU on newstest2014 (the test split) with beam 4 and α 0.6.
#
#   bash scripts/paper_run.sh                      # needs the Hub (wmt14) and NUM_GPUS GPUs
#   OUT=runs/base NUM_GPUS=4 bash scripts/paper_run.sh
#   DRY_RUN=1 DATASET=path/to/local-copy bash scripts/paper_run.sh   # every step at toy sizes on 2 CPU processes
#
# A rerun resumes: the tokenizer and the prepared corpus are reused, and training continues from the last complete
# checkpoint in $OUT/model.
set -euo pipefail
cd "$(dirname "$0")/.."

PRECISION=(--bf16)
EXTRA=()
if [[ -n "${DRY_RUN:-}" ]]; then
    # The same commands at toy sizes: two CPU processes (gloo), a tiny model, a few steps (each still overridable).
    : "${NUM_GPUS:=2}" "${TOKENS_PER_STEP:=512}" "${STEPS:=4}" "${SAVE_STEPS:=2}" "${VOCAB_SIZE:=400}"
    : "${PRESET:=tiny}" "${WORKERS:=1}" "${ACCELERATE_CONFIG:=configs/accelerate/cpu_2proc.yaml}"
    PRECISION=()
    EXTRA=(--use_cpu --generation_max_length 24 --max_predict_samples 16)
    export OMP_NUM_THREADS=1
fi
OUT="${OUT:-runs/paper-base}"
DATASET="${DATASET:-wmt14}"
DATASET_CONFIG="${DATASET_CONFIG-de-en}"  # empty: a dataset without configs
NUM_GPUS="${NUM_GPUS:-8}"
TOKENS_PER_STEP="${TOKENS_PER_STEP:-25000}"
STEPS="${STEPS:-100000}"
SAVE_STEPS="${SAVE_STEPS:-1400}"  # about 10 minutes of the paper's 12 hours for 100,000 steps
VOCAB_SIZE="${VOCAB_SIZE:-37000}"
PRESET="${PRESET:-base}"
WORKERS="${WORKERS:-$(nproc)}"
ACCELERATE_CONFIG="${ACCELERATE_CONFIG:-configs/accelerate/ddp_multi_gpu.yaml}"
dataset=(--dataset_name "$DATASET")
if [[ -n "$DATASET_CONFIG" ]]; then dataset+=(--dataset_config_name "$DATASET_CONFIG"); fi
languages=(--source_lang en --target_lang de)

if [[ ! -f "$OUT/tokenizer/tokenizer.json" ]]; then
    vt-train-tokenizer "${dataset[@]}" "${languages[@]}" --vocab_size "$VOCAB_SIZE" --output "$OUT/tokenizer"
fi
vt-prepare-data "${dataset[@]}" "${languages[@]}" --tokenizer_name "$OUT/tokenizer" --output "$OUT/prepared" \
    --max_source_length 256 --max_target_length 256 --preprocessing_num_workers "$WORKERS"

resume=()
if compgen -G "$OUT/model/checkpoint-*/trainer_state.json" >/dev/null; then resume=(--resume_from_checkpoint True); fi
accelerate launch --config_file "$ACCELERATE_CONFIG" --num_processes "$NUM_GPUS" scripts/train.py \
    --prepared_data "$OUT/prepared" "${languages[@]}" --preset "$PRESET" --paper_recipe \
    --max_tokens $(( (TOKENS_PER_STEP + NUM_GPUS - 1) / NUM_GPUS )) --max_steps "$STEPS" \
    --save_steps "$SAVE_STEPS" --save_total_limit 5 --average_checkpoints 5 \
    --do_train --predict_with_generate --generation_num_beams 4 --length_penalty 0.6 \
    --per_device_eval_batch_size 64 --logging_steps 100 --report_to tensorboard \
    --dataloader_num_workers 2 --output_dir "$OUT/model" "${PRECISION[@]}" "${EXTRA[@]}" "${resume[@]}"
echo "sacreBLEU on the test split (newstest2014 for wmt14): $OUT/model/all_results.json"
