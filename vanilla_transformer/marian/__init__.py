"""MarianMT, both ways: the exact import of MarianMT / OPUS-MT checkpoints and the exact native export.

Reading order: `permutation` (the one layout difference, §3.5's sinusoids as [sin | cos] halves) → `importer`
(`from_marian`, `save_converted`: `vt-convert-marian`) → `exporter` (`to_marian`, `save_marian`: `vt-export-marian`)
with the exported folder's `tokenizer` → `cli` (both commands).
"""

from .exporter import save_marian, to_marian, verify_export
from .importer import ConversionReport, convert_marian, from_marian, save_converted, verify_conversion
from .permutation import interleave_permutation

__all__ = [
    "ConversionReport",
    "convert_marian",
    "from_marian",
    "interleave_permutation",
    "save_converted",
    "save_marian",
    "to_marian",
    "verify_conversion",
    "verify_export",
]
