"""One parser for policy keyword arguments written on a command line: JSON, or Hydra's
flow-style mapping as verl's docs write it.

    '{"temperature": 0.1, "c": 2}'          JSON (what `rlpace train policy_kwargs=` took)
    '{temperature:0.1, c:2}'                Hydra / OmegaConf flow style (verl's overrides)

Values in flow style: numbers (`1`, `-2.5`, `1e-3`), booleans (`true`/`false`, any case),
`null`, quoted strings (`'x'`, `"x"`), unquoted strings (`mopps`, `a b` — up to the next
`,` `]` `}`), lists (`[1, [2, 3]]`) and nested mappings. Nothing is evaluated: this is a
small recursive-descent reader, not `eval` or `ast.literal_eval`.

>>> parse_mapping("{temperature:0.1, base: pool, floors: [0.05, 1e-2], on: true, x: null}")
{'temperature': 0.1, 'base': 'pool', 'floors': [0.05, 0.01], 'on': True, 'x': None}
>>> parse_mapping('{"c": 0.5}')
{'c': 0.5}
>>> parse_value("[1, 'two', {a: 3}]")
[1, 'two', {'a': 3}]
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import InputError

__all__ = ["parse_mapping", "parse_value"]

_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_INT = re.compile(r"[+-]?\d+$")


def _scalar(text: str) -> Any:
    """An unquoted flow-style scalar: number, bool, null, else the string itself."""
    low = text.lower()
    if low == "true":
        return True
    if low == "false":
        return False
    if low in ("null", "~"):
        return None
    if _INT.match(text):
        return int(text)
    if _NUMBER.match(text) or low in ("inf", "+inf", "-inf", "nan"):
        return float(text)
    return text


class _Reader:
    def __init__(self, text: str, what: str):
        self.s, self.i, self.what = text, 0, what

    def fail(self, why: str):
        raise InputError(f"{self.what} {self.s!r}: {why} at character {self.i + 1}. Write a JSON object "
                         f"('{{\"temperature\": 0.1}}') or Hydra's flow style ('{{temperature: 0.1}}').")

    def ws(self):
        while self.i < len(self.s) and self.s[self.i].isspace():
            self.i += 1

    def peek(self) -> str:
        self.ws()
        return self.s[self.i] if self.i < len(self.s) else ""

    def expect(self, ch: str):
        if self.peek() != ch:
            self.fail(f"expected {ch!r}")
        self.i += 1

    def value(self, stops: str) -> Any:
        c = self.peek()
        if c == "{":
            return self.mapping()
        if c == "[":
            return self.sequence()
        if c in "'\"":
            return self.quoted()
        start = self.i
        while self.i < len(self.s) and self.s[self.i] not in stops:
            if self.s[self.i] in "{[":
                self.fail("an unquoted value may not contain '{' or '['")
            self.i += 1
        text = self.s[start:self.i].strip()
        if not text:
            self.fail("a value is missing")
        return _scalar(text)

    def quoted(self) -> str:
        q = self.s[self.i]
        self.i += 1
        out = []
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "\\" and self.i + 1 < len(self.s):
                out.append(self.s[self.i + 1])
                self.i += 2
                continue
            if c == q:
                self.i += 1
                return "".join(out)
            out.append(c)
            self.i += 1
        self.fail("a quoted string is not closed")

    def key(self) -> str:
        if self.peek() in "'\"":
            return self.quoted()
        start = self.i
        while self.i < len(self.s) and self.s[self.i] not in ":,}":
            self.i += 1
        k = self.s[start:self.i].strip()
        if not k:
            self.fail("a key is missing")
        return k

    def more(self, close: str) -> bool:
        """After an item of a mapping or list: step past ',' (True, another item follows) or past
        `close` (False); anything else fails at that character."""
        c = self.peek()
        self.i += 1
        if c == close:
            return False
        if c != ",":
            self.i -= 1
            self.fail(f"expected ',' or '{close}'")
        return True

    def mapping(self) -> dict:
        self.expect("{")
        out: dict = {}
        if self.peek() == "}":
            self.i += 1
            return out
        while True:
            k = self.key()
            self.expect(":")
            if k in out:
                self.fail(f"key {k!r} appears twice")
            out[k] = self.value(",]}")
            if not self.more("}"):
                return out

    def sequence(self) -> list:
        self.expect("[")
        out: list = []
        if self.peek() == "]":
            self.i += 1
            return out
        while True:
            out.append(self.value(",]}"))
            if not self.more("]"):
                return out


def parse_value(text: str, what: str = "value") -> Any:
    """One value: JSON when it is JSON, else a flow-style value (see the module docstring)."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        pass
    r = _Reader(str(text), what)
    v = r.value("")
    if r.peek():
        r.fail("unexpected text after the value")
    return v


def parse_mapping(text: str, what: str = "policy_kwargs") -> dict:
    """A mapping written as JSON or in Hydra's flow style; InputError naming `what` otherwise.
    An empty string is the empty mapping."""
    if not str(text).strip():
        return {}
    v = parse_value(text, what)
    if not isinstance(v, dict):
        raise InputError(f"{what} must be a mapping such as '{{temperature: 0.1}}' or "
                         f"'{{\"temperature\": 0.1}}'; got {text!r}.")
    return v
