"""Translate a file (one sentence per line) or stdin with a trained model.

    echo "File not found." | python scripts/translate.py --model out/model

Installed as `vt-translate`; the logic lives in `vanilla_transformer.cli`. `main` is `translate_command`, which returns
what it made (for Python callers); run as a script, `translate_main` reports a user error as one line on stderr and
exit status 2.
"""

import sys

from vanilla_transformer.cli import translate_command as main
from vanilla_transformer.cli import translate_main

__all__ = ["main"]  # the command, for Python callers and tests

if __name__ == "__main__":
    sys.exit(translate_main())
