"""The Hub command, `vt-push-to-hub`: `push_to_hub_command(argv)` returns its exit status (for Python callers and
tests) and `push_to_hub_main` is its console script (`vanilla_transformer_ort.cli_common.run_cli`)."""

from __future__ import annotations

import sys

from vanilla_transformer_ort.cli_common import add_flag_alias, one_line, run_cli

from ..cli_parsers import _parser, check_model_folder
from ..progress import without_weight_progress_bars
from . import HUB_FORMATS, MODEL_CARD_TEMPLATES, prepare_hub_folder, push_to_hub


def push_to_hub_command(argv: list[str] | None = None) -> int:
    """Upload a trained model folder to the Hugging Face Hub with a filled-in model card.

    The token comes from HF_TOKEN or the login cache (`hf auth login`) and is never printed.

    Example:
        vt-push-to-hub --model runs/demo --repo_id user/en-de-transformer [--onnx runs/demo-onnx]
        vt-push-to-hub --model runs/demo --repo_id user/en-de-transformer --dry_run hub-folder
        vt-push-to-hub --model runs/demo --repo_id user/en-de-marian --format marian  # native MarianMT, no remote code
    """
    parser = _parser(push_to_hub_command, "vt-push-to-hub")
    parser.add_argument("--model", required=True, help="Saved model folder (model, tokenizer, metrics).")
    parser.add_argument("--repo_id", required=True, help="Hub repository, 'user-or-org/name'.")
    parser.add_argument("--private", action="store_true", help="Create the repository as private.")
    parser.add_argument("--onnx", help="An ONNX export folder (vt-export-onnx) to upload under onnx/.")
    add_flag_alias(parser, "--onnx", "--onnx_folder")
    parser.add_argument(
        "--format", default=HUB_FORMATS[0], choices=HUB_FORMATS,
        help="vanilla_transformer: the model with its source (trust_remote_code); marian: the native MarianMT export "
        "(vt-export-marian), loaded by transformers without remote code.",
    )  # fmt: skip
    parser.add_argument("--revision", help="Branch to upload to (created if missing).")
    parser.add_argument("--commit_message", help="Commit message.")
    parser.add_argument(
        "--dry_run", metavar="OUT", help="Write the folder that would be uploaded to OUT; send nothing."
    )
    parser.add_argument(
        "--template",
        help="Model card template (default: the package's model_card.md; model_card_marian.md with --format marian).",
    )
    parser.add_argument("--source_lang", help="Source language code for the card (default: from training_info.json).")
    parser.add_argument("--target_lang", help="Target language code for the card (default: from training_info.json).")
    parser.add_argument("--dataset", help="Training dataset name for the card (default: from training_info.json).")
    parser.add_argument("--license", default="apache-2.0", help="License identifier for the card.")
    args = parser.parse_args(argv)

    card = dict(source_lang=args.source_lang, target_lang=args.target_lang, dataset=args.dataset, license=args.license)
    card["hub_format"] = args.format
    if args.template is None:
        args.template = str(MODEL_CARD_TEMPLATES[args.format])
    try:
        check_model_folder(args.model)
        if args.dry_run:
            files = prepare_hub_folder(args.model, args.dry_run, args.repo_id, args.template, args.onnx, **card)
            print(f"Dry run: wrote {len(files)} files to {args.dry_run} (nothing sent):")
            print("\n".join(f"  {name}" for name in files))
        else:
            url = push_to_hub(
                args.model, args.repo_id, args.template, args.onnx, private=args.private, revision=args.revision,
                commit_message=args.commit_message, **card,
            )  # fmt: skip
            print(f"Uploaded: {url}")
    except (ValueError, FileNotFoundError, FileExistsError) as error:
        print(f"vt-push-to-hub: error: {one_line(error)}", file=sys.stderr)
        return 2
    return 0


def push_to_hub_main(argv: list[str] | None = None) -> int:
    """The `vt-push-to-hub` console script: `push_to_hub_command`; returns the exit status."""
    return run_cli(without_weight_progress_bars(push_to_hub_command), argv, prog="vt-push-to-hub")
