"""The main job: gettext corpus → tokenizer → small Transformer on the CPU → BLEU/chrF → examples.

    python scripts/main_job.py                          # everything, about 20 minutes
    python scripts/main_job.py --time_budget_minutes 5  # a quicker, weaker run

Installed as `vt-main-job`; the logic lives in `vanilla_transformer.cli`. `main` is `main_job_command`, which returns
what it made (for Python callers); run as a script, `main_job_main` reports a user error as one line on stderr and exit
status 2.
"""

import sys

from vanilla_transformer.cli import main_job_command as main
from vanilla_transformer.cli import main_job_main

__all__ = ["main"]  # the command, for Python callers and tests

if __name__ == "__main__":
    sys.exit(main_job_main())
