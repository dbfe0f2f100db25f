"""Export a trained model folder to a CTranslate2 model folder, with CTranslate2's own converter API.

    python export/export_ctranslate2.py --model runs/base --output ct2/base
    python export/export_ctranslate2.py --model runs/base --output ct2/base-int8 --quantization int8

The logic lives in `vanilla_transformer.export.cli.export_ctranslate2_main`; options, the length limit and measured
speed are in export/README.md ("CTranslate2").
"""

from __future__ import annotations

import sys

from vanilla_transformer.export.cli import export_ctranslate2_main


def main(argv: list[str] | None = None) -> int:
    return export_ctranslate2_main(argv)


if __name__ == "__main__":
    sys.exit(main())
