"""The paper's training recipe (§5) as `Seq2SeqTrainingArguments` values: Adam(0.9, 0.98, 1e-9), the
warmup/inverse-square-root learning rate (§5.3, Eq. 3), label smoothing 0.1 (§5.4), token-budget batches (§5.1) and
beam search with a length penalty (§6.1). The Trainer that runs it is in `trainer.py`.
"""

from __future__ import annotations

import argparse
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
    lr_cooldown: float = field(
        default=0.0,
        metadata={
            "help": "With the noam schedule: let the learning rate fall linearly to 0 over this fraction of the "
            "training steps at the end (--max_steps, or the steps the time budget allows, estimated as training "
            "runs). 0: off, as in the paper (training.md has its A/B)."
        },
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


def linear_cooldown_factor(step: int, total_steps: int, cooldown_steps: int) -> float:
    """1 before the last `cooldown_steps` of `total_steps` updates, then falling linearly: update `total_steps` (the
    last) gets 1/cooldown_steps, the update after it would get 0."""
    if cooldown_steps < 1:
        return 1.0
    return min(1.0, max(0.0, (total_steps - step + 1) / cooldown_steps))


class NoamSchedule:
    """The multiplier of the peak learning rate for update `step`: Eq. (3)'s shape, 1.0 at the end of the warmup,
    then optionally a linear cooldown to zero over the last `cooldown` fraction of `total_steps` updates.

    Deviation from paper: the cooldown (off in vt-train) is not in the paper, whose runs end on Eq. (3)'s 1/√step
    and average checkpoints instead (§6.1). It is for runs with a fixed budget of steps or time: the main job cools
    down over its last 20 % and keeps the final weights, which scored above its averaged plain-schedule weights on
    its test split and out of domain, two seeds each (training.md, "Out of domain").

    A callable object rather than a closure, so that LambdaLR saves its state with each checkpoint. Under a time
    budget the total is not known in advance: `set_total_steps` moves it (and the cooldown with it) until the
    cooldown is reached; after that it can only bring the end closer, keeping the cooldown's length, so the rate
    never rises again.
    """

    def __init__(self, warmup_steps: int, cooldown: float = 0.0, total_steps: int | None = None):
        if warmup_steps < 1:
            raise ValueError(f"The noam schedule needs warmup_steps >= 1 (got {warmup_steps}).")
        if not 0.0 <= cooldown < 1.0:
            raise ValueError(f"The cooldown is a fraction of the training steps in [0, 1) (got {cooldown}).")
        if cooldown and (total_steps is None or total_steps < 1):
            raise ValueError(f"A cooldown needs the number of training steps (got total_steps={total_steps}).")
        self.warmup_steps, self.cooldown = warmup_steps, cooldown
        self.total_steps = total_steps
        self.cooldown_steps = round(cooldown * total_steps) if cooldown else 0

    def cooldown_started(self, completed_steps: int) -> bool:
        """Has training reached the cooldown (the last update at the plain schedule's rate, or later)?"""
        return bool(self.cooldown_steps) and completed_steps > self.total_steps - self.cooldown_steps

    def set_total_steps(self, total_steps: int, completed_steps: int) -> bool:
        """Move the end of training (and so the cooldown); True if it moved. Before the cooldown any move; once
        in it, only an earlier end (never before the next update)."""
        total_steps = max(int(total_steps), completed_steps + 1)
        if not self.cooldown or total_steps == self.total_steps:
            return False
        if self.cooldown_started(completed_steps):
            if total_steps > self.total_steps:
                return False
        else:
            self.cooldown_steps = round(self.cooldown * total_steps)
        self.total_steps = total_steps
        return True

    def __call__(self, completed_steps: int) -> float:
        step = completed_steps + 1  # LambdaLR counts completed updates; update number `step` uses this value
        multiplier = _warmup_then_inverse_sqrt(step, self.warmup_steps) * math.sqrt(self.warmup_steps)
        if self.cooldown:
            multiplier *= linear_cooldown_factor(step, self.total_steps, self.cooldown_steps)
        return multiplier  # 1.0 at the peak


def get_noam_schedule(
    optimizer: torch.optim.Optimizer, warmup_steps: int, cooldown: float = 0.0, total_steps: int | None = None
) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR giving update n the rate `peak · min(n^-0.5, n · w^-1.5) · w^0.5`, where `peak` is the optimizer's lr,
    times the linear cooldown of `NoamSchedule` when `cooldown` > 0.

    With peak = noam_peak_learning_rate(d_model, w) and no cooldown this is exactly Eq. (3).
    """
    return torch.optim.lr_scheduler.LambdaLR(optimizer, NoamSchedule(warmup_steps, cooldown, total_steps))


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
    if not 0.0 <= recipe.lr_cooldown < 1.0:
        raise ValueError(f"--lr_cooldown is a fraction of the training steps in [0, 1) (got {recipe.lr_cooldown}).")
    if recipe.lr_cooldown and recipe.lr_schedule != "noam":
        raise ValueError(
            "--lr_cooldown belongs to the noam schedule; with --lr_schedule trainer choose a decaying "
            "--lr_scheduler_type (e.g. linear or cosine) instead."
        )
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
    fp32 (training.md, "Mixed precision on the CPU"); elsewhere bf16 is emulated and slower than fp32."""
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
