"""sacreBLEU and chrF of a model folder on a test file, beam 4 by default.

    python scripts/evaluate.py --model out/model --test_file ../shared/data/gettext-en-de/test.tsv

Installed as `vt-evaluate`; the logic lives in `vanilla_transformer.cli`. `main` is `evaluate_command`, which returns
what it made (for Python callers); run as a script, `evaluate_main` reports a user error as one line on stderr and exit
status 2.
"""

import sys

from vanilla_transformer.cli import evaluate_command as main
from vanilla_transformer.cli import evaluate_main

__all__ = ["main"]  # the command, for Python callers and tests

if __name__ == "__main__":
    sys.exit(evaluate_main())
