"""Run the training command (scripts/train.py, vt-train) unchanged under `accelerate launch`, recording the batches
each rank's sampler yields.

Used by tests/test_distributed.py: `accelerate launch ... tests/ddp_worker.py <record_dir> <train.py arguments>`;
`VT_TEST_PREPARE_DELAY=S` makes preparing the corpus take S seconds longer.
"""

import json
import os
import sys
import time
from pathlib import Path

from vanilla_transformer.cli import train_command
from vanilla_transformer.training import prepared
from vanilla_transformer.training import trainer as training

ROOT = Path(__file__).resolve().parents[1]

record_dir = Path(sys.argv[1])
recorded: list[list[int]] = []
identity: dict[str, int] = {}
_original_iter = training.TokenBudgetBatchSampler.__iter__


def _recording_iter(self):
    identity.update(rank=self.rank, num_replicas=self.num_replicas)
    for batch in _original_iter(self):
        recorded.append([int(i) for i in batch])
        yield batch


training.TokenBudgetBatchSampler.__iter__ = _recording_iter

# VT_TEST_PREPARE_DELAY=S: the corpus takes S seconds longer to prepare (a large corpus, for the timeout check).
_delay = float(os.environ.get("VT_TEST_PREPARE_DELAY", "0"))
_original_write = prepared._write_prepared


def _slow_write(*args, **kwargs):
    time.sleep(_delay)
    return _original_write(*args, **kwargs)


prepared._write_prepared = _slow_write

train_command(sys.argv[2:])  # what scripts/train.py and vt-train run

record_dir.mkdir(parents=True, exist_ok=True)
(record_dir / f"batches-rank{identity['rank']}.json").write_text(json.dumps({**identity, "batches": recorded}))
