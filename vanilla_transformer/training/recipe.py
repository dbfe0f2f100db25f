"""The paper's training recipe (§5) as `Seq2SeqTrainingArguments` values: Adam(0.9, 0.98, 1e-9), the
warmup/inverse-square-root learning rate (§5.3, Eq. 3), label smoothing 0.1 (§5.4), token-budget batches (§5.1) and
beam search with a length penalty (§6.1). The Trainer that runs it is in `trainer.py`.
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import Seq2SeqTrainingArguments

# Each part of the recipe: Seq2SeqTrainingArguments field -> paper value (learning_rate is derived from d_model).
PAPER_TRAINING_DEFAULTS = {
    "adam_beta1": 0.9,  # §5.3
    "adam_beta2": 0.98,  # §5.3
    "adam_epsilon": 1e-9,  # §5.3
    "warmup_steps": 4000,  # §5.3
    "label_smoothing_factor": 0.1,  # §5.4
    "weight_decay": 0.0,  # not used by the paper
    "max_grad_norm": 0.0,  # the paper does not clip gradients
    "generation_num_beams": 4,  # §6.1
}
PAPER_LENGTH_PENALTY = 0.6  # §6.1 (transformers applies it as score / length**alpha, not GNMT's ((5+|Y|)/6)**alpha)
PAPER_MAX_TOKENS = 4096  # per device and side; ~25k per step needs max_tokens × processes × accumulation ≈ 25000


@dataclass
class RecipeArguments:
    """The paper's recipe as one switch; every part can still be set on the command line."""

    paper_recipe: bool = field(
        default=True,
        metadata={
            "help": "Apply the paper's recipe (§5): Adam betas (0.9, 0.98), eps 1e-9, warmup 4000, the d_model^-0.5 "
            "inverse-sqrt schedule, label smoothing 0.1, no weight decay or clipping, token-budget batches, beam 4 "
            "and length penalty 0.6. Flags given explicitly win; --paper_recipe false leaves Trainer defaults."
        },
    )
    lr_schedule: str = field(
        default="noam",
        metadata={
            "help": "'noam': lr = scale · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5) (§5.3, Eq. 3), with the "
            "scale taken from --learning_rate when it is given; 'trainer': use --lr_scheduler_type."
        },
    )
    max_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Token budget per device and batch, for the source and the target side each (padding counted); "
            f"pairs are grouped by length. Default {PAPER_MAX_TOKENS} with the recipe; 0 = use "
            "--per_device_train_batch_size."
        },
    )
    length_penalty: float | None = field(
        default=None,
        metadata={"help": f"Beam-search length penalty (default {PAPER_LENGTH_PENALTY} with the recipe)."},
    )
    average_checkpoints: int = field(
        default=0,
        metadata={
            "help": "After training, replace the final weights by their mean with the last N-1 checkpoints (N states "
            "in all; §6.1 averages the last 5 for base models) before the model is saved and tested. 0 or 1: off. "
            "Checkpoints come every --save_steps."
        },
    )


# --------------------------------------------------------------------------------------------------------------------
# Learning-rate schedule (§5.3, Eq. 3)
# --------------------------------------------------------------------------------------------------------------------


def _warmup_then_inverse_sqrt(step: int, warmup_steps: int) -> float:
    """min(step^-0.5, step · warmup_steps^-1.5): the shape of Eq. (3), linear up to `warmup_steps`, then 1/√step."""
    return min(step**-0.5, step * warmup_steps**-1.5)


def noam_learning_rate(step: int, d_model: int, warmup_steps: int = 4000) -> float:
    """lrate = d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5), paper Eq. (3); `step` counts from 1."""
    if step < 1 or warmup_steps < 1 or d_model < 1:
        raise ValueError(f"step, warmup_steps and d_model must be >= 1 (got {step}, {warmup_steps}, {d_model}).")
    return d_model**-0.5 * _warmup_then_inverse_sqrt(step, warmup_steps)


def noam_peak_learning_rate(d_model: int, warmup_steps: int = 4000) -> float:
    """The schedule's maximum, reached at step = warmup_steps: (d_model · warmup_steps)^-0.5."""
    return noam_learning_rate(warmup_steps, d_model, warmup_steps)


def _noam_multiplier(completed_steps: int, warmup_steps: int) -> float:
    step = completed_steps + 1  # LambdaLR counts completed updates; update number `step` uses this value
    return _warmup_then_inverse_sqrt(step, warmup_steps) * math.sqrt(warmup_steps)  # 1.0 at the peak


def get_noam_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR giving update n the rate `peak · min(n^-0.5, n · w^-1.5) · w^0.5`, where `peak` is the optimizer's lr.

    With peak = noam_peak_learning_rate(d_model, w) this is exactly Eq. (3).
    """
    if warmup_steps < 1:
        raise ValueError(f"The noam schedule needs warmup_steps >= 1 (got {warmup_steps}).")
    return torch.optim.lr_scheduler.LambdaLR(optimizer, functools.partial(_noam_multiplier, warmup_steps=warmup_steps))


# --------------------------------------------------------------------------------------------------------------------
# The recipe switch and command-line checks
# --------------------------------------------------------------------------------------------------------------------


def explicit_flags(argv: Sequence[str]) -> set[str]:
    """Names of the `--flags` present on a command line (to let explicit flags win over the recipe)."""
    return {arg[2:].split("=", 1)[0].replace("-", "_") for arg in argv if arg.startswith("--")}


def apply_paper_recipe(
    training_args: Seq2SeqTrainingArguments, recipe: RecipeArguments, d_model: int, explicit: set[str] = frozenset()
) -> Seq2SeqTrainingArguments:
    """Set the paper's values on `training_args` (in place) for every field not in `explicit`; returns it.

    Also fills `recipe.max_tokens` and `recipe.length_penalty`, and with the noam schedule sets `learning_rate` to the
    schedule's peak (d_model · warmup)^-0.5 unless --learning_rate was given.
    """
    if recipe.lr_schedule not in ("noam", "trainer"):
        raise ValueError(f"--lr_schedule must be 'noam' or 'trainer' (got {recipe.lr_schedule!r}).")
    if not recipe.paper_recipe:
        recipe.max_tokens = recipe.max_tokens or None
        return training_args
    for name, value in PAPER_TRAINING_DEFAULTS.items():
        if name not in explicit:
            setattr(training_args, name, value)
    if recipe.lr_schedule == "noam" and "learning_rate" not in explicit:
        training_args.learning_rate = noam_peak_learning_rate(d_model, int(training_args.warmup_steps))
    if recipe.max_tokens is None:
        recipe.max_tokens = PAPER_MAX_TOKENS
    recipe.max_tokens = recipe.max_tokens or None  # 0 switches token batching off
    if recipe.length_penalty is None:
        recipe.length_penalty = PAPER_LENGTH_PENALTY
    return training_args


def cpu_has_fast_bf16() -> bool:
    """Does this CPU multiply bf16 natively (AVX512-BF16 or AMX)? There bf16 autocast trains 1.2-1.6x faster than
    fp32 (TRAINING.md, "Mixed precision on the CPU"); elsewhere bf16 is emulated and slower than fp32."""
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


def check_precision_flags(argv: Sequence[str], has_gpu: bool | None = None) -> None:
    """Clear errors for `--fp16`/`--bf16` misuse, before transformers' own messages (which speak of GPUs).

    Both together are contradictory; `--bf16` on a machine without a GPU needs `--use_cpu` (bf16 autocast then runs
    on the CPU).
    """
    from transformers.hf_argparser import string_to_bool

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for name in ("fp16", "bf16", "use_cpu"):
        parser.add_argument(f"--{name}", type=string_to_bool, nargs="?", const=True, default=False)
    flags, _ = parser.parse_known_args(list(argv))
    if flags.fp16 and flags.bf16:
        raise ValueError(
            "--fp16 and --bf16 both ask for mixed precision; pass one: --bf16 (CPU with --use_cpu, Ampere or newer "
            "GPUs) or --fp16 (GPUs)."
        )
    if has_gpu is None:
        has_gpu = torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
    if flags.bf16 and not flags.use_cpu and not has_gpu:
        raise ValueError("--bf16 on a machine without a GPU needs --use_cpu: bf16 autocast then runs on the CPU.")
