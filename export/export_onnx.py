"""vt-export-onnx as a file, for a checkout: `python export/export_onnx.py --help`."""

from vanilla_transformer.export.cli import export_onnx_main

if __name__ == "__main__":
    raise SystemExit(export_onnx_main())
