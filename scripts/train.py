"""Train a vanilla Transformer for translation with the paper's recipe (§5) on Seq2SeqTrainer.

Runs unchanged on one CPU/GPU or under `accelerate launch` (DDP, FSDP, DeepSpeed; see docs/TRAINING.md):

    python scripts/train.py --tokenizer_name out/tokenizer --output_dir out/model --preset small \\
        --do_train --predict_with_generate --max_steps 2000

Arguments: model (--preset, --config_overrides, --model_name_or_path), data (--train_file, --dataset_name, ...; the
default is the gettext corpus of this machine), the recipe (--paper_recipe, --lr_schedule, --max_tokens,
--length_penalty) and every `Seq2SeqTrainingArguments` flag. A single JSON file with all of them also works.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from transformers import HfArgumentParser, Seq2SeqTrainingArguments

from vanilla_transformer.training.data import DataArguments
from vanilla_transformer.training.experiment import ModelArguments, run_training
from vanilla_transformer.training.recipe import RecipeArguments, check_precision_flags, explicit_flags


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = HfArgumentParser((ModelArguments, DataArguments, RecipeArguments, Seq2SeqTrainingArguments))
    if len(argv) == 1 and argv[0].endswith(".json"):
        with open(argv[0]) as handle:
            settings = json.load(handle)
        check_precision_flags(
            [f"--{name}={settings[name]}" for name in ("fp16", "bf16", "use_cpu") if name in settings]
        )
        model_args, data_args, recipe, training_args = parser.parse_json_file(argv[0])
        explicit = set(settings)
    else:
        check_precision_flags(argv)
        model_args, data_args, recipe, training_args = parser.parse_args_into_dataclasses(argv)
        explicit = explicit_flags(argv)
    results = run_training(model_args, data_args, training_args, recipe, explicit)
    if training_args.process_index == 0:
        print(json.dumps({k: v for k, v in results.items() if k.startswith("test_") or k == "train_loss"}, indent=2))
    return results


if __name__ == "__main__":
    main()
