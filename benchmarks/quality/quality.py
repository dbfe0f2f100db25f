"""Quality bar: this package's model against transformers' MarianMTModel trained alike, sacreBLEU/chrF per seed into
`<output_dir>/quality.json`; the recipes and runs: docs/experiments/quality-benchmark.md."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import MarianMTModel, Seq2SeqTrainingArguments
from transformers.utils import logging

from benchmarks import common
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.inference import evaluate_translations
from vanilla_transformer.marian.exporter import marian_config_from
from vanilla_transformer.training.data import DataArguments, load_parallel_data, tokenize_parallel
from vanilla_transformer.training.experiment import build_trainer, parse_config_overrides, set_generation_defaults
from vanilla_transformer.training.recipe import RecipeArguments, apply_paper_recipe
from vanilla_transformer.training.tokenization import train_bpe_tokenizer


def build(kind: str, config: VanillaTransformerConfig, seed: int):
    """Our model, or a freshly initialised MarianMTModel computing the same function (`marian_config_from`)."""
    torch.manual_seed(seed)
    if kind == "vanilla":
        return VanillaTransformerForConditionalGeneration(config)
    marian = marian_config_from(config, max_positions=config.max_position_embeddings)
    marian.forced_eos_token_id = config.eos_token_id
    return MarianMTModel(marian)


def recipe_arguments(args, output_dir: Path, seed: int, d_model: int):
    """Trainer arguments and recipe of `--recipe`: the paper's (`package`) or transformers' plain one (`reference`)."""
    shared = dict(
        output_dir=str(output_dir), max_steps=args.steps, seed=seed, logging_steps=50, save_strategy="no",
        report_to="none", use_cpu=not torch.cuda.is_available(), disable_tqdm=False,
    )  # fmt: skip
    if args.recipe == "reference":
        training_args = Seq2SeqTrainingArguments(
            **shared, learning_rate=1e-3, lr_scheduler_type="inverse_sqrt", warmup_steps=500, adam_beta2=0.98,
            adam_epsilon=1e-9, weight_decay=0.0, label_smoothing_factor=0.1, max_grad_norm=1.0,
            per_device_train_batch_size=args.batch_size, train_sampling_strategy="group_by_length",
        )  # fmt: skip
        return training_args, RecipeArguments(paper_recipe=False, lr_schedule="trainer", max_tokens=None,
                                              length_penalty=0.6)  # fmt: skip
    training_args = Seq2SeqTrainingArguments(
        **shared, warmup_steps=args.warmup_steps, learning_rate=args.learning_rate
    )
    recipe = RecipeArguments(max_tokens=args.max_tokens)
    apply_paper_recipe(training_args, recipe, d_model, explicit={"warmup_steps", "learning_rate"})
    return training_args, recipe


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", default=str(common.ROOT.parent / "shared" / "data" / "gettext-en-de"))
    parser.add_argument("--output_dir", default=str(common.ROOT / "outputs" / "quality"))
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--config_overrides", default=None)
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup_steps", type=int, default=100)
    parser.add_argument("--learning_rate", type=float, default=2e-3, help="Noam peak.")
    parser.add_argument("--max_tokens", type=int, default=1024)
    parser.add_argument("--max_length", type=int, default=64)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--recipe", choices=["package", "reference"], default="package")
    parser.add_argument("--batch_size", type=int, default=64, help="Pairs per batch of the reference recipe.")
    parser.add_argument("--models", nargs="+", default=["vanilla", "marian"], choices=["vanilla", "marian"])
    parser.add_argument("--max_test_samples", type=int, default=None)
    parser.add_argument("--generation_max_length", type=int, default=None, help="Default: --max_length + 50 (§6.1).")
    args = parser.parse_args(argv)
    logging.set_verbosity_warning()
    output = Path(args.output_dir)
    data_dir = Path(args.data_dir)

    files = {f"{split}_file": str(data_dir / f"{name}.tsv") for split, name in
             (("train", "train"), ("validation", "valid"), ("test", "test"))}  # fmt: skip
    data = load_parallel_data(DataArguments(**files, max_predict_samples=args.max_test_samples))
    texts = (t for pair in zip(data["train"]["source"], data["train"]["target"], strict=True) for t in pair)
    tokenizer = train_bpe_tokenizer(texts, vocab_size=args.vocab_size)
    train, _ = tokenize_parallel(data["train"], tokenizer, args.max_length, args.max_length)
    config = VanillaTransformerConfig.from_preset(
        args.preset, vocab_size=len(tokenizer), **parse_config_overrides(args.config_overrides)
    )

    generation_max_length = args.generation_max_length or args.max_length + 50
    runs = []
    for kind in args.models:
        for seed in args.seeds:
            model = build(kind, config, seed)
            training_args, recipe = recipe_arguments(args, output / f"{kind}-seed{seed}", seed, config.d_model)
            set_generation_defaults(model, 4, recipe.length_penalty, max_length=generation_max_length)
            started = time.monotonic()
            trainer = build_trainer(model, tokenizer, training_args, recipe, train)
            train_loss = trainer.train().training_loss
            train_s = time.monotonic() - started
            scores, _ = evaluate_translations(
                model, tokenizer, data["test"]["source"], data["test"]["target"], batch_size=64, num_beams=4,
                length_penalty=recipe.length_penalty, max_length=generation_max_length, show_progress=False,
            )  # fmt: skip
            run = {"model": kind, "seed": seed, "bleu": round(scores["bleu"], 2), "chrf": round(scores["chrf"], 2),
                   "train_loss": round(train_loss, 4), "train_s": round(train_s, 1),
                   "parameters": sum(p.numel() for p in model.parameters())}  # fmt: skip
            print(json.dumps(run), flush=True)
            runs.append(run)

    mean = {kind: {m: round(statistics.mean(r[m] for r in runs if r["model"] == kind), 2) for m in ("bleu", "chrf")}
            for kind in args.models}  # fmt: skip
    keys = ["model", "seed", "bleu", "chrf", "train_loss", "train_s"]
    print(common.format_table(keys, [[r[key] for key in keys] for r in runs]))
    print(json.dumps(mean))
    results = {"test_pairs": len(data["test"]), "runs": runs, "mean": mean}
    return common.save_results(output / "quality.json", "quality.quality", argv, settings=vars(args), results=results,
                               machine=common.machine_info(torch.get_num_threads()))  # fmt: skip


if __name__ == "__main__":
    main()
