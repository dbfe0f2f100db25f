"""Torch-free inference for exported vanilla-transformer models: onnxruntime, numpy and tokenizers only.

A separate top-level package on purpose: `import vanilla_transformer` imports torch, this one never does.
"""

from .folder import ExportFolder, settings_from_folder
from .search import GenerationSettings, beam_search, greedy_search
from .sessions import resolve_provider
from .translator import OrtTranslator

__version__ = "0.1.0"  # the distributions' version (pyproject.toml); tests/test_cli_style.py checks they agree

__all__ = [
    "ExportFolder",
    "GenerationSettings",
    "OrtTranslator",
    "beam_search",
    "greedy_search",
    "resolve_provider",
    "settings_from_folder",
]
