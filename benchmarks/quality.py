"""Quality bar: this package's Transformer against transformers' MarianMTModel with the same dimensions, tokenizer,
data, recipe and number of steps; sacreBLEU/chrF on the test split with beam 4 (length penalty 0.6), for each seed.

Two recipes: `package` (this package's: the paper's Adam and noam schedule with --warmup_steps/--learning_rate,
label smoothing 0.1, token-budget batches of --max_tokens) and `reference` (a plain transformers recipe: Adam β2 0.98,
ε 1e-9, peak 1e-3 on the inverse-square-root schedule after 500 warmup steps, label smoothing 0.1, gradient clipping
1.0, batches of 64 pairs grouped by length).

    python -m benchmarks.quality --preset small --steps 2000 --recipe reference --seeds 0 1
    python -m benchmarks.quality --preset small --steps 2000 --recipe package --warmup_steps 500 --learning_rate 2e-3

This is a benchmark, not a test: it takes minutes to hours depending on --steps and --preset.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import MarianConfig, MarianMTModel, Seq2SeqTrainingArguments
from transformers.utils import logging

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.inference import evaluate_translations
from vanilla_transformer.training.data import DataArguments, load_parallel_data, tokenize_parallel
from vanilla_transformer.training.experiment import build_trainer, parse_config_overrides, set_generation_defaults
from vanilla_transformer.training.recipe import RecipeArguments, apply_paper_recipe
from vanilla_transformer.training.tokenization import train_bpe_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def build(kind: str, config: VanillaTransformerConfig, seed: int):
    """Our model, or a MarianMTModel with the same dimensions, ids, dropout, post-LN, scaled and shared embeddings."""
    torch.manual_seed(seed)
    if kind == "vanilla":
        return VanillaTransformerForConditionalGeneration(config)
    marian = MarianConfig(
        vocab_size=config.vocab_size, decoder_vocab_size=config.vocab_size, d_model=config.d_model,
        encoder_layers=config.encoder_layers, decoder_layers=config.decoder_layers,
        encoder_attention_heads=config.encoder_attention_heads, decoder_attention_heads=config.decoder_attention_heads,
        encoder_ffn_dim=config.encoder_ffn_dim, decoder_ffn_dim=config.decoder_ffn_dim, dropout=config.dropout,
        attention_dropout=config.attention_dropout, activation_dropout=config.activation_dropout,
        activation_function="relu", max_position_embeddings=config.max_position_embeddings, scale_embedding=True,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True, pad_token_id=config.pad_token_id,
        eos_token_id=config.eos_token_id, decoder_start_token_id=config.decoder_start_token_id,
        forced_eos_token_id=config.eos_token_id,
    )  # fmt: skip
    return MarianMTModel(marian)


def recipe_arguments(args, output_dir: Path, seed: int, d_model: int):
    """Trainer arguments and recipe of `--recipe` (see the module docstring)."""
    common = dict(
        output_dir=str(output_dir), max_steps=args.steps, seed=seed, logging_steps=50, save_strategy="no",
        report_to="none", use_cpu=not torch.cuda.is_available(), disable_tqdm=False,
    )  # fmt: skip
    if args.recipe == "reference":
        training_args = Seq2SeqTrainingArguments(
            **common, learning_rate=1e-3, lr_scheduler_type="inverse_sqrt", warmup_steps=500, adam_beta2=0.98,
            adam_epsilon=1e-9, weight_decay=0.0, label_smoothing_factor=0.1, max_grad_norm=1.0,
            per_device_train_batch_size=args.batch_size, train_sampling_strategy="group_by_length",
        )  # fmt: skip
        return training_args, RecipeArguments(
            paper_recipe=False, lr_schedule="trainer", max_tokens=None, length_penalty=0.6
        )
    training_args = Seq2SeqTrainingArguments(
        **common, warmup_steps=args.warmup_steps, learning_rate=args.learning_rate
    )
    recipe = RecipeArguments(max_tokens=args.max_tokens)
    apply_paper_recipe(training_args, recipe, d_model, explicit={"warmup_steps", "learning_rate"})
    return training_args, recipe


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", default=str(ROOT.parent / "shared" / "data" / "gettext-en-de"))
    parser.add_argument("--output_dir", default=str(ROOT / "outputs" / "quality"))
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

    data = load_parallel_data(
        DataArguments(
            train_file=str(data_dir / "train.tsv"),
            validation_file=str(data_dir / "valid.tsv"),
            test_file=str(data_dir / "test.tsv"),
            max_predict_samples=args.max_test_samples,
        )  # fmt: skip
    )
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

    summary = {"settings": vars(args), "test_pairs": len(data["test"]), "runs": runs, "mean": {}}
    for kind in args.models:
        mine = [r for r in runs if r["model"] == kind]
        summary["mean"][kind] = {m: round(statistics.mean(r[m] for r in mine), 2) for m in ("bleu", "chrf")}
    output.mkdir(parents=True, exist_ok=True)
    (output / "quality.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\n| model | seed | BLEU | chrF | train loss | train s |\n|---|---|---|---|---|---|")
    for r in runs:
        print(f"| {r['model']} | {r['seed']} | {r['bleu']} | {r['chrf']} | {r['train_loss']} | {r['train_s']} |")
    print(json.dumps(summary["mean"]))
    return summary


if __name__ == "__main__":
    main()
