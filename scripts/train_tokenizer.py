"""Train the joint source+target BPE tokenizer (paper §5.1).

    python scripts/train_tokenizer.py --output out/tokenizer --vocab_size 8000

Installed as `vt-train-tokenizer`; the logic lives in `vanilla_transformer.cli`. `main` is `train_tokenizer_command`,
which returns what it made (for Python callers); run as a script, `train_tokenizer_main` reports a user error as one
line on stderr and exit status 2.
"""

import sys

from vanilla_transformer.cli import train_tokenizer_command as main
from vanilla_transformer.cli import train_tokenizer_main

__all__ = ["main"]  # the command, for Python callers and tests

if __name__ == "__main__":
    sys.exit(train_tokenizer_main())
