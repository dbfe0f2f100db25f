"""Run scripts/train.py unchanged under `accelerate launch`, recording the batches each rank's sampler yields.

Used by tests/test_distributed.py: `accelerate launch ... tests/ddp_worker.py <record_dir> <train.py arguments>`.
"""

import importlib.util
import json
import sys
from pathlib import Path

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

spec = importlib.util.spec_from_file_location("train_script", ROOT / "scripts" / "train.py")
train_script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train_script)
train_script.main(sys.argv[2:])

record_dir.mkdir(parents=True, exist_ok=True)
(record_dir / f"batches-rank{identity['rank']}.json").write_text(json.dumps({**identity, "batches": recorded}))
