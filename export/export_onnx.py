"""Export a trained model folder to ONNX (encoder + one-step decoder) for onnxruntime serving.

    python export/export_onnx.py --model runs/base --output onnx/base --validate
    python export/export_onnx.py --model runs/base --output onnx/base-int8 --quantize int8 --validate
    python export/export_onnx.py --model runs/base --output onnx/base-fp16 --dtype fp16

The logic lives in `vanilla_transformer.export`; graphs, names and shapes are documented in export/README.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from vanilla_transformer.export.onnx_export import DEFAULT_OPSET, FP32_TOLERANCE, export_model  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="save_pretrained folder (config, weights, tokenizer)")
    parser.add_argument("--output", required=True, help="export folder to write")
    parser.add_argument("--tokenizer", default=None, help="folder with tokenizer.json (default: --model)")
    parser.add_argument("--dtype", choices=["fp32", "fp16"], default="fp32", help="fp16 is meant for GPU serving")
    parser.add_argument("--quantize", choices=["int8"], default=None, help="dynamic int8 quantization (CPU)")
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET)
    parser.add_argument("--validate", action="store_true", help="compare onnxruntime with PyTorch on a shape grid")
    parser.add_argument("--tolerance", type=float, default=FP32_TOLERANCE, help="max abs difference allowed (fp32)")
    args = parser.parse_args(argv)

    try:
        manifest = export_model(
            args.model,
            args.output,
            dtype=args.dtype,
            quantize=args.quantize,
            opset=args.opset,
            validate=args.validate,
            tokenizer_dir=args.tokenizer,
            tolerance=args.tolerance,
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except OSError as error:  # read-only or full disk, missing permissions: name the file and the cause
        where = error.filename or args.output
        print(
            f"error: cannot write or read {where}: {error.strerror or error} (--output {args.output})", file=sys.stderr
        )
        return 1
    print(f"Exported to {args.output} (opset {manifest['opset']}, {manifest['dtype']}, {manifest['quantization']})")
    for name, size in manifest["files"].items():
        print(f"  {name:28s} {size / 2**20:9.2f} MiB")
    for variant, diffs in manifest.get("validation", {}).items():
        rounded = {kind: float(f"{value:.3g}") for kind, value in diffs.items()}
        print(f"  max |onnxruntime - PyTorch| {variant}: {json.dumps(rounded)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
