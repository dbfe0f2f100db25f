"""Export a trained model folder to ONNX (encoder, one-step decoder and helper graphs) for onnxruntime serving.

    python export/export_onnx.py --model runs/base --output onnx/base --validate
    python export/export_onnx.py --model runs/base --output onnx/base-int8 --quantize int8 --validate
    python export/export_onnx.py --model runs/base --output onnx/base-fp16 --dtype fp16

Installed as `vt-export-onnx`; the logic lives in `vanilla_transformer.export.cli.export_onnx_main`, which returns the
exit status (a user error is one line on stderr and status 2); graphs, names and shapes are documented in
export/README.md.
"""

from __future__ import annotations

import sys

from vanilla_transformer.export.cli import export_onnx_main


def main(argv: list[str] | None = None) -> int:
    """The command with `argv` (default: the command line); returns the exit status."""
    return export_onnx_main(argv)


if __name__ == "__main__":
    sys.exit(main())
