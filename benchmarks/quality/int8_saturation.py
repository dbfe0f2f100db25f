"""int8 exports run natively and with exact integer products (`tests/js_helpers.py::exact_int8_copy`): BLEU, chrF,
seconds, and how many translations differ. On a CPU without VNNI, onnxruntime's u8 x s8 product saturates.

    python -m benchmarks.quality.int8_saturation WORK TEST_TSV fp32 int8-row int8-tensor
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import sacrebleu

from benchmarks.common import read_tsv
from tests.js_helpers import exact_int8_copy, native_int8_is_exact
from vanilla_transformer_ort import OrtTranslator


def main(work: Path, tsv: Path, names: list[str]) -> None:
    sources, references = read_tsv(tsv)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    print("native u8 x s8 product exact on this CPU:", native_int8_is_exact())
    outputs = {}
    for name in names:
        exact = work / f"{name}-exact"
        if not exact.exists():
            exact_int8_copy(work / name, exact)
        for label, path in ((name, work / name), (f"{name} exact", exact)):
            translator = OrtTranslator(path, provider="cpu", intra_op_num_threads=2)
            texts: list[str] = [""] * len(sources)
            start = time.perf_counter()
            for i in range(0, len(order), 32):
                chunk = order[i : i + 32]
                for j, text in zip(chunk, translator.translate([sources[j] for j in chunk]), strict=True):
                    texts[j] = text.strip()
            seconds = time.perf_counter() - start
            outputs[label] = texts
            bleu = sacrebleu.corpus_bleu(texts, [references]).score
            chrf = sacrebleu.corpus_chrf(texts, [references]).score
            print(f"{label:22s} BLEU {bleu:6.2f} chrF {chrf:6.2f} {seconds:6.1f} s", flush=True)
    for a in outputs:
        for b in outputs:
            if a < b:
                differ = sum(x != y for x, y in zip(outputs[a], outputs[b], strict=True))
                print(f"{a} vs {b}: {differ} of {len(sources)} translations differ")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
