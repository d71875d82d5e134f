"""What the command line prints: every policy's docs link points at an existing page, bare
`rlpace` says what is missing on stderr, and messages name the argument at fault."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpace import policies
from rlpace.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", policies.names())
def test_every_policy_links_an_existing_page(capsys, name):
    assert main(["policies"]) == 0
    out = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(out) if line.split(" ", 1)[0] == name)
    link = out[at + 2].strip()
    assert link.startswith("docs/methods/") and (ROOT / link).is_file(), link


def test_bare_rlpace_prints_help_and_one_error_line(capsys):
    assert main([]) == 2
    cap = capsys.readouterr()
    assert "usage: rlpace" in cap.out and "simulate" in cap.out
    err = cap.err.strip()
    assert err.startswith("rlpace: error: ") and "\n" not in err and "COMMAND" in err, err
