"""Trainer callbacks of a training run: the metrics files next to the model, and the wall-clock time budget."""

from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path

from transformers import TrainerCallback
from transformers.utils import logging

logger = logging.get_logger(__name__)


class MetricsFileCallback(TrainerCallback):
    """Appends every log entry to `<output_dir>/metrics.jsonl` and `metrics.csv` (main process only)."""

    def __init__(self, output_dir: str | os.PathLike):
        self.output_dir = Path(output_dir)

    def on_train_begin(self, args, state, control, **kwargs):
        """On a resume from step k, drop the rows logged after step k by the interrupted run: training repeats those
        steps, so keeping them would log each twice. A fresh run (k = 0) in a used folder starts new files."""
        if state.is_world_process_zero:
            self.drop_rows_after(state.global_step)

    def drop_rows_after(self, step: int) -> None:
        """Rewrite metrics.jsonl and metrics.csv without the rows of steps > `step`."""
        path = self.output_dir / "metrics.jsonl"
        if path.is_file():
            lines = path.read_text(encoding="utf-8").splitlines()
            kept = [line for line in lines if _logged_step(line) <= step]
            if len(kept) < len(lines):
                logger.info(f"Training starts at step {step}: dropped {len(lines) - len(kept)} later rows of {path}.")
            path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        path = self.output_dir / "metrics.csv"
        if path.is_file():
            with path.open(encoding="utf-8", newline="") as handle:
                rows = list(csv.reader(handle))
            kept = rows[:1] + [row for row in rows[1:] if row and row[0].isdigit() and int(row[0]) <= step]
            with path.open("w", encoding="utf-8", newline="") as handle:
                csv.writer(handle).writerows(kept)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        record = {"step": state.global_step, "epoch": state.epoch, **logs}
        with (self.output_dir / "metrics.jsonl").open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        path = self.output_dir / "metrics.csv"
        is_new = not path.exists()
        with path.open("a", encoding="utf-8", newline="") as handle:
            writer = csv.writer(handle)
            if is_new:
                writer.writerow(["step", "epoch", "name", "value"])
            for name, value in logs.items():
                writer.writerow([state.global_step, state.epoch, name, value])


class TimeBudgetCallback(TrainerCallback):
    """Stops training (and saves) once `max_seconds` of wall-clock time have passed since training began; shows a
    progress bar over the budget (elapsed seconds, step, last loss) on the main process.

    With a learning-rate cooldown (`recipe.NoamSchedule`), it also tells the schedule how many steps the budget
    allows, from the mean time per step so far (validation pauses and checkpoints included), every `estimate_every`
    steps, and stops at that step count if it comes before the time is up.
    """

    def __init__(self, max_seconds: float, show_progress: bool = True, estimate_every: int = 10):
        self.max_seconds = max_seconds
        self.show_progress = show_progress
        self.estimate_every = estimate_every
        self.start = None
        self.start_step = 0
        self.cooldown_announced = False
        self.bar = None
        self.last_loss = float("nan")

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()
        self.start_step = state.global_step
        if self.show_progress and state.is_world_process_zero:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=round(self.max_seconds),
                desc="Training within the time budget",
                bar_format="{l_bar}{bar}| {n}/{total} s [{elapsed}<{remaining}{postfix}]",
            )

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.last_loss = logs["loss"]

    def on_step_end(self, args, state, control, **kwargs):
        if self.start is None:
            return
        elapsed = time.monotonic() - self.start
        if self.bar is not None:
            self.bar.update(min(round(elapsed), self.bar.total) - self.bar.n)
            self.bar.set_postfix(step=state.global_step, loss=f"{self.last_loss:.3f}", refresh=False)
        if _on_any_rank(elapsed > self.max_seconds):  # every rank must stop at the same step, or DDP would hang
            logger.warning(f"Time budget of {self.max_seconds:.0f}s reached at step {state.global_step}; stopping.")
            control.should_training_stop = True
            control.should_save = True
            return
        schedule = _cooldown_schedule(kwargs.get("lr_scheduler"))
        if schedule is None:
            return
        step, steps_run = state.global_step, state.global_step - self.start_step
        if steps_run % self.estimate_every == 0:
            allowed = step + int((self.max_seconds - elapsed) * steps_run / elapsed)
            # The same total on every rank (a rank's own clock would give each its own learning rate).
            schedule.set_total_steps(_min_on_all_ranks(allowed), step)
        if schedule.cooldown_started(step) and not self.cooldown_announced:
            self.cooldown_announced = True
            logger.info(f"Learning-rate cooldown until step {schedule.total_steps}, the end the time budget allows.")
        if step >= schedule.total_steps:
            logger.info(f"The cooldown ended at step {step}, within the time budget; stopping.")
            control.should_training_stop = True
            control.should_save = True

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _logged_step(line: str) -> float:
    """The step of a metrics.jsonl line; infinite (dropped) for a line cut short by a killed process."""
    try:
        return json.loads(line).get("step", 0)
    except (json.JSONDecodeError, AttributeError):
        return float("inf")


def _cooldown_schedule(lr_scheduler):
    """The `NoamSchedule` with a cooldown that drives `lr_scheduler`, or None."""
    from .recipe import NoamSchedule

    lambdas = getattr(lr_scheduler, "lr_lambdas", None) or [None]
    schedule = lambdas[0]
    return schedule if isinstance(schedule, NoamSchedule) and schedule.cooldown else None


def _min_on_all_ranks(value: int) -> int:
    """The smallest of every process's `value` (itself without torch.distributed)."""
    return int(_all_reduce(value, "MIN"))


def sum_over_ranks(value: int) -> int:
    """The sum of every process's `value` (itself without torch.distributed)."""
    return int(_all_reduce(value, "SUM"))


def _on_any_rank(flag: bool) -> bool:
    """True on every process if `flag` is true on at least one (a no-op without torch.distributed)."""
    return bool(_all_reduce(float(flag), "MAX"))


def _all_reduce(value: float, op: str) -> float:
    """`value` reduced over every process with `torch.distributed.ReduceOp.<op>`; `value` itself without it."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    on_gpu = dist.get_backend() == "nccl"
    tensor = torch.tensor(value, device=torch.device("cuda", torch.cuda.current_device()) if on_gpu else "cpu")
    dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
    return tensor.item()
