"""Verifiers: exact match for the embedded suite, math-verify for math answers.

Every scorer has the signature `score(completion: str, item: Item) -> float in [0, 1]`
and never raises on malformed output: a completion that cannot be parsed scores 0.
"""

from __future__ import annotations

import re
import threading

__all__ = ["extract_tagged", "last_boxed", "exact_score", "math_score", "math_equal"]

_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_tagged(completion: str) -> str | None:
    """The text inside the last `<answer>...</answer>` pair, or None when there is none.

    >>> extract_tagged("think... <answer> 42 </answer>")
    ' 42 '
    """
    found = _TAG.findall(completion or "")
    return found[-1] if found else None


def last_boxed(text: str, commands: tuple = ("boxed", "fbox")) -> str | None:
    """Content of the last brace-matched `\\boxed{...}` (or another of `commands`, e.g.
    `\\fbox{...}`), or None when there is none or its braces never close.

    >>> last_boxed("so $\\\\boxed{\\\\frac{1}{2}}$ and \\\\fbox{3}"), last_boxed("\\\\boxed{1", ("boxed",))
    ('3', None)
    >>> last_boxed("thus \\\\boxed{\\\\frac{1}{2}}.")
    '\\\\frac{1}{2}'
    """
    found = list(re.finditer(r"\\(?:%s)\s*\{" % "|".join(map(re.escape, commands)), text))
    if not found:
        return None
    start, depth = found[-1].end(), 1
    for k in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[k], 0)
        if depth == 0:
            return text[start:k]
    return None


def exact_score(completion: str, item) -> float:
    """1.0 when the answer equals `item.answer` exactly (surrounding whitespace ignored),
    else 0.0. The answer is the text inside `<answer>` tags when the completion has them,
    else the whole completion (the embedded suite's tiny model answers bare).

    >>> from rlpace.tasks import Item
    >>> it = Item("12+30=", "42", "add2", 2.0, 0)
    >>> exact_score("42", it), exact_score(" 42\\n", it), exact_score("<answer>42</answer>", it)
    (1.0, 1.0, 1.0)
    >>> exact_score("41", it), exact_score("", it), exact_score("42 is it", it)
    (0.0, 0.0, 0.0)
    """
    if not isinstance(completion, str):
        return 0.0
    tagged = extract_tagged(completion)
    got = tagged if tagged is not None else completion
    return 1.0 if got.strip() == str(item.answer).strip() else 0.0


def math_equal(prediction: str, gold: str) -> bool:
    """math-verify equivalence of a model's answer to the gold answer (Hugging Face
    `math_verify.parse` + `verify`; ecosystem.md §5).

    math-verify guards its sympy work with `signal.alarm`, which only works in the main
    thread: called elsewhere (a TRL async reward function, a thread pool) its `parse`
    raises "doesn't support threaded environment". Off the main thread we therefore pass
    `parsing_timeout=None` / `timeout_seconds=None`, i.e. no time limit — a pathological
    expression can then take long, which is the price of threads.

    >>> math_equal("The answer is $\\\\boxed{\\\\frac{3}{4}}$", "0.75")
    True
    >>> math_equal("\\\\boxed{0.7}", "3/4")
    False
    """
    from math_verify import parse, verify

    main = threading.current_thread() is threading.main_thread()
    ptimeout = 5 if main else None
    vtimeout = 5 if main else None
    try:
        gold_p = parse(_as_math(gold), parsing_timeout=ptimeout)
        pred_p = parse(prediction, parsing_timeout=ptimeout)
        if not gold_p or not pred_p:
            return False
        return bool(verify(gold_p, pred_p, timeout_seconds=vtimeout))
    except Exception:  # malformed LaTeX, sympy errors, timeouts: a wrong answer, not a crash
        return False


def _as_math(gold: str) -> str:
    """Wrap a bare gold answer in $...$ so math-verify's LaTeX extractor reads it."""
    g = str(gold).strip()
    return g if ("$" in g or "\\boxed" in g) else f"${g}$"


def math_score(completion: str, item) -> float:
    """1.0 when math-verify finds the completion's answer equivalent to `item.answer`.
    A `<answer>` tag, when present, narrows the search to its content; otherwise
    math-verify extracts the answer itself (last `\\boxed{}`, then the last expression).

    >>> from rlpace.tasks import Item
    >>> it = Item("What is 3/4 as a decimal?", "0.75", "frac", 1.0, 0, ability="math")
    >>> math_score("So it is \\\\boxed{\\\\frac{3}{4}}.", it), math_score("\\\\boxed{0.7}", it)
    (1.0, 0.0)
    """
    if not isinstance(completion, str) or not completion.strip():
        return 0.0
    tagged = extract_tagged(completion)
    return 1.0 if math_equal(tagged if tagged is not None else completion, item.answer) else 0.0
