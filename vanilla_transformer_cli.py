"""The console scripts of the `vanilla-transformer` distribution, as thin launchers.

`vt-train --version` (every command's `--version`) answers at once, without importing torch and transformers, which
`import vanilla_transformer` does and which takes seconds; every other call is handed to the command itself in
`vanilla_transformer.cli` or `vanilla_transformer.export.cli`. The runtime's commands (`vt-translate-onnx`,
`vt-translate-po`, `vt-serve`, `vt-translate-ray`) never import torch and need no launcher.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

from vanilla_transformer_ort import __version__


def launcher(prog: str, target: str) -> Callable[[list[str] | None], int]:
    """The console-script function of `prog`: `--version` answered here, anything else passed to `target`
    (`module:function`, a `*_main(argv)` of the package)."""
    module_name, _, function_name = target.partition(":")

    def main(argv: list[str] | None = None) -> int:
        args = list(sys.argv[1:] if argv is None else argv)
        if "--version" in args:
            print(f"{prog} {__version__}")
            return 0
        return getattr(importlib.import_module(module_name), function_name)(args)

    main.__name__ = main.__qualname__ = function_name
    main.__doc__ = f"`{prog}`: `{target}`, with `--version` answered without importing torch."
    return main


train_main = launcher("vt-train", "vanilla_transformer.cli:train_main")
train_tokenizer_main = launcher("vt-train-tokenizer", "vanilla_transformer.cli:train_tokenizer_main")
prepare_data_main = launcher("vt-prepare-data", "vanilla_transformer.cli:prepare_data_main")
evaluate_main = launcher("vt-evaluate", "vanilla_transformer.cli:evaluate_main")
translate_main = launcher("vt-translate", "vanilla_transformer.cli:translate_main")
average_checkpoints_main = launcher("vt-average-checkpoints", "vanilla_transformer.cli:average_checkpoints_main")
main_job_main = launcher("vt-main-job", "vanilla_transformer.cli:main_job_main")
convert_marian_main = launcher("vt-convert-marian", "vanilla_transformer.marian.cli:convert_marian_main")
export_marian_main = launcher("vt-export-marian", "vanilla_transformer.marian.cli:export_marian_main")
push_to_hub_main = launcher("vt-push-to-hub", "vanilla_transformer.hub.cli:push_to_hub_main")
export_onnx_main = launcher("vt-export-onnx", "vanilla_transformer.export.cli:export_onnx_main")
export_ctranslate2_main = launcher("vt-export-ctranslate2", "vanilla_transformer.export.cli:export_ctranslate2_main")
