"""Translate with an exported ONNX folder, without torch.

    python scripts/translate_onnx.py --model FOLDER "text" ...
    python scripts/translate_onnx.py --model FOLDER --input news.en --output news.de --workers 2

The same command as `vt-translate-onnx` and `python -m vanilla_transformer_ort` (`vanilla_transformer_ort.cli`).
"""

import sys

from vanilla_transformer_ort.cli import main

if __name__ == "__main__":
    sys.exit(main())
