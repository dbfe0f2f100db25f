"""Export a trained model folder to a CTranslate2 model folder, with CTranslate2's own converter API.

    python export/export_ctranslate2.py --model runs/base --output ct2/base
    python export/export_ctranslate2.py --model runs/base --output ct2/base-int8 --quantization int8

Installed as `vt-export-ctranslate2`; the logic lives in `vanilla_transformer.export.cli.export_ctranslate2_main`,
which returns the exit status (a user error is one line on stderr and status 2); options, the length limit and measured
speed are in export/README.md ("CTranslate2").
"""

from __future__ import annotations

import sys

from vanilla_transformer.export.cli import export_ctranslate2_main


def main(argv: list[str] | None = None) -> int:
    """The command with `argv` (default: the command line); returns the exit status."""
    return export_ctranslate2_main(argv)


if __name__ == "__main__":
    sys.exit(main())
