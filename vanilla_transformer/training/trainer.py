"""The Trainer of the paper's recipe: `Seq2SeqTrainer` plus batches of about N source + N target tokens grouped by
length (§5.1, `token_batches.py`), which the stock Trainer cannot build, the noam schedule (§5.3), a stop on a
non-finite loss, and the resolution of `--resume_from_checkpoint`. Runs unchanged under `accelerate launch` (DDP,
FSDP, DeepSpeed).
"""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from transformers import Seq2SeqTrainer
from transformers.utils import logging

from ..model.loss import IGNORE_INDEX
from .recipe import get_noam_schedule
from .token_batches import TokenBudgetBatchSampler, length_columns, pack_token_batches  # noqa: F401 (public here too)

logger = logging.get_logger(__name__)


# --------------------------------------------------------------------------------------------------------------------
# Resuming from a checkpoint
# --------------------------------------------------------------------------------------------------------------------

TRAINER_STATE_FILE = "trainer_state.json"  # written last into a checkpoint: its presence marks a complete one
_CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")


def is_complete_checkpoint(folder: str | os.PathLike) -> bool:
    """A `checkpoint-N` folder the Trainer finished writing: the trainer state (saved last) and model weights."""
    folder = Path(folder)
    weights = any((folder / name).is_file() for name in ("model.safetensors", "model.safetensors.index.json"))
    return (folder / TRAINER_STATE_FILE).is_file() and weights


def numbered_checkpoints(run_dir: str | os.PathLike, complete_only: bool = False) -> list[tuple[int, Path]]:
    """(step, folder) of every `checkpoint-<step>` folder of a training run, by step; with `complete_only`, the
    incomplete ones (a save that was interrupted) are left out with a warning."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = sorted(
        (int(m.group(1)), child)
        for child in run_dir.iterdir()
        if child.is_dir() and (m := _CHECKPOINT_NAME.match(child.name))
    )
    if not complete_only:
        return found
    complete = []
    for step, folder in found:
        if is_complete_checkpoint(folder):
            complete.append((step, folder))
        else:
            logger.warning(f"Skipping incomplete checkpoint {folder} (no {TRAINER_STATE_FILE} or weights).")
    return complete


def last_complete_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The highest-numbered complete `checkpoint-N` in `output_dir`; incomplete ones (a save that was interrupted)
    are skipped with a warning."""
    for _, folder in reversed(numbered_checkpoints(output_dir)):
        if is_complete_checkpoint(folder):
            return folder
        logger.warning(f"Skipping incomplete checkpoint {folder} (no {TRAINER_STATE_FILE} or weights).")
    return None


def resolve_resume_checkpoint(value: str | bool | None, output_dir: str | os.PathLike) -> str | None:
    """What `--resume_from_checkpoint` names, as a checkpoint folder for `Trainer.train`.

    `True`/"true"/"last" or a run folder (one holding `checkpoint-N` folders) mean its last complete checkpoint; a
    checkpoint folder is used as given if complete. None, False, "" or "false" mean a fresh start.
    """
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() in ("", "false", "no")):
        return None
    if value is True or (isinstance(value, str) and value.strip().lower() in ("true", "yes", "last")):
        folder = last_complete_checkpoint(output_dir)
        if folder is None:
            raise ValueError(
                f"--resume_from_checkpoint {value}: no complete checkpoint-N folder in --output_dir {output_dir}. "
                "Start without --resume_from_checkpoint, or pass the checkpoint folder."
            )
        return str(folder)
    path = Path(value)
    if not path.is_dir():
        raise ValueError(f"--resume_from_checkpoint {value}: no such folder (pass a checkpoint-N folder, or True).")
    if is_complete_checkpoint(path):
        return str(path)
    folder = last_complete_checkpoint(path)
    if folder is not None:
        return str(folder)
    if _CHECKPOINT_NAME.match(path.name):
        previous = last_complete_checkpoint(path.parent)
        hint = f" The last complete one is {previous}." if previous else ""
        raise ValueError(
            f"--resume_from_checkpoint {value} is incomplete (no {TRAINER_STATE_FILE} or weights; was its saving "
            f"interrupted?).{hint}"
        )
    raise ValueError(f"--resume_from_checkpoint {value} holds no complete checkpoint-N folder.")


# --------------------------------------------------------------------------------------------------------------------
# The Trainer
# --------------------------------------------------------------------------------------------------------------------


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; raised before the update, so no checkpoint holds it."""


class TranslationTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` plus token-budget batches (distinct per rank) and the paper's learning-rate schedule.

    Label smoothing (`label_smoothing_factor`, §5.4) is computed by the model's own loss (`model/loss.py`) instead of
    the Trainer's `LabelSmoother`: the same value, without the log-softmax tensors of (tokens, vocab) floats.
    """

    def __init__(
        self, *args, max_tokens: int | None = None, lr_schedule: str = "noam", lr_cooldown: float = 0.0, **kwargs
    ):
        super().__init__(*args, **kwargs)
        self.max_tokens = max_tokens
        self.lr_schedule = lr_schedule
        self.lr_cooldown = lr_cooldown
        self.model_label_smoothing = 0.0
        self.tokens_seen = {"source": 0, "target": 0}  # non-padding training tokens, this process, this session
        model = self.accelerator.unwrap_model(self.model)
        if self.label_smoother is not None and "label_smoothing" in inspect.signature(model.forward).parameters:
            self.model_label_smoothing, self.label_smoother = self.label_smoother.epsilon, None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            if "attention_mask" in inputs:
                self.tokens_seen["source"] += int(inputs["attention_mask"].sum())
            if "labels" in inputs:
                self.tokens_seen["target"] += int((inputs["labels"] != IGNORE_INDEX).sum())
        if self.model_label_smoothing and "labels" in inputs:
            inputs = {**inputs, "label_smoothing": self.model_label_smoothing}
        return super().compute_loss(
            model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )

    def training_step(self, model, inputs, num_items_in_batch=None):
        """The Trainer's step, stopped before the update when the loss is not finite: an update with NaN gradients
        would spoil every weight, and the next checkpoint with it. (The Trainer syncs on this value itself when it
        filters NaN logs, so the check costs no extra synchronisation there.)"""
        loss = super().training_step(model, inputs, num_items_in_batch)
        if not bool(torch.isfinite(loss).all()):
            step = self.state.global_step + 1
            raise NonFiniteLossError(
                f"The training loss is {loss.item()} at step {step} (update {step} of {self.state.max_steps}); "
                f"stopping before the update, so the checkpoints in {self.args.output_dir} stay finite. Lower "
                "--learning_rate, set --max_grad_norm, use --bf16 instead of --fp16, or check the data, then resume "
                "with --resume_from_checkpoint True."
            )
        return loss

    def get_train_dataloader(self) -> DataLoader:
        if not self.max_tokens:
            return super().get_train_dataloader()
        dataset = self.train_dataset
        source_lengths, target_lengths = length_columns(dataset)
        sampler = TokenBudgetBatchSampler(
            source_lengths,
            target_lengths,
            max_tokens=self.max_tokens,
            num_replicas=max(1, self.args.world_size),
            rank=self.args.process_index,
            seed=self.args.data_seed if self.args.data_seed is not None else self.args.seed,
        )
        dataset = self._remove_unused_columns(dataset, description="Training")
        loader = DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )
        loader = self.accelerator.prepare(loader)
        # The sampler already gives each rank its own batches; make accelerate's BatchSamplerShard a passthrough so it
        # does not shard them a second time (the Trainer does the same for its BatchRebalanceSampler).
        shard = getattr(loader, "batch_sampler", None)
        if shard is not None and getattr(shard, "batch_sampler", None) is sampler:
            shard.num_processes, shard.process_index = 1, 0
        return loader

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        if self.lr_schedule != "noam":
            return super().create_scheduler(num_training_steps, optimizer)
        if self.lr_scheduler is None:
            self.lr_scheduler = get_noam_schedule(
                optimizer or self.optimizer, int(self.args.warmup_steps), self.lr_cooldown, num_training_steps
            )
            self._created_lr_scheduler = True
        return self.lr_scheduler
