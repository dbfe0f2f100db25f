"""gettext Plural-Forms: the header `nplurals=N; plural=EXPRESSION;` parsed into a function of n, a table of the
common languages' forms, and which form takes the translation of msgid (the singular)."""

from __future__ import annotations

import re
from collections.abc import Callable

from ..languages import primary_subtag

# Plural-Forms of common languages (GNU gettext manual, "Plural forms"; the CLDR rules as gettext writes them).
PLURAL_FORMS = {
    "ja": "nplurals=1; plural=0;", "ko": "nplurals=1; plural=0;", "zh": "nplurals=1; plural=0;",
    "vi": "nplurals=1; plural=0;", "th": "nplurals=1; plural=0;", "id": "nplurals=1; plural=0;",
    "tr": "nplurals=2; plural=(n != 1);",
    "de": "nplurals=2; plural=(n != 1);", "en": "nplurals=2; plural=(n != 1);", "nl": "nplurals=2; plural=(n != 1);",
    "sv": "nplurals=2; plural=(n != 1);", "da": "nplurals=2; plural=(n != 1);", "nb": "nplurals=2; plural=(n != 1);",
    "nn": "nplurals=2; plural=(n != 1);", "no": "nplurals=2; plural=(n != 1);", "fi": "nplurals=2; plural=(n != 1);",
    "et": "nplurals=2; plural=(n != 1);", "el": "nplurals=2; plural=(n != 1);", "hu": "nplurals=2; plural=(n != 1);",
    "it": "nplurals=2; plural=(n != 1);", "es": "nplurals=2; plural=(n != 1);", "ca": "nplurals=2; plural=(n != 1);",
    "eu": "nplurals=2; plural=(n != 1);", "gl": "nplurals=2; plural=(n != 1);", "bg": "nplurals=2; plural=(n != 1);",
    "he": "nplurals=2; plural=(n != 1);", "eo": "nplurals=2; plural=(n != 1);", "pt": "nplurals=2; plural=(n != 1);",
    "fr": "nplurals=2; plural=(n > 1);", "pt_BR": "nplurals=2; plural=(n > 1);", "oc": "nplurals=2; plural=(n > 1);",
    "ru": "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);",
    "uk": "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);",
    "be": "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);",
    "sr": "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);",
    "hr": "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);",
    "pl": "nplurals=3; plural=(n==1 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);",
    "cs": "nplurals=3; plural=(n==1) ? 0 : (n>=2 && n<=4) ? 1 : 2;",
    "sk": "nplurals=3; plural=(n==1) ? 0 : (n>=2 && n<=4) ? 1 : 2;",
    "lt": "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && (n%100<10 || n%100>=20) ? 1 : 2);",
    "lv": "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n != 0 ? 1 : 2);",
    "ro": "nplurals=3; plural=(n==1 ? 0 : (n==0 || (n%100 > 0 && n%100 < 20)) ? 1 : 2);",
    "sl": "nplurals=4; plural=(n%100==1 ? 0 : n%100==2 ? 1 : n%100==3 || n%100==4 ? 2 : 3);",
    "ga": "nplurals=5; plural=(n==1 ? 0 : n==2 ? 1 : n<7 ? 2 : n<11 ? 3 : 4);",
    "ar": "nplurals=6; plural=(n==0 ? 0 : n==1 ? 1 : n==2 ? 2 : n%100>=3 && n%100<=10 ? 3 : n%100>=11 ? 4 : 5);",
}  # fmt: skip


def parse_plural_forms(header: str) -> tuple[int, Callable[[int], int]]:
    """`nplurals=N; plural=EXPR;` -> (N, function n -> form index); raises ValueError if it does not parse."""
    match = re.fullmatch(r"\s*nplurals\s*=\s*(\d+)\s*;\s*plural\s*=\s*(.+?)\s*;?\s*", header or "")
    if not match:
        raise ValueError(f"{header!r} is not 'nplurals=N; plural=EXPRESSION;'")
    nplurals, expression = int(match.group(1)), match.group(2)
    if not 1 <= nplurals <= 10:
        raise ValueError(f"nplurals={nplurals} is out of range (1 to 10)")
    evaluate = compile_plural(expression)
    for n in range(200):
        if not 0 <= evaluate(n) < nplurals:
            raise ValueError(f"plural={expression} gives form {evaluate(n)} for n={n}, outside 0..{nplurals - 1}")
    return nplurals, evaluate


def compile_plural(expression: str) -> Callable[[int], int]:
    """A C plural expression (n, integers, ?:, ||, &&, comparisons, + - * / %, !, parentheses) as a function;
    parsed by recursive descent, never eval'd."""
    tokens = re.findall(r"\s*(\d+|n|\|\||&&|==|!=|<=|>=|[-+*/%<>!?:()])", expression)
    if "".join(tokens) != re.sub(r"\s+", "", expression):
        raise ValueError(f"plural={expression} holds characters a plural expression cannot")
    position = 0

    def peek() -> str | None:
        return tokens[position] if position < len(tokens) else None

    def take(expected: str | None = None) -> str:
        nonlocal position
        token = peek()
        if token is None or (expected is not None and token != expected):
            raise ValueError(f"plural={expression}: expected {expected or 'more'} at token {position + 1}")
        position += 1
        return token

    binary = [("||",), ("&&",), ("==", "!="), ("<", ">", "<=", ">="), ("+", "-"), ("*", "/", "%")]
    operations = {
        "||": lambda a, b: int(bool(a) or bool(b)), "&&": lambda a, b: int(bool(a) and bool(b)),
        "==": lambda a, b: int(a == b), "!=": lambda a, b: int(a != b), "<": lambda a, b: int(a < b),
        ">": lambda a, b: int(a > b), "<=": lambda a, b: int(a <= b), ">=": lambda a, b: int(a >= b),
        "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
        "/": lambda a, b: a // b if b else 0, "%": lambda a, b: a % b if b else 0,
    }  # fmt: skip

    def ternary():
        condition = level(0)
        if peek() == "?":
            take("?")
            yes = ternary()
            take(":")
            no = ternary()
            return lambda n: yes(n) if condition(n) else no(n)
        return condition

    def level(depth: int):
        if depth == len(binary):
            return unary()
        left = level(depth + 1)
        while peek() in binary[depth]:
            operator = take()
            right = level(depth + 1)
            left = (lambda f, a, b: lambda n: f(a(n), b(n)))(operations[operator], left, right)
        return left

    def unary():
        token = take()
        if token == "!":
            operand = unary()
            return lambda n: int(not operand(n))
        if token == "(":
            inner = ternary()
            take(")")
            return inner
        if token == "n":
            return lambda n: n
        if token.isdigit():
            value = int(token)
            return lambda n: value
        raise ValueError(f"plural={expression}: unexpected {token!r}")

    function = ternary()
    if position != len(tokens):
        raise ValueError(f"plural={expression}: unexpected {tokens[position]!r}")
    return function


def default_plural_forms(language: str) -> str | None:
    """The Plural-Forms of `language` (de, pt_BR, sr@latin, zh_CN, ...) from the table, or None."""
    base = re.split(r"[@.]", language)[0].replace("-", "_")
    return PLURAL_FORMS.get(base) or PLURAL_FORMS.get(primary_subtag(base))


def singular_forms(nplurals: int, evaluate: Callable[[int], int]) -> set[int]:
    """The form used for n = 1, if no n beyond 0 and 1 uses it: it takes the translation of msgid, the others (and
    that form in languages such as Russian, where 21 uses it too) take that of msgid_plural."""
    if nplurals == 1:
        return set()
    form = evaluate(1)
    return {form} if all(evaluate(n) != form for n in range(2, 200)) else set()
