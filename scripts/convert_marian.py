"""Convert a MarianMT / OPUS-MT checkpoint into a vanilla-transformer model folder, exactly.

    python scripts/convert_marian.py --model Helsinki-NLP/opus-mt-en-de --output out/opus-mt-en-de

Installed as `vt-convert-marian`; the logic lives in `vanilla_transformer.cli`. `main` is `convert_marian_command`,
which returns what it made (for Python callers); run as a script, `convert_marian_main` reports a user error as one
line on stderr and exit status 2.
"""

import sys

from vanilla_transformer.cli import convert_marian_command as main
from vanilla_transformer.cli import convert_marian_main

__all__ = ["main"]  # the command, for Python callers and tests

if __name__ == "__main__":
    sys.exit(convert_marian_main())
