"""Export a trained model folder to a CTranslate2 model folder, with CTranslate2's own converter API.

    python export/export_ctranslate2.py --model runs/base --output ct2/base
    python export/export_ctranslate2.py --model runs/base --output ct2/base-int8 --quantization int8

The logic lives in `vanilla_transformer.export.ctranslate2_export`; options, the length limit and measured speed are in
export/README.md ("CTranslate2").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from vanilla_transformer.export.ctranslate2_export import QUANTIZATIONS, export_ctranslate2  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="save_pretrained folder (config, weights, tokenizer)")
    parser.add_argument("--output", required=True, help="CTranslate2 model folder to write")
    parser.add_argument("--tokenizer", default=None, help="folder with tokenizer.json (default: --model)")
    parser.add_argument("--quantization", choices=QUANTIZATIONS, default=None, help="weight type (default float32)")
    parser.add_argument(
        "--max_positions",
        type=int,
        default=None,
        help="rows of the position table: the longest source and max_decoding_length CTranslate2 accepts "
        "(default max(1024, config.max_position_embeddings))",
    )
    parser.add_argument("--force", action="store_true", help="overwrite --output if it exists")
    args = parser.parse_args(argv)

    try:
        output = export_ctranslate2(
            args.model,
            args.output,
            quantization=args.quantization,
            max_positions=args.max_positions,
            tokenizer_dir=args.tokenizer,
            force=args.force,
        )
    except (ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"Exported to {output} ({args.quantization or 'float32'} weights)")
    for path in sorted(output.iterdir()):
        print(f"  {path.name:28s} {path.stat().st_size / 2**20:9.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
