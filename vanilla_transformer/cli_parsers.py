"""Argument parsers of the `vt-*` training commands (`cli.py`), built from each command's docstring in one style:
`--snake_case` flags with `--kebab-case` aliases, `--version`, `--debug`, one-line errors, the example at the end of
`--help`; and the check that a `--model` folder holds a saved model."""

from __future__ import annotations

import argparse
import inspect
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

from . import __version__

CONFIG_FILE = "config.json"
ONNX_ENCODER_FILE = "encoder_model.onnx"  # marks an ONNX export folder (vanilla_transformer_ort.contract)


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


def check_model_folder(path: str, flag: str = "--model", must_exist: bool = False) -> None:
    """A user error when `path` is an existing folder that holds no saved model (an ONNX export, an empty folder);
    a missing path is one too with `must_exist`, else it is left to the loader (a Hub id, a FileNotFoundError)."""
    folder = Path(path)
    if not folder.is_dir():
        if must_exist:
            raise UserError(f"{flag} {path}: no such folder; pass the --output_dir of vt-train")
        return
    if (folder / ONNX_ENCODER_FILE).is_file():
        raise UserError(
            f"{flag} {path} is an ONNX export folder, not a model folder; pass the model folder it was exported from "
            "(vt-translate-onnx translates with an export)"
        )
    if not (folder / CONFIG_FILE).is_file():
        raise UserError(f"{flag} {path} is not a model folder (no {CONFIG_FILE}); pass the --output_dir of vt-train")
