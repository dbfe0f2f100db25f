"""The placeholder-safe translate loop: the text as it is first, verified; then masked; then piece by piece; never a
broken string (docs/localization.md). Pure Python: `translate_batch` is any `list[str] -> list[str]` (the ONNX
runtime, the PyTorch helpers, the HTTP server's scheduler, a test's fake). The masks themselves: `placeholders.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .batches import translate_by_length
from .placeholders import protect, restore, token_text


@dataclass
class Result:
    """The outcome for one text: `translation` is None when every attempt lost or duplicated a placeholder."""

    source: str
    translation: str | None
    status: str  # "translated", "retried", "copied" (nothing to translate) or "failed"
    attempts: list[str] = field(default_factory=list)  # the strategies tried, in order
    reason: str = ""  # why the last attempt failed


# Retry strategies: a mask style by name ("verbatim" is style "none"), "alternate" (the mask style the first attempt
# did not use: percent, or brace after percent), or "segments". The defaults are the A/B's best
# (docs/localization.md): the text as it is first, then %1 masks, then {0} masks, then segments.
STRATEGIES = ("verbatim", "percent", "brace", "alternate", "segments")
DEFAULT_STYLE = "none"
DEFAULT_RETRY = ("percent", "brace", "segments")


def translate_protected(
    translate_batch: Callable[[list[str]], list[str]],
    texts: Sequence[str],
    flags_per_text: Sequence[Sequence[str]] | None = None,
    retry: Sequence[str] = DEFAULT_RETRY,
    style: str = DEFAULT_STYLE,
    batch_size: int | None = None,
) -> list[Result]:
    """Translate `texts` with every placeholder kept, or not at all.

    Args:
        translate_batch: list of source strings -> list of translations, same length and order (e.g.
            `lambda batch: translator.translate(batch, num_beams=4)`).
        texts: source messages.
        flags_per_text: each text's gettext flags (`("c-format",)`); None: no flags, the common placeholders.
        retry: what to try, in order, on the texts whose placeholders did not survive: "verbatim" (the
            placeholders as they are, as the model saw them in training), "percent" (masked %1, %2, ...), "brace"
            (masked {0}, {1}, ...), "alternate" (percent, or brace after a first attempt in percent), "segments" (the
            pieces between placeholders translated alone and joined around them in the source order; always keeps
            them, at some cost in word order). A strategy equal to the first attempt is skipped.
        style: the first attempt: "none" (the text as it is, placeholders verified after; the measured best),
            "percent" or "brace".
        batch_size: texts per `translate_batch` call (None: all at once).
    Returns:
        one `Result` per text, in order; `translation` is None where every attempt failed.
    """
    flags_per_text = list(flags_per_text) if flags_per_text is not None else [()] * len(texts)
    if len(flags_per_text) != len(texts):
        raise ValueError(f"flags_per_text has {len(flags_per_text)} items for {len(texts)} texts")
    unknown = [s for s in retry if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown retry strategies {unknown}; known: {STRATEGIES}")
    results = [Result(text, None, "failed") for text in texts]
    pending = []
    for index, (text, flags) in enumerate(zip(texts, flags_per_text, strict=True)):
        protected = protect(text, flags, style)
        if not protected.is_translatable:
            results[index] = Result(text, text, "copied")
        else:
            pending.append(index)

    def attempt(indices: list[int], name: str, prepare: Callable[[int], tuple[list[str], Callable]]) -> list[int]:
        """Run one strategy on `indices`; return those still failing."""
        inputs, finishers, owners = [], [], []
        for index in indices:
            pieces, finish = prepare(index)
            owners.append((index, len(inputs), len(pieces)))
            inputs.extend(pieces)
            finishers.append(finish)
        outputs = translate_by_length(translate_batch, inputs, batch_size)
        failing = []
        for (index, start, count), finish in zip(owners, finishers, strict=True):
            results[index].attempts.append(name)
            restored = finish(outputs[start : start + count])
            if restored is None:
                results[index].reason = f"{name}: a placeholder was lost, duplicated or invented"
                failing.append(index)
            else:
                results[index].translation = restored
                results[index].status = "translated" if len(results[index].attempts) == 1 else "retried"
        return failing

    def masked_with(mask_style: str) -> Callable[[int], tuple[list[str], Callable]]:
        def prepare(index: int):
            protected = protect(texts[index], flags_per_text[index], mask_style)
            return [protected.masked], lambda outputs: restore(outputs[0], protected)

        return prepare

    def segments(index: int):
        protected = protect(texts[index], flags_per_text[index], "brace")
        pieces = protected.segments
        wanted = [i for i, piece in enumerate(pieces) if any(c.isalpha() for c in piece)]

        def finish(outputs: list[str]) -> str | None:
            if any(not output.strip() for output in outputs):
                return None  # a piece with words came back empty: its words would be lost
            translated = list(pieces)
            for i, output in zip(wanted, outputs, strict=True):
                lead = pieces[i][: len(pieces[i]) - len(pieces[i].lstrip())]
                trail = pieces[i][len(pieces[i].rstrip()) :]
                translated[i] = lead + output.strip() + trail
            joined = translated[0]
            for i in range(1, len(translated)):
                joined += token_text("brace", i - 1) + translated[i]
            return restore(joined, protected)

        return [pieces[i] for i in wanted], finish

    other = "percent" if style != "percent" else "brace"
    styles = {"verbatim": "none", "percent": "percent", "brace": "brace", "alternate": other}
    first = {"none": "verbatim"}.get(style, style)
    pending = attempt(pending, first, masked_with(style))
    for name in retry:
        if not pending:
            break
        if name == "segments":
            pending = attempt(pending, name, segments)
        elif styles[name] != style:
            pending = attempt(pending, name, masked_with(styles[name]))
    for index in pending:
        results[index].status = "failed"
    return results
