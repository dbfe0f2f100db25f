"""Argument parsers of the `vt-*` training commands (`cli.py`), built from each command's docstring in one style:
`--snake_case` flags with `--kebab-case` aliases, `--version`, `--debug`, one-line errors, the example at the end of
`--help`; and the check that a `--model` folder holds a saved model."""

from __future__ import annotations

import argparse
import inspect
import json
import textwrap
from collections.abc import Callable
from pathlib import Path

from vanilla_transformer_ort.cli_common import (
    HelpFormatter,
    OneLineErrors,
    UserError,
    add_common_flags,
    format_epilog,
    make_parser,
)
from vanilla_transformer_ort.contract import CONFIG_FILE, ENCODER_FILE, GENERATION_CONFIG_FILE, SAVED_TOKENIZER_FILES

from . import __version__

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")  # what save_pretrained writes, unsharded or not


def _split_doc(command: Callable) -> tuple[str, str]:
    """`command`'s docstring as (description, example): the example is the text under its `Example:` line, which
    `--help` shows at the end."""
    description, _, example = inspect.cleandoc(command.__doc__).partition("\n\nExample:\n")
    return description, textwrap.dedent(example).strip("\n")


def _parser(command: Callable, prog: str) -> argparse.ArgumentParser:
    """An argument parser for `prog` from `command`'s docstring, with `--version`, `--debug`, one-line errors and
    `--kebab-case` aliases of the `--snake_case` flags."""
    return make_parser(prog, *_split_doc(command), __version__)


def _hf_parser(dataclass_types: tuple | type, command: Callable, prog: str, debug: bool = True):
    """A transformers `HfArgumentParser` (which already takes `--kebab-case` aliases) in the same style."""
    from transformers import HfArgumentParser

    description, example = _split_doc(command)
    parser_class = type("HfCliParser", (OneLineErrors, HfArgumentParser), {})
    parser = parser_class(
        dataclass_types, prog=prog, description=description, epilog=format_epilog(example),
        formatter_class=type("HfHelpFormatter", (HelpFormatter, argparse.ArgumentDefaultsHelpFormatter), {}),
    )  # fmt: skip
    add_common_flags(parser, __version__, debug=debug)
    return parser


class ModelFolderError(UserError, FileNotFoundError):
    """A `--model` path that is not a saved model folder: a user error (one line) and a `FileNotFoundError`."""


def check_model_folder(
    path: str | Path, flag: str = "--model", must_exist: bool = False, complete: bool = False
) -> Path:
    """The one check of a saved model folder (config, weights, tokenizer), before anything is loaded.

    A folder that exists must hold a saved model: not an ONNX export, not an empty folder. A missing path is an error
    with `must_exist` (else it is left to the loader: a Hub id); `complete` also asks for everything a shared folder
    needs (generation config, weights, the tokenizer files, this package's model type), as the Hub upload does.
    Raises `ModelFolderError` naming what is missing and what to pass instead.
    """
    folder = Path(path)
    if not folder.is_dir():
        if must_exist or complete:
            raise ModelFolderError(f"{flag} {path}: no such folder; pass the --output_dir of vt-train")
        return folder
    if (folder / ENCODER_FILE).is_file():  # an ONNX export folder
        raise ModelFolderError(
            f"{flag} {path} is an ONNX export folder, not a model folder; pass the model folder it was exported from "
            "(vt-translate-onnx translates with an export)"
        )
    if not (folder / CONFIG_FILE).is_file():
        raise ModelFolderError(
            f"{flag} {path} is not a model folder (no {CONFIG_FILE}); pass the --output_dir of vt-train"
        )
    if complete:
        missing = [name for name in (GENERATION_CONFIG_FILE,) if not (folder / name).is_file()]
        if not any((folder / name).is_file() for name in WEIGHT_FILES):
            missing.append(WEIGHT_FILES[0])
        missing += [name for name in SAVED_TOKENIZER_FILES if not (folder / name).is_file()]
        if missing:
            raise ModelFolderError(
                f"{flag} {path} lacks {', '.join(missing)}; save the model and its tokenizer with save_pretrained "
                "(vt-train does both)"
            )
        from .model.configuration_vanilla_transformer import VanillaTransformerConfig

        model_type = json.loads((folder / CONFIG_FILE).read_text()).get("model_type")
        if model_type != VanillaTransformerConfig.model_type:
            raise ModelFolderError(
                f"{flag} {path} holds a {model_type!r} model, not a {VanillaTransformerConfig.model_type} one"
            )
    return folder
