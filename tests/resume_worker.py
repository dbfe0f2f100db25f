"""Run the training command (scripts/train.py, vt-train; directly or under `accelerate launch`), recording a digest
of the batch each optimizer step trains on, per rank; with `VT_TEST_KILL_AT_STEP=K`, rank 0 kills itself with SIGKILL
as step K + 1 begins (after checkpoint-K was written), as a crashed machine would.

Used by tests/test_distributed.py: `python tests/resume_worker.py <record_file_prefix> <train.py arguments>`.
"""

import hashlib
import json
import os
import signal
import sys
from pathlib import Path

from vanilla_transformer.cli import train_command
from vanilla_transformer.training import trainer as training

ROOT = Path(__file__).resolve().parents[1]
record_prefix = sys.argv[1]
kill_at = int(os.environ.get("VT_TEST_KILL_AT_STEP", "0"))
rank = int(os.environ.get("RANK", "0"))
_original_step = training.TranslationTrainer.training_step


def _recording_step(self, model, inputs, num_items_in_batch=None):
    step = self.state.global_step + 1
    if kill_at and step == kill_at + 1 and rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    digest = hashlib.sha256(inputs["input_ids"].numpy().tobytes()).hexdigest()[:16]
    with open(f"{record_prefix}-rank{rank}.jsonl", "a") as handle:
        handle.write(json.dumps({"step": step, "batch": digest}) + "\n")
    return _original_step(self, model, inputs, num_items_in_batch)


training.TranslationTrainer.training_step = _recording_step

train_command(sys.argv[2:])  # what scripts/train.py and vt-train run
