"""Translate with an exported ONNX folder, without torch: `python scripts/translate_onnx.py FOLDER "text" ...`.

The same command as `vt-translate-onnx` and `python -m vanilla_transformer_ort` (`vanilla_transformer_ort.cli`).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from vanilla_transformer_ort.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
