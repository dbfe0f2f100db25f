"""`python -m vanilla_transformer_ort.serve FOLDER [FOLDER ...]`: the `vt-serve` command (see `cli.py`)."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
