"""`python -m vanilla_transformer_ort --model FOLDER [TEXT ...]`: the `vt-translate-onnx` command (see `cli.py`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
