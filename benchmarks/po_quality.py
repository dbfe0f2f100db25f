"""Machine pre-translation of gettext catalogs the model never saw: the desktop catalogs (held out of training with
`--gettext_heldout_catalogs desktop`), their translations stripped, translated by vt-translate-po's loop with and
without placeholder protection, then checked with GNU msgfmt and scored against the human translations.

    python -m benchmarks.po_quality --model /work/po-model/onnx --num_beams 4 --threads 2

The inputs are built from the installed `/usr/share/locale/<lang>/LC_MESSAGES/<catalog>.mo`: every entry (contexts
and plural entries included), its msgstr removed. A .mo keeps no flags, so each entry gets the flag xgettext would
give it: `c-format` when its msgid holds a printf directive (`python-format` / `python-brace-format` in
software-properties, a Python program). The catalogs stay in a temporary folder (or --work_dir), never in the
repository. Prints three markdown tables: the catalogs, baseline against protected, and the mask A/B.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import polib

from vanilla_transformer_ort.catalog import load_catalog, pretranslate, write_catalog
from vanilla_transformer_ort.placeholders import (
    C_FORMAT,
    PYTHON_FORMAT,
    placeholders,
    same_placeholders,
)
from vanilla_transformer_ort.protected_translation import translate_protected

DESKTOP_CATALOGS = (
    "PackageKit",
    "appstream",
    "at-spi2-core",
    "avahi",
    "gdk-pixbuf",
    "gsettings-desktop-schemas",
    "gtk20",
    "polkit-1",
    "shared-mime-info",
    "software-properties",
    "xdg-user-dirs",
)  # fmt: skip  (gettext_corpus.DESKTOP_CATALOGS, repeated to keep this benchmark free of torch)
PYTHON_CATALOGS = {"software-properties"}


def infer_flags(msgid: str, catalog: str) -> list[str]:
    """The format flag xgettext would write for this msgid (none when it holds no directive)."""
    if catalog in PYTHON_CATALOGS:
        if re.search(PYTHON_FORMAT, msgid.replace("%%", "")):
            return ["python-format"]
        if re.search(r"\{[A-Za-z_0-9]*\}", msgid):
            return ["python-brace-format"]
        return []
    return ["c-format"] if re.search(C_FORMAT, msgid.replace("%%", "")) else []


def build_inputs(locale_dir: Path, language: str, names: list[str], folder: Path, limit: int | None):
    """One stripped .pot per installed catalog, and the references: {(catalog, msgctxt, msgid): msgstr or {n: ...}}."""
    inputs, references = [], {}
    for name in names:
        path = locale_dir / language / "LC_MESSAGES" / f"{name}.mo"
        if not path.is_file():
            continue
        mo = polib.mofile(str(path))
        pot = polib.POFile(wrapwidth=79)
        pot.metadata = {"Content-Type": "text/plain; charset=UTF-8", "Content-Transfer-Encoding": "8bit"}
        for entry in list(mo)[:limit]:
            if not entry.msgid:
                continue
            flags = infer_flags(entry.msgid, name)
            if entry.msgid_plural:
                stripped = polib.POEntry(
                    msgid=entry.msgid, msgid_plural=entry.msgid_plural, msgctxt=entry.msgctxt, flags=flags,
                    msgstr_plural={n: "" for n in entry.msgstr_plural},
                )  # fmt: skip
                references[(name, entry.msgctxt, entry.msgid)] = dict(entry.msgstr_plural)
            else:
                stripped = polib.POEntry(msgid=entry.msgid, msgctxt=entry.msgctxt, flags=flags, msgstr="")
                references[(name, entry.msgctxt, entry.msgid)] = entry.msgstr
            pot.append(stripped)
        target = folder / f"{name}.pot"
        pot.save(str(target))
        inputs.append((name, target))
    return inputs, references


def msgfmt_rejected(path: Path) -> tuple[set[int], bool]:
    """Line numbers of the entries GNU msgfmt --check-format rejects (fuzzy entries included), and whether the whole
    file compiles."""
    result = subprocess.run(
        ["msgfmt", "--check-format", "--use-fuzzy", "-o", "/dev/null", str(path)], capture_output=True, text=True
    )
    lines = {int(m.group(1)) for m in re.finditer(rf"^{re.escape(str(path))}:(\d+):", result.stderr, re.M)}
    catalog = polib.pofile(str(path))
    starts = sorted(entry.linenum for entry in catalog if entry.msgid)
    rejected = set()
    for line in lines:
        owner = max((start for start in starts if start <= line), default=None)
        if owner is not None:
            rejected.add(owner)
    return rejected, result.returncode == 0


def translations_of(entry) -> list[tuple[str, str]]:
    """(source, translation) pairs of an entry: msgstr[0] against msgid, the other forms against msgid_plural."""
    if entry.msgid_plural:
        return [
            (entry.msgid if n == 0 else entry.msgid_plural, text) for n, text in sorted(entry.msgstr_plural.items())
        ]
    return [(entry.msgid, entry.msgstr)]


def score(pairs: list[tuple[str, str]]) -> tuple[float, float]:
    """sacreBLEU and chrF of (hypothesis, reference) pairs, whitespace folded as the training data is."""
    import sacrebleu

    hypotheses = [" ".join(h.split()) for h, _ in pairs]
    references = [" ".join(r.split()) for _, r in pairs]
    return (
        round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 2),
        round(sacrebleu.corpus_chrf(hypotheses, [references]).score, 2),
    )


def evaluate(outputs: list[tuple[str, Path]], references: dict) -> tuple[dict, dict]:
    """msgfmt acceptance, placeholder preservation, BLEU/chrF and plural counts over the written catalogs, and the
    scored (hypothesis, reference) pairs by entry."""
    stats = Counter()
    scored = {}
    for name, path in outputs:
        rejected, compiles = msgfmt_rejected(path)
        stats["files_compiling"] += compiles
        for entry in polib.pofile(str(path)):
            if not entry.msgid:
                continue
            stats["entries"] += 1
            written = all(text for _, text in translations_of(entry))
            stats["written"] += written
            stats["accepted"] += entry.linenum not in rejected
            stats["written_accepted"] += written and entry.linenum not in rejected
            if entry.msgid_plural:
                stats["plural_entries"] += 1
                stats["plural_filled"] += written
            carries = bool(placeholders(entry.msgid, entry.flags) or placeholders(entry.msgid_plural, entry.flags))
            reference = references[(name, entry.msgctxt, entry.msgid)]
            if carries:
                stats["with_placeholder"] += 1
                kept = written and all(same_placeholders(s, t, entry.flags) for s, t in translations_of(entry))
                stats["placeholder_kept"] += kept
                stats["placeholder_written"] += written
                if isinstance(reference, str) and reference:
                    stats["reference_with_placeholder"] += 1
                    stats["reference_kept"] += same_placeholders(entry.msgid, reference, entry.flags)
            if isinstance(reference, str) and reference:
                scored[(name, entry.msgctxt, entry.msgid)] = (entry.msgstr, reference)  # untranslated: empty
    stats["bleu"], stats["chrf"] = score(list(scored.values()))
    stats["scored"] = len(scored)
    return dict(stats), scored


def run(args: argparse.Namespace) -> None:
    from vanilla_transformer_ort.translator import OrtTranslator

    translator = OrtTranslator(args.model, provider="cpu", intra_op_num_threads=args.threads)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="vt-po-quality-"))
    work.mkdir(parents=True, exist_ok=True)
    # Translations are kept in the work folder, so that a rerun (another A/B row) translates only what is new.
    cache_file = work / f"translations-{Path(args.model).name}-beam{args.num_beams}.json"
    cache: dict[str, str] = json.loads(cache_file.read_text()) if cache_file.is_file() else {}
    counts = Counter()

    def translate_batch(batch: list[str]) -> list[str]:
        """The server's call (OrtTranslator.translate on a batch), memoised across the runs: the same input gives
        the same output, so each distinct text is translated once."""
        missing = sorted({text for text in batch if text not in cache}, key=len)
        for start in range(0, len(missing), args.batch_size):
            chunk = missing[start : start + args.batch_size]
            counts["model_calls"] += 1
            counts["texts"] += len(chunk)
            for text, out in zip(chunk, translator.translate(chunk, num_beams=args.num_beams), strict=True):
                cache[text] = out
            if counts["model_calls"] % 20 == 0:
                cache_file.write_text(json.dumps(cache, ensure_ascii=False))
                print(f"  {len(cache):,} texts translated", file=sys.stderr)
        if missing:
            cache_file.write_text(json.dumps(cache, ensure_ascii=False))
        return [cache[text] for text in batch]

    inputs, references = build_inputs(Path(args.locale_dir), args.target_lang, args.catalogs, work, args.limit)
    print(f"{len(inputs)} catalogs, {len(references)} entries, in {work}", file=sys.stderr)

    results, pairs = {}, {}
    runs = [("baseline (no protection)", dict(protection=False)), ("protected", dict())]
    for label, options in runs:
        started = time.monotonic()
        outputs = []
        for name, path in inputs:
            catalog = load_catalog(path)
            pretranslate(catalog, path, translate_batch, args.target_lang, batch_size=10_000, **options)
            target = work / f"{name}.{label.split()[0]}.po"
            write_catalog(catalog, target)
            outputs.append((name, target))
        results[label], pairs[label] = evaluate(outputs, references)
        print(f"{label} ({time.monotonic() - started:.0f} s): {results[label]}", file=sys.stderr)
    # BLEU on the entries every run wrote: what protection changes where it does not leave an entry out.
    common = [key for key in pairs[runs[0][0]] if all(pairs[label][key][0] for label in pairs)]
    for label in results:
        results[label]["common_bleu"], results[label]["common_chrf"] = score([pairs[label][k] for k in common])
        results[label]["common"] = len(common)

    print_tables(results, args)
    if not args.skip_ab:
        print_ab(inputs, references, translate_batch)
    print(f"\nmodel calls: {counts['model_calls']}, texts translated: {counts['texts']}", file=sys.stderr)


def percent(part: int, whole: int) -> str:
    return f"{part:,} / {whole:,} ({100 * part / max(whole, 1):.1f}%)"


def print_tables(results: dict, args: argparse.Namespace) -> None:
    print(f"\nModel {args.model}, beam {args.num_beams}; catalogs: {', '.join(args.catalogs)}\n")
    labels = list(results)
    print("| | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    rows = [
        ("entries msgfmt --check-format accepts", lambda r: percent(r["accepted"], r["entries"])),
        ("of the entries written", lambda r: percent(r["written_accepted"], r["written"])),
        ("catalogs that compile", lambda r: f"{r['files_compiling']} / {len(args.catalogs)}"),
        ("entries with a placeholder: kept exactly", lambda r: percent(r["placeholder_kept"], r["with_placeholder"])),
        ("... of those written", lambda r: percent(r["placeholder_kept"], r["placeholder_written"])),
        ("entries left untranslated", lambda r: f"{r['entries'] - r['written']:,}"),
        (
            "BLEU / chrF against the human translations (untranslated = empty)",
            lambda r: f"{r['bleu']} / {r['chrf']} ({r['scored']:,})",
        ),
        ("... on the entries both runs wrote", lambda r: f"{r['common_bleu']} / {r['common_chrf']} ({r['common']:,})"),
        (
            "plural entries filled (every form)",
            lambda r: percent(r.get("plural_filled", 0), r.get("plural_entries", 0)),
        ),
    ]
    for title, cell in rows:
        print(f"| {title} | " + " | ".join(cell(results[label]) for label in labels) + " |")
    first = results[labels[0]]
    print(
        f"\nThe human translations keep the placeholders of "
        f"{percent(first.get('reference_kept', 0), first.get('reference_with_placeholder', 0))} of their entries."
    )


def print_ab(inputs, references, translate_batch) -> None:
    """The mask A/B on the single entries with a placeholder: one attempt per design, then the retry chain."""
    texts, flags, refs = [], [], []
    for name, path in inputs:
        for entry in polib.pofile(str(path)):
            reference = references[(name, entry.msgctxt, entry.msgid)]
            if entry.msgid and not entry.msgid_plural and reference and placeholders(entry.msgid, entry.flags):
                texts.append(entry.msgid)
                flags.append(tuple(entry.flags))
                refs.append(reference)
    designs = [
        ("raw text, no check (baseline)", None),
        ("as is, verified (style none), no retry", dict(style="none", retry=())),
        ("mask %1 (percent), no retry", dict(style="percent", retry=())),
        ("mask {0} (brace), no retry", dict(style="brace", retry=())),
        (
            "brace, then percent, as is, segments (first design)",
            dict(style="brace", retry=("percent", "verbatim", "segments")),
        ),
        ("as is, then percent, brace (no segments)", dict(style="none", retry=("percent", "brace"))),
        ("as is, then percent, brace, segments (default)", dict(style="none", retry=("percent", "brace", "segments"))),
    ]
    print(f"\nMask A/B on the {len(texts):,} single (non-plural) entries with a placeholder:\n")
    print("| design | placeholders kept | left untranslated | BLEU / chrF (untranslated = empty) |")
    print("|---|---|---|---|")
    for label, options in designs:
        if options is None:
            outputs = translate_batch(texts)
            kept = sum(same_placeholders(t, o, f) for t, o, f in zip(texts, outputs, flags, strict=True))
            failed = 0
        else:
            results = translate_protected(translate_batch, texts, flags, **options)
            outputs = [r.translation or "" for r in results]
            failed = sum(r.translation is None for r in results)
            kept = len(texts) - failed
        bleu, chrf = score(list(zip(outputs, refs, strict=True)))
        print(f"| {label} | {percent(kept, len(texts))} | {failed:,} | {bleu} / {chrf} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="ONNX export of a model trained without the desktop catalogs")
    parser.add_argument("--target_lang", default="de")
    parser.add_argument("--locale_dir", default="/usr/share/locale")
    parser.add_argument("--catalogs", nargs="+", default=list(DESKTOP_CATALOGS))
    parser.add_argument("--num_beams", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None, help="entries per catalog (a quick run)")
    parser.add_argument("--work_dir", help="keep the stripped inputs and the outputs here")
    parser.add_argument("--skip_ab", action="store_true", help="only the baseline/protected table")
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
