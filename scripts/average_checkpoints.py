"""Average the last N checkpoints of a training run into a loadable model folder (paper §6.1).

    python scripts/average_checkpoints.py --run_dir out/model --num_checkpoints 5 --output out/model-avg5

Installed as `vt-average-checkpoints`; the logic lives in `vanilla_transformer.cli`. `main` is
`average_checkpoints_command`, which returns what it made (for Python callers); run as a script,
`average_checkpoints_main` reports a user error as one line on stderr and exit status 2.
"""

import sys

from vanilla_transformer.cli import average_checkpoints_command as main
from vanilla_transformer.cli import average_checkpoints_main

__all__ = ["main"]  # the command, for Python callers and tests

if __name__ == "__main__":
    sys.exit(average_checkpoints_main())
