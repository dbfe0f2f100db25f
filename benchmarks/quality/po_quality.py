"""Pre-translation of the installed gettext catalogs a model never saw, with and without placeholder protection: msgfmt
acceptance and BLEU against the human translations; docs/localization.md#measured-on-catalogs-the-model-never-saw."""

from __future__ import annotations

import bisect
import json
import re
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

import polib

from benchmarks import common
from vanilla_transformer_ort.gettext.catalog import load_catalog, pretranslate, write_catalog
from vanilla_transformer_ort.placeholder_syntax import C_FORMAT, PYTHON_FORMAT
from vanilla_transformer_ort.placeholders import placeholders, same_placeholders

# gettext_corpus.DESKTOP_CATALOGS, repeated to keep this benchmark free of torch
DESKTOP_CATALOGS = ("PackageKit", "appstream", "at-spi2-core", "avahi", "gdk-pixbuf", "gsettings-desktop-schemas",
                    "gtk20", "polkit-1", "shared-mime-info", "software-properties", "xdg-user-dirs")  # fmt: skip
PYTHON_CATALOGS = {"software-properties"}


def infer_flags(msgid: str, catalog: str) -> list[str]:
    """The format flag xgettext would write for this msgid (none when it holds no directive)."""
    if catalog not in PYTHON_CATALOGS:
        return ["c-format"] if re.search(C_FORMAT, msgid.replace("%%", "")) else []
    if re.search(PYTHON_FORMAT, msgid.replace("%%", "")):
        return ["python-format"]
    return ["python-brace-format"] if re.search(r"\{[A-Za-z_0-9]*\}", msgid) else []


def build_inputs(locale_dir: Path, language: str, names: list[str], folder: Path, limit: int | None):
    """One stripped .pot per installed catalog, and the references: {(catalog, msgctxt, msgid): msgstr or {n: ...}}."""
    inputs, references = [], {}
    for name in names:
        path = locale_dir / language / "LC_MESSAGES" / f"{name}.mo"
        if not path.is_file():
            continue
        pot = polib.POFile(wrapwidth=79)
        pot.metadata = {"Content-Type": "text/plain; charset=UTF-8", "Content-Transfer-Encoding": "8bit"}
        for entry in [entry for entry in polib.mofile(str(path)) if entry.msgid][:limit]:
            fields = {"msgid": entry.msgid, "msgctxt": entry.msgctxt, "flags": infer_flags(entry.msgid, name)}
            if entry.msgid_plural:
                fields |= {"msgid_plural": entry.msgid_plural, "msgstr_plural": dict.fromkeys(entry.msgstr_plural, "")}
            pot.append(polib.POEntry(**fields))
            references[(name, entry.msgctxt, entry.msgid)] = dict(entry.msgstr_plural) or entry.msgstr
        pot.save(str(folder / f"{name}.pot"))
        inputs.append((name, folder / f"{name}.pot"))
    return inputs, references


def msgfmt_rejected(path: Path) -> tuple[set[int], bool]:
    """First lines of the entries GNU msgfmt --check-format rejects (fuzzy ones included), and whether the file
    compiles."""
    command = ["msgfmt", "--check-format", "--use-fuzzy", "-o", "/dev/null", str(path)]
    result = subprocess.run(command, capture_output=True, text=True)
    starts = sorted(entry.linenum for entry in polib.pofile(str(path)) if entry.msgid)
    lines = {int(m.group(1)) for m in re.finditer(rf"^{re.escape(str(path))}:(\d+):", result.stderr, re.M)}
    rejected = {starts[bisect.bisect_right(starts, line) - 1] for line in lines if starts and line >= starts[0]}
    return rejected, result.returncode == 0


def translations_of(entry) -> list[tuple[str, str]]:
    """(source, translation) pairs of an entry: msgstr[0] against msgid, the other forms against msgid_plural."""
    if not entry.msgid_plural:
        return [(entry.msgid, entry.msgstr)]
    return [(entry.msgid_plural if n else entry.msgid, text) for n, text in sorted(entry.msgstr_plural.items())]


def score(pairs: list[tuple[str, str]]) -> tuple[float, float]:
    """sacreBLEU and chrF of (hypothesis, reference) pairs, whitespace folded as the training data is."""
    import sacrebleu

    if not pairs:
        return 0.0, 0.0
    hypotheses, references = ([" ".join(text.split()) for text in side] for side in zip(*pairs, strict=True))
    return tuple(round(metric(hypotheses, [references]).score, 2) for metric in (sacrebleu.corpus_bleu,
                                                                              sacrebleu.corpus_chrf))  # fmt: skip


def evaluate(outputs: list[tuple[str, Path]], references: dict) -> tuple[dict, dict]:
    """msgfmt acceptance, placeholder preservation, BLEU/chrF and plural counts over the written catalogs, and the
    scored (hypothesis, reference) pairs by entry."""
    stats, scored = Counter(), {}
    for name, path in outputs:
        rejected, compiles = msgfmt_rejected(path)
        stats["files_compiling"] += compiles
        for entry in (entry for entry in polib.pofile(str(path)) if entry.msgid):
            written, accepted = all(text for _, text in translations_of(entry)), entry.linenum not in rejected
            reference = references[(name, entry.msgctxt, entry.msgid)]
            single = isinstance(reference, str) and bool(reference)  # a plural entry's references are a dict
            stats.update(entries=1, written=written, accepted=accepted, written_accepted=written and accepted)
            if entry.msgid_plural:
                stats.update(plural_entries=1, plural_filled=written)
            if placeholders(entry.msgid, entry.flags) or placeholders(entry.msgid_plural, entry.flags):
                kept = written and all(same_placeholders(s, t, entry.flags) for s, t in translations_of(entry))
                stats.update(with_placeholder=1, placeholder_kept=kept, placeholder_written=written)
                if single:
                    reference_kept = same_placeholders(entry.msgid, reference, entry.flags)
                    stats.update(reference_with_placeholder=1, reference_kept=reference_kept)
            if single:
                scored[(name, entry.msgctxt, entry.msgid)] = (entry.msgstr, reference)  # untranslated: empty
    stats["bleu"], stats["chrf"] = score(list(scored.values()))
    stats["scored"] = len(scored)
    return stats, scored


def main(argv: list[str] | None = None) -> dict:
    parser = common.parser(__doc__, "po_quality")
    parser.add_argument("--model", required=True, help="ONNX export of a model trained without the desktop catalogs")
    parser.add_argument("--target_lang", default="de")
    parser.add_argument("--locale_dir", default="/usr/share/locale")
    parser.add_argument("--catalogs", nargs="+", default=list(DESKTOP_CATALOGS))
    parser.add_argument("--num_beams", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--limit", type=int, default=None, help="entries per catalog (a quick run)")
    parser.add_argument("--workdir", help="keep the stripped inputs, the outputs and the translations here")
    args = parser.parse_args(argv)

    from vanilla_transformer_ort.translator import OrtTranslator

    translator = OrtTranslator(args.model, provider="cpu", intra_op_num_threads=args.threads)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="vt-po-quality-"))
    work.mkdir(parents=True, exist_ok=True)
    # Translations are kept in the work folder, so that a rerun translates only what is new.
    cache_file = work / f"translations-{Path(args.model).name}-beam{args.num_beams}.json"
    cache: dict[str, str] = json.loads(cache_file.read_text()) if cache_file.is_file() else {}

    def translate_batch(batch: list[str]) -> list[str]:
        """The server's call (OrtTranslator.translate on a batch), memoised: each distinct text is translated once."""
        missing = sorted({text for text in batch if text not in cache}, key=len)
        for start in range(0, len(missing), args.batch_size):
            chunk = missing[start : start + args.batch_size]
            cache.update(zip(chunk, translator.translate(chunk, num_beams=args.num_beams), strict=True))
            cache_file.write_text(json.dumps(cache, ensure_ascii=False))
        return [cache[text] for text in batch]

    inputs, references = build_inputs(Path(args.locale_dir), args.target_lang, args.catalogs, work, args.limit)
    common.log(f"{len(inputs)} catalogs, {len(references)} entries, in {work}")
    results, pairs = {}, {}
    for label, options in (("baseline (no protection)", {"protection": False}), ("protected", {})):
        started = time.monotonic()
        outputs = []
        for name, path in inputs:
            catalog = load_catalog(path)
            pretranslate(catalog, path, translate_batch, args.target_lang, batch_size=10_000, **options)
            write_catalog(catalog, work / f"{name}.{label.split()[0]}.po")
            outputs.append((name, work / f"{name}.{label.split()[0]}.po"))
        results[label], pairs[label] = evaluate(outputs, references)
        common.log(f"{label} ({time.monotonic() - started:.0f} s): {results[label]}")
    # BLEU on the entries every run wrote: what protection changes where it does not leave an entry out.
    both = [key for key in pairs["protected"] if all(pairs[label][key][0] for label in pairs)]
    for label in results:
        results[label]["common_bleu"], results[label]["common_chrf"] = score([pairs[label][k] for k in both])
        results[label]["common"] = len(both)
    print_table(results, args)
    return common.save_results(args.output, "quality.po_quality", argv, machine=common.machine_info(args.threads),
                               settings=vars(args), results=results)  # fmt: skip


def percent(part: int, whole: int) -> str:
    return f"{part:,} / {whole:,} ({100 * part / max(whole, 1):.1f}%)"


def print_table(results: dict, args) -> None:
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
        ("plural entries filled (every form)", lambda r: percent(r["plural_filled"], r["plural_entries"])),
    ]
    print(f"\nModel {args.model}, beam {args.num_beams}; catalogs: {', '.join(args.catalogs)}\n")
    print(common.format_table(["", *results], [[title, *map(cell, results.values())] for title, cell in rows]))
    first = next(iter(results.values()))
    kept = percent(first["reference_kept"], first["reference_with_placeholder"])
    print(f"\nThe human translations keep the placeholders of {kept} of their entries.")


if __name__ == "__main__":
    main()
