"""Training data at the paper's scale: time to the first step and peak anonymous memory of `vt-train` and of the plain
recipe, and tokenization pairs/s per core, on synthetic corpora of WMT14's sizes (what each figure means and the
recorded runs: docs/benchmarks.md#training-data-at-the-papers-scale)."""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.common import DEFAULT_WORKDIR, ROOT, format_table, machine_info, process_tree, save_results

SHARED = ROOT.parent / "shared" / "data" / "gettext-en-de"
FIRST_STEP = re.compile(r"'loss': ")


def synthetic_corpus(path: Path, pairs: int, seed: int = 0) -> Path:
    """`pairs` lines of three random gettext pairs joined (a TSV with an `en<TAB>de` header); kept once built."""
    if path.is_file():
        return path
    with (SHARED / "train.tsv").open(encoding="utf-8") as handle:
        source = [line.rstrip("\n").split("\t") for line in list(handle)[1:]]
    rng = random.Random(seed)
    partial = path.with_suffix(".partial")
    with partial.open("w", encoding="utf-8") as out:
        out.write("en\tde\n")
        for _ in range(pairs):
            a, b, c = rng.choice(source), rng.choice(source), rng.choice(source)
            out.write(f"{a[0]} {b[0]} {c[0]}\t{a[1]} {b[1]} {c[1]}\n")
    partial.rename(path)
    return path


def tokenizer_folder(workdir: Path) -> Path:
    """An 8,000-token BPE tokenizer trained on the gettext pairs (kept once built)."""
    folder = workdir / "tokenizer"
    if not (folder / "tokenizer.json").is_file():
        from vanilla_transformer.cli import train_tokenizer_command

        train_tokenizer_command(
            ["--train_file", str(SHARED / "train.tsv"), "--vocab_size", "8000", "--output", str(folder)]
        )
    return folder


def pss_anon_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss_Anon:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def measure(command: list[str], env: dict[str, str], log: Path) -> dict[str, float]:
    """Run `command`; wall time to its first logged loss and to its end, peak anonymous memory of its tree (sum) and
    of its largest process."""
    started = time.monotonic()
    first_step: list[float] = []
    peaks = {"total": 0, "process": 0}
    with log.open("w") as out:
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

        def sample() -> None:
            while process.poll() is None:
                cost = time.thread_time()
                sizes = [pss_anon_kib(pid) for pid in process_tree(process.pid)]
                peaks["total"] = max(peaks["total"], sum(sizes))
                peaks["process"] = max(peaks["process"], max(sizes, default=0))
                # Reading smaps_rollup walks every mapped page: with gigabytes of Arrow mapped, a sample can take a
                # good part of a second, so the sampler waits 19 times its cost (at most 5 % of a core).
                time.sleep(max(0.2, 19 * (time.thread_time() - cost)))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        for line in process.stdout:
            out.write(line)
            if not first_step and FIRST_STEP.search(line):
                first_step.append(time.monotonic() - started)
        process.wait()
        sampler.join()
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({process.returncode}); see {log}")
    return {
        "first_step_s": round(first_step[0], 1) if first_step else None,
        "wall_s": round(time.monotonic() - started, 1),
        "peak_anon_gib": round(peaks["total"] / 2**20, 2),
        "peak_anon_per_process_gib": round(peaks["process"] / 2**20, 2),
    }


def environment() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "true"}


def train_arguments(corpus: Path, workdir: Path, tokenizer: Path, prepared: Path, steps: int) -> list[str]:
    return [
        "--train_file", str(corpus), "--validation_file", str(SHARED / "valid.tsv"),
        "--tokenizer_name", str(tokenizer), "--prepared_data", str(prepared), "--preset", "small",
        "--do_train", "--max_steps", str(steps), "--max_tokens", "4096", "--preprocessing_num_workers", "2",
        "--output_dir", str(workdir / "run"), "--save_strategy", "no",
        "--report_to", "none", "--use_cpu", "--logging_steps", "1", "--disable_tqdm", "true",
    ]  # fmt: skip


def ours(
    corpus: Path, workdir: Path, tokenizer: Path, ranks: int, steps: int, reuse: Path | None = None
) -> dict[str, dict]:
    """A first run into a fresh folder and a cached run; with `reuse` (a folder an earlier run prepared) only the
    cached run."""
    prepared = reuse or workdir / f"prepared-{corpus.stem}-{ranks}"
    if reuse is None:
        shutil.rmtree(prepared, ignore_errors=True)
    arguments = train_arguments(corpus, workdir, tokenizer, prepared, steps)
    if ranks == 1:
        command = [sys.executable, str(ROOT / "scripts" / "train.py"), *arguments]
    else:
        accelerate = str(Path(sys.executable).with_name("accelerate"))
        config = str(ROOT / "configs" / "accelerate" / "cpu_2proc.yaml")
        command = [accelerate, "launch", "--config_file", config, "--num_processes", str(ranks),
                   str(ROOT / "scripts" / "train.py"), *arguments]  # fmt: skip
    env = environment()
    if ranks > 1:
        env["OMP_NUM_THREADS"] = "1"
    runs = {} if reuse else {"first": measure(command, env, workdir / f"ours-{corpus.stem}-{ranks}-first.log")}
    runs["cached"] = measure(command, env, workdir / f"ours-{corpus.stem}-{ranks}-cached.log")
    return runs


PLAIN_RECIPE = """
import sys
from datasets import load_dataset
from transformers import (AutoTokenizer, DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments)
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

corpus, tokenizer_dir, output_dir, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
raw = load_dataset("csv", data_files={"train": corpus}, delimiter="\\t", quoting=3, keep_default_na=False)

def preprocess(batch):
    return tokenizer(batch["en"], text_target=batch["de"], max_length=128, truncation=True)

train = raw["train"].map(preprocess, batched=True, num_proc=2, remove_columns=["en", "de"])
config = VanillaTransformerConfig.from_preset("small", vocab_size=len(tokenizer), pad_token_id=0, bos_token_id=1,
                                              eos_token_id=2, decoder_start_token_id=1)
model = VanillaTransformerForConditionalGeneration(config)
args = Seq2SeqTrainingArguments(output_dir=output_dir, max_steps=steps, per_device_train_batch_size=64,
                                train_sampling_strategy="group_by_length", logging_steps=1, save_strategy="no",
                                report_to="none", use_cpu=True, disable_tqdm=True)
trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=train,
                         data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100))
trainer.train()
"""


def plain(corpus: Path, workdir: Path, tokenizer: Path, steps: int) -> dict[str, dict]:
    """The recipe of transformers' translation example; its cache of the map step is datasets' own (a second run in
    the same cache reuses it), so both runs are measured too."""
    cache = workdir / f"hf-cache-{corpus.stem}"
    shutil.rmtree(cache, ignore_errors=True)
    env = {**environment(), "HF_DATASETS_CACHE": str(cache)}
    command = [sys.executable, "-c", PLAIN_RECIPE, str(corpus), str(tokenizer), str(workdir / "plain-run"), str(steps)]
    return {run: measure(command, env, workdir / f"plain-{corpus.stem}-{run}.log") for run in ("first", "cached")}


def throughput(corpus: Path, workdir: Path, tokenizer: Path, steps: int, prepared: Path | None = None) -> float:
    """Training tokens/s (source + target, non-padding) of `steps` steps of the `small` preset at 4,096 tokens a batch
    on one process, the corpus prepared beforehand (the time counted is the Trainer's own, from its first step)."""
    import json

    prepared = prepared or workdir / f"prepared-throughput-{corpus.stem}"
    output = workdir / f"throughput-{corpus.stem}"
    arguments = train_arguments(corpus, workdir, tokenizer, prepared, steps)
    arguments[arguments.index("--output_dir") + 1] = str(output)
    arguments[arguments.index("--logging_steps") + 1] = "50"
    measure([sys.executable, str(ROOT / "scripts" / "train.py"), *arguments], environment(),
            workdir / f"throughput-{corpus.stem}.log")  # fmt: skip
    return json.loads((output / "all_results.json").read_text())["train_tokens_per_second"]


def tokenization_rate(corpus: Path, tokenizer: Path, pairs: int = 200_000) -> float:
    """Pairs/s of the preparation's encoder on one core (one Rust thread, one process)."""
    code = (
        "import itertools, time, sys\n"
        "from transformers import AutoTokenizer\n"
        "from vanilla_transformer.training.pair_reader import iter_parallel_file\n"
        "from vanilla_transformer.training.pair_encoding import PairEncoder\n"
        f"pairs = list(itertools.islice(iter_parallel_file({str(corpus)!r}, 'en', 'de'), {pairs}))\n"
        f"encoder = PairEncoder(AutoTokenizer.from_pretrained({str(tokenizer)!r}))\n"
        "started = time.perf_counter()\n"
        "for i in range(0, len(pairs), 2000):\n"
        "    chunk = pairs[i:i + 2000]\n"
        "    encoder({'source': [s for s, _ in chunk], 'target': [t for _, t in chunk]})\n"
        "print(len(pairs) / (time.perf_counter() - started))\n"
    )
    env = {**environment(), "RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    output = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return round(float(output.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, nargs="+", default=[40_000, 4_500_000])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--recipes", nargs="+", default=["ours", "plain"], choices=["ours", "plain"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prepare_once", action="store_true", help="later --ranks reuse the first's folder")
    parser.add_argument("--throughput_steps", type=int, default=0, help="also tokens/s over this many training steps")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR / "data_scale")
    parser.add_argument("--name", default="data_scale", help="results file of the machine's runs: NAME or a path")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizer_folder(args.workdir)
    results, rows = {}, []
    for pairs in args.pairs:
        corpus = synthetic_corpus(args.workdir / f"corpus-{pairs}.tsv", pairs)
        entry = {"tsv_gb": round(corpus.stat().st_size / 1e9, 2)}
        entry["tokenize_pairs_per_s_per_core"] = tokenization_rate(corpus, tokenizer)
        if "ours" in args.recipes:
            for ranks in args.ranks:
                reuse = args.workdir / f"prepared-{corpus.stem}-{args.ranks[0]}"
                reuse = reuse if args.prepare_once and ranks != args.ranks[0] else None
                entry[f"ours_{ranks}_ranks"] = run = ours(corpus, args.workdir, tokenizer, ranks, args.steps, reuse)
                rows.append([f"{pairs:,}", f"ours, {ranks} rank(s)", *_cells(run)])
        if "plain" in args.recipes:
            entry["plain"] = run = plain(corpus, args.workdir, tokenizer, args.steps)
            rows.append([f"{pairs:,}", "plain recipe", *_cells(run)])
        if args.throughput_steps:
            ready = args.workdir / f"prepared-{corpus.stem}-1"  # what the 1-rank runs prepared, if they ran
            entry["train_tokens_per_s"] = throughput(
                corpus, args.workdir, tokenizer, args.throughput_steps, ready if ready.is_dir() else None
            )
            print(f"{pairs:,} pairs: {entry['train_tokens_per_s']:,} training tokens/s", flush=True)
        results[str(pairs)] = entry
        print(f"{pairs:,} pairs: tokenization {entry['tokenize_pairs_per_s_per_core']:,} pairs/s per core", flush=True)
    if args.throughput_steps:
        gettext = throughput(SHARED / "train.tsv", args.workdir, tokenizer, args.throughput_steps)
        results["gettext_train_tokens_per_s"] = gettext
        print(f"gettext pairs (the main job's corpus): {gettext:,} training tokens/s", flush=True)
    headers = ["pairs", "recipe", "first run: to step 1", "peak anon", "per process", "cached: to step 1",
               "peak anon", "per process"]  # fmt: skip
    print(format_table(headers, rows))
    same_run = ("pairs", "ranks", "recipes", "steps", "prepare_once", "throughput_steps")
    return save_results(args.name, "data_scale", argv, machine=machine_info(), settings=vars(args), results=results,
                        same_run=same_run)  # fmt: skip


def _cells(run: dict[str, dict]) -> list[str]:
    cells = []
    for key in ("first", "cached"):
        if key not in run:
            cells += ["(reused)", "", ""]
            continue
        measured = run[key]
        cells += [f"{measured['first_step_s']} s", f"{measured['peak_anon_gib']} GiB",
                  f"{measured['peak_anon_per_process_gib']} GiB"]  # fmt: skip
    return cells


if __name__ == "__main__":
    main()
