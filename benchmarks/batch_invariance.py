"""Does a translation depend on its batch? Each source translated alone against the same source in shuffled batches.

    python -m benchmarks.batch_invariance --model outputs/main_job/onnx --sentences 400     # the job's fp32 export
    vt-export-onnx --model outputs/main_job/model --output outputs/main_job/onnx-int8 --quantize int8
    python -m benchmarks.batch_invariance --model outputs/main_job/onnx-int8 --batch_size 32
    python -m benchmarks.batch_invariance --model outputs/main_job/onnx-int8 --no_pruning   # the A/B of pruning
    PYTHONPATH=OLD/runtime python -m benchmarks.batch_invariance --model FOLDER     # another runtime's timings

The sources are the English side of the held-out gettext test split (`--texts`); batches are drawn from a fixed
shuffle, as a serving batch mixes unrelated requests. Prints how many of the translations differ, with examples, and
the two timings; `--no_pruning` keeps finished sentences in the decoder's batch (the search before pruning), for
the A/B of that change. fp32 graphs compute each row from that row alone, and so do int8 graphs exported with one
activation scale per row (the default); with `--int8_activations tensor` one scale is taken over the whole batch.
Not a timed test.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from vanilla_transformer_ort import OrtTranslator

DEFAULT_TEXTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "gettext-en-de" / "test.tsv"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="export folder")
    parser.add_argument("--texts", type=Path, default=DEFAULT_TEXTS, help="TSV with a header; column 1 is used")
    parser.add_argument("--sentences", type=int, default=400)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--num_beams", type=int, default=4)
    parser.add_argument("--max_new_tokens", type=int, default=None, help="longest output (default: the folder's)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no_pruning", action="store_true", help="decode finished sentences to the batch's end")
    parser.add_argument("--decoder_cache", choices=["auto", "inplace", "copy"], default="auto")
    args = parser.parse_args(argv)
    if args.no_pruning:
        from vanilla_transformer_ort.decoder_state import InPlaceState, NumpyState

        NumpyState.keep_rows = InPlaceState.keep_rows = None  # the searches then decode every row to the batch's end
    lines = args.texts.read_text(encoding="utf-8").splitlines()[1:]
    texts = [line.split("\t")[0] for line in lines if line.strip()][: args.sentences]
    translator = OrtTranslator(
        args.model, provider="cpu", intra_op_num_threads=args.threads, decoder_cache=args.decoder_cache
    )

    options = {"num_beams": args.num_beams, "max_new_tokens": args.max_new_tokens}
    started = time.perf_counter()
    alone = [translator.translate([text], **options)[0] for text in texts]
    alone_s = time.perf_counter() - started
    order = list(range(len(texts)))
    random.Random(0).shuffle(order)
    batched: list[str] = [""] * len(texts)
    started = time.perf_counter()
    for start in range(0, len(order), args.batch_size):
        indices = order[start : start + args.batch_size]
        outputs = translator.translate([texts[i] for i in indices], **options)
        for index, output in zip(indices, outputs, strict=True):
            batched[index] = output
    batched_s = time.perf_counter() - started
    differ = [i for i in range(len(texts)) if alone[i] != batched[i]]
    print(
        f"{args.model}: {len(differ)} of {len(texts)} translations differ between alone and shuffled batches of "
        f"{args.batch_size} (beam {args.num_beams}, pruning {'off' if args.no_pruning else 'on'}); "
        f"alone {alone_s:.1f} s, batched {batched_s:.1f} s"
    )
    for index in differ[:5]:
        print(f"  {texts[index]!r}\n    alone:   {alone[index]!r}\n    batched: {batched[index]!r}")


if __name__ == "__main__":
    main()
