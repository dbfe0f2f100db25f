"""One command-line style for every `vt-*` command: `--snake_case` flags with `--kebab-case` aliases, `--version`,
`--debug`, an example in `--help`, and user errors as one line on stderr with exit status 2.

Standard library only: the torch-free runtime and the full package (`vanilla_transformer.cli`) both use it.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

# Exit status of a user error (argparse uses it for bad flags too); 130 is the shell's status for Ctrl-C.
USAGE_ERROR = 2
INTERRUPTED = 130
# Set to 1 to see the traceback of a user error where `--debug` is taken (vt-train: transformers' own `--debug`).
DEBUG_ENVIRONMENT_VARIABLE = "VT_DEBUG"
KEBAB_NOTE = "Every --snake_case flag also answers to its --kebab-case spelling (--num_beams or --num-beams)."


class UserError(ValueError):
    """A mistake in the command line or its inputs; the message says what is wrong and what to do.

    A `ValueError`, so Python callers of the commands catch it as they catch the library's own validation errors.
    """


def kebab_aliases(option_strings: Sequence[str]) -> list[str]:
    """`option_strings` plus the `--kebab-case` spelling of every `--snake_case` long option, each once."""
    names = list(option_strings)
    for name in option_strings:
        if name.startswith("--") and "_" in name:
            dashed = "--" + name[2:].replace("_", "-")
            if dashed not in names:
                names.append(dashed)
    return names


def is_kebab_alias(name: str, option_strings: Sequence[str]) -> bool:
    """Whether `name` is the `--kebab-case` twin of another of `option_strings`."""
    return name.startswith("--") and "-" in name[2:] and "--" + name[2:].replace("-", "_") in option_strings


def add_flag_alias(parser: argparse.ArgumentParser, flag: str, *aliases: str) -> None:
    """Make `aliases` spell the existing option `flag` too (e.g. `--output` for `--output_dir`)."""
    action = parser._option_string_actions.get(flag)
    if action is None:
        raise ValueError(f"{parser.prog} has no option {flag} to alias")
    for alias in aliases:
        if alias in parser._option_string_actions:
            raise ValueError(f"{parser.prog} already has an option {alias}")
        parser._option_string_actions[alias] = action
        action.option_strings.append(alias)


def positive_int(text: str) -> int:
    """argparse `type=` for counts that must be >= 1 (batch size, beams, threads, workers)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the docstring's layout, and lists each option once: the `--kebab-case` aliases stay out of `--help`."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        shown = [name for name in action.option_strings if not is_kebab_alias(name, action.option_strings)]
        if not shown or len(shown) == len(action.option_strings):
            return super()._format_action_invocation(action)
        original = action.option_strings
        action.option_strings = shown
        try:
            return super()._format_action_invocation(action)
        finally:
            action.option_strings = original


class OneLineErrors:
    """Mixin for argument parsers: a bad flag is one line on stderr (what is wrong, where to look) and exit 2."""

    prog: str

    def error(self, message: str) -> None:  # argparse's hook; never returns
        print(f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(USAGE_ERROR)


class CliParser(OneLineErrors, argparse.ArgumentParser):
    """`argparse.ArgumentParser` that also accepts `--kebab-case` for every `--snake_case` flag it defines."""

    def add_argument(self, *name_or_flags: str, **kwargs: Any) -> argparse.Action:
        return super().add_argument(*kebab_aliases(name_or_flags), **kwargs)


def add_common_flags(parser: argparse.ArgumentParser, version: str, debug: bool = True) -> None:
    """`--version` and, unless the parser already has its own `--debug`, `--debug` (shown in `--help`; `run_cli`
    reads it, the parser only accepts it)."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {version}")
    if debug:
        parser.add_argument(
            "--debug",
            action="store_true",
            default=argparse.SUPPRESS,
            help=f"show the full traceback of an error (also: {DEBUG_ENVIRONMENT_VARIABLE}=1)",
        )


def make_parser(prog: str, description: str, example: str, version: str) -> CliParser:
    """The parser of one `vt-*` command: `description` on top, `example` (shell lines) at the end of `--help`,
    `--version`, `--debug`, and `--kebab-case` aliases for the flags added later."""
    parser = CliParser(
        prog=prog,
        description=description,
        epilog=format_epilog(example),
        formatter_class=HelpFormatter,
    )
    add_common_flags(parser, version)
    return parser


def format_epilog(example: str) -> str:
    """The `--help` footer: the example lines, indented, then the note on flag spellings."""
    lines = textwrap.dedent(example).strip("\n").splitlines()
    return "example:\n" + "\n".join(f"  {line}" for line in lines) + "\n\n" + KEBAB_NOTE


def one_line(message: str) -> str:
    """`message` on a single line (line breaks and runs of spaces become one space)."""
    return " ".join(str(message).split())


def error_style(message: str) -> str:
    """`message` in the commands' one style, git's: one line, starting lower-case (a capitalised first word such as
    "Cannot" becomes "cannot"; a name such as "ONNX", a path or a flag stays as it is), no closing full stop. Python
    callers of the library get its messages unchanged; this only shapes the command-line line."""
    text = one_line(message)
    first = text.split(" ", 1)[0]
    if len(first) > 1 and first[0].isupper() and first[1:].isalpha() and first[1:].islower():
        text = text[0].lower() + text[1:]
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1]
    return text


def describe_error(error: BaseException) -> str:
    """One line for a user error, in `error_style`: the message, or for an OS error the file and its cause."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return error_style(f"{error.filename}: {error.strerror}; check the path")
    if isinstance(error, ImportError) and error.name and not str(error).count("pip install"):
        return error_style(f"{error}; install the missing package ({error.name}) with pip")
    return error_style(str(error) or type(error).__name__)


# Exceptions that are the user's to fix: bad values, and OSError (a missing, unreadable or unwritable file, a full
# disk, a model that cannot be fetched); anything else is a bug and keeps its traceback.
USER_ERRORS = (UserError, ValueError, OSError)


def is_user_error(error: BaseException) -> bool:
    """A `USER_ERRORS` instance, or an ImportError of a package outside this project (an optional dependency)."""
    if isinstance(error, USER_ERRORS):
        return True
    if isinstance(error, ImportError):
        return bool(error.name) and error.name.split(".")[0] not in ("vanilla_transformer", "vanilla_transformer_ort")
    return False


_debug_run = False  # whether the command `run_cli` is running was given --debug


def debug_requested() -> bool:
    """Whether the running command was given `--debug` (or `VT_DEBUG=1`): commands then also show what they
    otherwise keep quiet, such as the warnings of the libraries they call."""
    return _debug_run or os.environ.get(DEBUG_ENVIRONMENT_VARIABLE, "") not in ("", "0")


def run_cli(
    command: Callable[[list[str]], Any], argv: Sequence[str] | None = None, *, prog: str, debug_flag: bool = True
) -> int:
    """Run `command(argv)` as a console script and return its exit status.

    A user error (`is_user_error`) becomes one line on stderr, `prog: error: ...`, and status 2; with `--debug`
    (removed from argv before `command` sees it, unless `debug_flag` is False because the command has a `--debug`
    of its own) or `VT_DEBUG=1` it propagates with its traceback. Other exceptions are bugs and always propagate.
    The status is `command`'s int result, else 0.

    Args:
        command: parses `argv` and runs; raises on errors.
        argv: arguments without the program name (default: `sys.argv[1:]`).
        prog: the command's name for error messages.
        debug_flag: whether `--debug` is this helper's flag (False for vt-train, where it is transformers').
    """
    global _debug_run
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get(DEBUG_ENVIRONMENT_VARIABLE, "") not in ("", "0")
    if debug_flag and "--debug" in argv:
        debug = True
        argv = [arg for arg in argv if arg != "--debug"]
    _debug_run = debug
    try:
        result = command(argv)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{prog}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception as error:
        if debug or not is_user_error(error):
            raise
        print(f"{prog}: error: {describe_error(error)}", file=sys.stderr)
        return USAGE_ERROR
    finally:
        _debug_run = False
    return result if isinstance(result, int) and not isinstance(result, bool) else 0
