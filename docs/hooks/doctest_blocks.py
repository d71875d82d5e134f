"""A griffe extension for the API reference: doctests written in a docstring's prose render as code.

Many rlpace docstrings carry a runnable example as a bare doctest (`>>> ...` lines followed by
their output) rather than under an `Examples:` heading. Markdown reads `>>>` as three nested
block quotes, so this wraps each such block in a ```` ```pycon ```` fence when the docstring is
loaded. Blocks already under an `Examples:` heading (which the Google-style parser turns into
code itself) and blocks inside a fence are left alone. The docstrings in the source do not change.
"""

from __future__ import annotations

import re

import griffe

_EXAMPLES = re.compile(r"^(\s*)Examples:\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def fence_doctests(text: str) -> str:
    """Wrap every bare doctest block of `text` (from a `>>>` line to the next blank line) in a fence."""
    lines, out = text.split("\n"), []
    in_fence, examples_indent, i = False, None, 0
    while i < len(lines):
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        if examples_indent is not None and line.strip() and indent <= examples_indent:
            examples_indent = None                        # left the Examples: section
        if _FENCE.match(line):
            in_fence = not in_fence
        elif m := _EXAMPLES.match(line):
            examples_indent = len(m.group(1))
        elif not in_fence and examples_indent is None and line.lstrip().startswith(">>>"):
            j = i
            while j < len(lines) and lines[j].strip():
                j += 1
            pad = line[:indent]
            out += [pad + "```pycon", *lines[i:j], pad + "```"]
            i = j
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


class DoctestBlocks(griffe.Extension):
    """Fence bare doctests in every docstring griffe loads."""

    def on_object(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
