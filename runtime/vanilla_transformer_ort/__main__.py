"""`python -m vanilla_transformer_ort FOLDER [TEXT ...]`: the `vt-translate-onnx` command (see `cli.py`)."""

from .cli import main

if __name__ == "__main__":
    main()
