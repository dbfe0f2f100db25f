"""sacreBLEU and chrF of a model folder on a test file (TSV/CSV/JSON lines/Moses prefix), beam 4 by default.

python scripts/evaluate.py --model out/model --test_file ../shared/data/gettext-en-de/test.tsv
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from vanilla_transformer.inference import evaluate_translations, load_translation_model
from vanilla_transformer.training.data import read_parallel_file


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="Model folder (scripts/train.py --output_dir).")
    parser.add_argument("--test_file", required=True)
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="de")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--num_beams", type=int, default=4)
    parser.add_argument("--length_penalty", type=float, default=0.6)
    parser.add_argument("--max_samples", type=int, help="Score only the first N pairs.")
    parser.add_argument("--output_file", help="Also write the translations here.")
    parser.add_argument("--device")
    args = parser.parse_args(argv)

    test = read_parallel_file(args.test_file, args.source_lang, args.target_lang)
    if args.max_samples:
        test = test.select(range(min(args.max_samples, len(test))))
    model, tokenizer = load_translation_model(args.model, args.device)
    scores, hypotheses = evaluate_translations(
        model, tokenizer, test["source"], test["target"], batch_size=args.batch_size, num_beams=args.num_beams,
        length_penalty=args.length_penalty,
    )  # fmt: skip
    if args.output_file:
        Path(args.output_file).write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    result = {"bleu": round(scores["bleu"], 2), "chrf": round(scores["chrf"], 2), "pairs": len(test)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
