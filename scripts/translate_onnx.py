"""Translate with an exported ONNX folder, without torch: `python scripts/translate_onnx.py FOLDER "text" ...`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from vanilla_transformer_ort.__main__ import main  # noqa: E402

if __name__ == "__main__":
    main()
