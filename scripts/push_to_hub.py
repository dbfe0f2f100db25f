"""Upload a trained model folder to the Hugging Face Hub with a filled-in model card.

    python scripts/push_to_hub.py --model runs/demo --repo_id user/en-de-transformer [--onnx runs/demo-onnx]
    python scripts/push_to_hub.py --model runs/demo --repo_id user/en-de-transformer --dry_run hub-folder

The token comes from HF_TOKEN or the login cache (`hf auth login`) and is never printed.
"""

import argparse
import sys
from pathlib import Path

from vanilla_transformer.hub import prepare_hub_folder, push_to_hub

TEMPLATE = Path(__file__).resolve().parents[1] / "model_card.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="Saved model folder (model, tokenizer, metrics).")
    parser.add_argument("--repo_id", required=True, help="Hub repository, 'user-or-org/name'.")
    parser.add_argument("--private", action="store_true", help="Create the repository as private.")
    parser.add_argument("--onnx", help="An ONNX export folder (export/export_onnx.py) to upload under onnx/.")
    parser.add_argument("--revision", help="Branch to upload to (created if missing).")
    parser.add_argument("--commit_message", help="Commit message.")
    parser.add_argument(
        "--dry_run", metavar="OUT", help="Write the folder that would be uploaded to OUT; send nothing."
    )
    parser.add_argument("--template", default=str(TEMPLATE), help="Model card template (default: model_card.md).")
    parser.add_argument("--source_lang", help="Source language code for the card (default: from training_info.json).")
    parser.add_argument("--target_lang", help="Target language code for the card (default: from training_info.json).")
    parser.add_argument("--dataset", help="Training dataset name for the card (default: from training_info.json).")
    parser.add_argument("--license", default="apache-2.0", help="License identifier for the card.")
    args = parser.parse_args(argv)
    card = dict(source_lang=args.source_lang, target_lang=args.target_lang, dataset=args.dataset, license=args.license)
    try:
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
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
