"""Checkpoint averaging (paper §6.1): the base model averages the last 5 checkpoints, the big model the last 20."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers.utils import logging

logger = logging.get_logger(__name__)

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def last_checkpoints(run_dir: str | os.PathLike, count: int) -> list[Path]:
    """The `count` newest `checkpoint-<step>` folders of a training run, oldest first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"Training output folder not found: {run_dir}.")
    found = sorted(
        (int(match.group(1)), path)
        for path in run_dir.iterdir()
        if path.is_dir() and (match := _CHECKPOINT.match(path.name))
    )
    if count < 1:
        raise ValueError(f"The number of checkpoints to average must be >= 1 (got {count}).")
    if len(found) < count:
        raise ValueError(
            f"{run_dir} has {len(found)} checkpoints, fewer than the {count} requested; lower --num_checkpoints or "
            "train with a smaller --save_steps (and a larger --save_total_limit)."
        )
    return [path for _, path in found[-count:]]


def _load_state(checkpoint: Path) -> dict[str, torch.Tensor]:
    weights = checkpoint / "model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"{checkpoint} has no model.safetensors (sharded checkpoints are not supported).")
    try:
        return load_file(str(weights))
    except Exception as error:  # safetensors' errors do not name the file
        if type(error).__name__ != "SafetensorError":
            raise
        raise ValueError(
            f"Cannot read {weights}: {error}. The checkpoint is damaged or incomplete (interrupted while saving?); "
            "leave it out, e.g. with a smaller --num_checkpoints, or delete the folder."
        ) from None


def average_checkpoints(checkpoints: list[str | os.PathLike], output_dir: str | os.PathLike) -> Path:
    """Write the element-wise mean of the checkpoints' weights (in float64, cast back) as a loadable model folder.

    The config, generation config and tokenizer are copied from the last checkpoint, and the model is re-saved
    through `save_pretrained`, so `AutoModelForSeq2SeqLM.from_pretrained(output_dir)` loads it.
    """
    if not checkpoints:
        raise ValueError("No checkpoints to average.")
    checkpoints = [Path(c) for c in checkpoints]
    total: dict[str, torch.Tensor] = {}
    reference = None
    for checkpoint in checkpoints:
        state = _load_state(checkpoint)
        if reference is None:
            reference = {name: (tensor.shape, tensor.dtype) for name, tensor in state.items()}
        elif {name: (t.shape, t.dtype) for name, t in state.items()} != reference:
            raise ValueError(f"{checkpoint} has different tensors from {checkpoints[0]}; they are not one model.")
        for name, tensor in state.items():
            total[name] = total.get(name, 0) + tensor.to(torch.float64)
    averaged = {name: (value / len(checkpoints)).to(reference[name][1]) for name, value in total.items()}

    from transformers import AutoModelForSeq2SeqLM

    import vanilla_transformer  # noqa: F401  (registers the Auto classes)

    model = AutoModelForSeq2SeqLM.from_pretrained(checkpoints[-1])
    missing, unexpected = model.load_state_dict(averaged, strict=False)
    tied = set(getattr(model, "all_tied_weights_keys", {}) or {})
    if unexpected or set(missing) - tied:
        raise ValueError(f"Averaged weights do not fit the model: missing {missing}, unexpected {unexpected}.")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)
    for name in _TOKENIZER_FILES:
        if (checkpoints[-1] / name).is_file():
            shutil.copy2(checkpoints[-1] / name, output_dir / name)
    logger.info(f"Averaged {len(checkpoints)} checkpoints into {output_dir}.")
    return output_dir
