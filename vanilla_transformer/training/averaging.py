"""Checkpoint averaging (paper §6.1): the base model averages the last 5 checkpoints, the big model the last 20."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers.utils import logging

from .tokenization import TOKENIZER_FILES
from .trainer import numbered_checkpoints

logger = logging.get_logger(__name__)


def last_checkpoints(run_dir: str | os.PathLike, count: int) -> list[Path]:
    """The `count` newest `checkpoint-<step>` folders of a training run, oldest first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"training output folder {run_dir} not found; pass the folder of a vt-train run")
    found = numbered_checkpoints(run_dir, complete_only=True)
    if count < 1:
        raise ValueError(f"the number of checkpoints to average must be >= 1, got {count}")
    if len(found) < count:
        raise ValueError(
            f"{run_dir} has {len(found)} complete checkpoints, fewer than the {count} requested; lower "
            "--num_checkpoints or train with a smaller --save_steps (and a larger --save_total_limit)."
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


def average_states(states: list[dict[str, torch.Tensor]], names: list[str] | None = None) -> dict[str, torch.Tensor]:
    """The element-wise mean of state dicts with the same tensors (summed in float64, cast back to each dtype).

    `names` label the states in the error raised when one does not match the first.
    """
    if not states:
        raise ValueError("No checkpoints to average.")
    names = names or [f"state {i}" for i in range(len(states))]
    reference = {name: (tensor.shape, tensor.dtype) for name, tensor in states[0].items()}
    total: dict[str, torch.Tensor] = {}
    for label, state in zip(names, states, strict=True):
        if {name: (t.shape, t.dtype) for name, t in state.items()} != reference:
            raise ValueError(f"{label} has different tensors from {names[0]}; they are not one model.")
        for name, tensor in state.items():
            total[name] = total.get(name, 0) + tensor.detach().to("cpu", torch.float64)
    return {name: (value / len(states)).to(reference[name][1]) for name, value in total.items()}


def load_averaged_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load averaged weights into `model` in place; every tensor must fit (tied copies may be absent)."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "all_tied_weights_keys", {}) or {})
    if unexpected or set(missing) - tied:
        raise ValueError(f"Averaged weights do not fit the model: missing {missing}, unexpected {unexpected}.")


def average_checkpoints(checkpoints: list[str | os.PathLike], output_dir: str | os.PathLike) -> Path:
    """Write the element-wise mean of the checkpoints' weights (in float64, cast back) as a loadable model folder.

    The config, generation config and tokenizer are copied from the last checkpoint, and the model is re-saved
    through `save_pretrained`, so `AutoModelForSeq2SeqLM.from_pretrained(output_dir)` loads it.
    """
    if not checkpoints:
        raise ValueError("No checkpoints to average.")
    checkpoints = [Path(c) for c in checkpoints]
    averaged = average_states([_load_state(c) for c in checkpoints], [str(c) for c in checkpoints])

    from transformers import AutoModelForSeq2SeqLM

    import vanilla_transformer  # noqa: F401  (registers the Auto classes)

    model = AutoModelForSeq2SeqLM.from_pretrained(checkpoints[-1])
    load_averaged_state(model, averaged)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)
    for name in TOKENIZER_FILES:
        if (checkpoints[-1] / name).is_file():
            shutil.copy2(checkpoints[-1] / name, output_dir / name)
    logger.info(f"Averaged {len(checkpoints)} checkpoints into {output_dir}.")
    return output_dir


def average_with_checkpoints(model: torch.nn.Module, run_dir: str | os.PathLike, count: int, step: int) -> list[str]:
    """Replace `model`'s weights (those of training step `step`) by their mean with the newest earlier checkpoints
    of `run_dir`, `count` states in all (§6.1); returns the names of what was averaged, newest last.

    The in-memory weights always take part, so the final step counts even when no checkpoint was written at it.
    With fewer earlier checkpoints than `count - 1`, all of them are used (and a warning says so).
    """
    if count < 2:
        raise ValueError(f"Averaging needs at least 2 states (got {count}).")
    run_dir = Path(run_dir)
    earlier = [(n, path) for n, path in numbered_checkpoints(run_dir, complete_only=True) if n < step][-(count - 1) :]
    if len(earlier) < count - 1:
        logger.warning(
            f"Averaging {len(earlier) + 1} states instead of {count}: {run_dir} has {len(earlier)} checkpoints before "
            f"step {step}; lower --save_steps to have more."
        )
    if not earlier:
        return [f"step {step}"]
    current = {name: tensor for name, tensor in model.state_dict().items()}
    states = [_load_state(path) for _, path in earlier]
    # safetensors leaves out tied copies; compare and average only what the checkpoints hold.
    current = {name: current[name] for name in states[0] if name in current}
    names = [path.name for _, path in earlier] + [f"step {step}"]
    load_averaged_state(model, average_states([*states, current], names))
    logger.info(f"Averaged the weights of {', '.join(names)} (§6.1).")
    return names
