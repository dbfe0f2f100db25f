"""Export a trained model folder as a native MarianMT folder (transformers' `MarianMTModel`), exactly.

    python export/export_marian.py --model runs/base --output runs/base-marian
    python export/export_marian.py --model runs/base --output runs/base-marian --max_positions 512 --overwrite

Installed as `vt-export-marian`; the logic lives in `vanilla_transformer.marian_export` and the command in
`vanilla_transformer.export.cli.export_marian_main`, which returns the exit status (a user error is one line on
stderr and status 2); the position-table rule and what is refused are in docs/marian-export.md.
"""

from __future__ import annotations

import sys

from vanilla_transformer.export.cli import export_marian_main


def main(argv: list[str] | None = None) -> int:
    """The command with `argv` (default: the command line); returns the exit status."""
    return export_marian_main(argv)


if __name__ == "__main__":
    sys.exit(main())
