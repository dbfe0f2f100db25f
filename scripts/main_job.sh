#!/usr/bin/env bash
# One command on a fresh machine: create a virtual environment, install the package with its training and ONNX
# extras, and run the main job (gettext en→de corpus → tokenizer → small Transformer on the CPU → BLEU/chrF →
# examples → ONNX export and onnxruntime translations).
#   bash scripts/main_job.sh [--time_budget_minutes 20] [--output_dir outputs/main_job]
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${VIRTUAL_ENV:-}" ]]; then
    python3 -m venv .venv
    # shellcheck disable=SC1091
    source .venv/bin/activate
fi
if ! python -c "import torch" 2>/dev/null; then
    # The CPU wheel first: where it lies on local disk this is fast; elsewhere any torch >= 2.4 works.
    python -m pip install --quiet torch==2.13.0 || python -m pip install --quiet "torch>=2.4"
fi
# The scripts import the installed package: install this checkout unless it is the one Python finds (asked from
# outside the checkout, so that the working directory does not count).
installed="$(cd / && python -c "import os, vanilla_transformer as v; print(os.path.realpath(os.path.dirname(os.path.dirname(v.__file__))))" 2>/dev/null || true)"
if [[ "$installed" != "$(pwd -P)" ]] || ! python -c "import datasets, accelerate, sacrebleu, matplotlib, tensorboard, tiktoken, onnxruntime, onnxscript" 2>/dev/null; then
    python -m pip install --quiet -e ".[train,onnx]"
fi
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"  # the main job needs nothing from the Hub
python scripts/main_job.py "$@"
