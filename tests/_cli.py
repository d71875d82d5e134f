"""Helper shared by the command-line tests."""

from __future__ import annotations

from rlpace.cli import main


def one_line_error(capsys, argv, cmd) -> tuple[str, str]:
    """Run the CLI in-process; assert exit 2 and a single `rlpace <cmd>: error:` line on stderr with
    no traceback; return (that line, stdout)."""
    rc = main(argv)
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert rc == 2, (rc, cap.out[-500:], err)
    assert err.startswith(f"rlpace {cmd}: error: ") and "\n" not in err and "Traceback" not in err, err
    return err, cap.out
