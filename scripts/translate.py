"""Translate a file (one sentence per line) or stdin with a trained model, in batches with beam search.

echo "File not found." | python scripts/translate.py --model out/model
python scripts/translate.py --model out/model --input_file news.en --output_file news.de --num_beams 4
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from vanilla_transformer.inference import load_translation_model, translate
from vanilla_transformer.training.data import read_text_file


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="Model folder (scripts/train.py --output_dir).")
    parser.add_argument("--input_file", help="Sentences to translate, one per line (default: stdin).")
    parser.add_argument("--output_file", help="Where to write translations (default: stdout).")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--num_beams", type=int, help="Beam size (default: the model's, 4 after paper training).")
    parser.add_argument("--length_penalty", type=float, help="Default: the model's (0.6 after paper training).")
    parser.add_argument("--max_length", type=int, help="Longest output in tokens (default: the model's).")
    parser.add_argument("--device", help="cpu, cuda, ... (default: cuda when available).")
    args = parser.parse_args(argv)

    if args.input_file:
        if not Path(args.input_file).is_file():
            parser.error(f"--input_file {args.input_file} does not exist")
        lines = read_text_file(Path(args.input_file)).splitlines()  # a non-UTF-8 byte is an error naming the line
    else:
        lines = sys.stdin.read().splitlines()
    model, tokenizer = load_translation_model(args.model, args.device)
    translations = translate(
        model, tokenizer, lines, batch_size=args.batch_size, num_beams=args.num_beams,
        length_penalty=args.length_penalty, max_length=args.max_length,
    )  # fmt: skip
    text = "\n".join(translations) + ("\n" if translations else "")
    if args.output_file:
        Path(args.output_file).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return translations


if __name__ == "__main__":
    main()
