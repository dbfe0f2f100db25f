"""The main job: harvest the English→German gettext corpus of this machine, train the tokenizer and a small
Transformer on the CPU within a time budget (default 20 minutes), report BLEU/chrF on the held-out split, save the
model and translate a few examples.

    python scripts/main_job.py                          # everything, about 20 minutes
    python scripts/main_job.py --time_budget_minutes 5  # a quicker, weaker run
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from transformers import HfArgumentParser
from transformers.utils import logging

from vanilla_transformer.training.main_job import MainJobArguments, run_main_job


def main(argv: list[str] | None = None) -> dict:
    (args,) = HfArgumentParser(MainJobArguments).parse_args_into_dataclasses(argv)
    logging.set_verbosity_warning()
    summary = run_main_job(args)
    print(json.dumps(summary, indent=2, ensure_ascii=False))
    print(f"\nBLEU {summary['test_bleu']}  chrF {summary['test_chrf']}  on {summary['test_pairs']} held-out pairs; "
          f"model in {summary['model_dir']}")  # fmt: skip
    return summary


if __name__ == "__main__":
    main()
