"""Convert a MarianMT / OPUS-MT checkpoint (a folder or a Hub id) into a vanilla-transformer model folder, exactly.

    python scripts/convert_marian.py --model Helsinki-NLP/opus-mt-en-de --output out/opus-mt-en-de

The folder holds the model (with its remote code), Marian's generation config and tokenizer files; it loads with
`AutoModelForSeq2SeqLM.from_pretrained`, fine-tunes with scripts/train.py and exports with export/export_onnx.py.
The logic lives in `vanilla_transformer.convert`.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from vanilla_transformer.convert import ConversionReport, save_converted  # noqa: E402


def main(argv: list[str] | None = None) -> ConversionReport:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", required=True, help="MarianMTModel folder or Hub id (e.g. Helsinki-NLP/opus-mt-en-de)"
    )
    parser.add_argument("--output", required=True, help="folder to write")
    parser.add_argument("--no_verify", action="store_true", help="skip the logits comparison with MarianMTModel")
    args = parser.parse_args(argv)
    report = save_converted(args.model, args.output, verify=not args.no_verify)
    print(report)
    print(f"Saved to {args.output}")
    return report


if __name__ == "__main__":
    main()
