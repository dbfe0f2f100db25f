"""Train the joint source+target BPE tokenizer (paper §5.1: one ~37k vocabulary shared by both languages).

python scripts/train_tokenizer.py --output_dir out/tokenizer --vocab_size 8000            # gettext en→de
python scripts/train_tokenizer.py --train_file data/train.tsv --source_lang en --target_lang de --output_dir tok
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from vanilla_transformer.training.data import DataArguments, load_parallel_data
from vanilla_transformer.training.gettext_corpus import DEFAULT_LOCALE_DIR
from vanilla_transformer.training.tokenization import DEFAULT_VOCAB_SIZE, train_bpe_tokenizer


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", required=True, help="Folder for tokenizer.json / tokenizer_config.json.")
    parser.add_argument("--vocab_size", type=int, default=DEFAULT_VOCAB_SIZE)
    parser.add_argument("--min_frequency", type=int, default=2)
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="de")
    parser.add_argument("--train_file", help="TSV/CSV/JSON lines or Moses prefix; default: the gettext corpus.")
    parser.add_argument("--dataset_name", help="Hub dataset with a translation column (needs internet).")
    parser.add_argument("--dataset_config_name")
    parser.add_argument("--gettext_locale_dir", default=DEFAULT_LOCALE_DIR)
    parser.add_argument("--gettext_min_pairs", type=int, default=1000)
    parser.add_argument("--model_max_length", type=int, default=1024)
    args = parser.parse_args(argv)

    data_args = DataArguments(
        source_lang=args.source_lang, target_lang=args.target_lang, train_file=args.train_file,
        dataset_name=args.dataset_name, dataset_config_name=args.dataset_config_name,
        gettext_locale_dir=args.gettext_locale_dir, gettext_min_pairs=args.gettext_min_pairs,
    )  # fmt: skip
    train = load_parallel_data(data_args)["train"]  # the tokenizer never sees validation or test text

    def texts():
        for batch in train.iter(batch_size=1000):
            yield from batch["source"]
            yield from batch["target"]

    tokenizer = train_bpe_tokenizer(
        texts(), vocab_size=args.vocab_size, min_frequency=args.min_frequency,
        model_max_length=args.model_max_length, show_progress=True,
    )  # fmt: skip
    tokenizer.save_pretrained(args.output_dir)
    print(f"Saved a {len(tokenizer)}-token tokenizer ({len(train)} training pairs) to {args.output_dir}")
    return Path(args.output_dir)


if __name__ == "__main__":
    main()
