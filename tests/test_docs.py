"""The README is a front page and the documentation site is whole.

The README stays short (≤ 300 lines) with exactly the two set-up commands, the way to reach
the `rlpace` command afterwards and a quick start that runs as written; every page under docs/
is in mkdocs.yml's nav and every nav entry and README link points at a file (and heading) that
exists; every method page `rlpace policies` prints exists; no text cites a tracker a user
cannot open ("issue 14", "#23"), while public references (`huggingface/trl#3708`,
`verl PR #6302`, `AReaL#450`) stay allowed. The full strict site build (`mkdocs build
--strict`, API reference included) is the `test-docs` suite of `make test`; here a copy
without the generated API part checks that the strictness holds.
"""

import io
import re
from contextlib import redirect_stdout
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
SRC = ROOT / "src" / "rlpace"

pytestmark = pytest.mark.skipif(not DOCS.is_dir(), reason="docs/ is not shipped with an installed package")


# ---- the README as a front page ---------------------------------------------------------------
def test_readme_is_at_most_300_lines():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= 300, f"README.md has {n} lines; move sections into docs/ and link them"


def test_readme_names_exactly_the_two_set_up_commands():
    text = README.read_text(encoding="utf-8")
    # every make command the README shows, in backticks or at the start of a code line
    shown = re.findall(r"`make ([a-z][\w-]*)`|^\s*make ([a-z][\w-]*)", text, re.M)
    assert {a or b for a, b in shown} == {"demo", "test"}
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)      # the first shell block
    commands = [ln.split("#")[0].strip() for ln in block.splitlines() if ln.split("#")[0].strip()]
    assert commands == ["make demo", "make test"]


def test_readme_says_how_to_reach_the_rlpace_command():
    # `make` builds .venv but does not activate it: a bare `rlpace` is "command not found".
    text = README.read_text(encoding="utf-8")
    assert ".venv/bin/rlpace --help" in text and "source .venv/bin/activate" in text


def test_readme_quick_start_runs_and_moves_the_mass_to_the_domain_with_signal(tmp_path, monkeypatch, capsys):
    text = README.read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    monkeypatch.chdir(tmp_path)                                  # it writes sched.npz
    scope = {}
    exec(compile(code, "README.md quick start", "exec"), scope)
    # "easy" succeeds 95 % of the time (few informative groups), "hard" 30 %: after 30 steps of
    # 64 prompts the mixture sits on "hard", as the sentence under the block says
    assert scope["sched"].metrics()["domain_prob/hard"] > 0.9
    assert scope["keep"].shape == scope["w"].shape == (64, 8)
    assert (tmp_path / "sched.npz").is_file()


# ---- tracker references -------------------------------------------------------------------------
# Public projects a `#N` or "issue N" may follow ("verl #2791", "verl-recipe PR #125", "AReaL#450");
# a `#N` inside quotes or after ':' or '=' is a colour (`color:#222`, `"#555"`), not a reference.
PUBLIC = r"(?:[\w.-]+/[\w.-]+|verl|verl-recipe|trl|TRL|AReaL|transformers|accelerate|vllm|vLLM|pytorch|torch|deepspeed|DeepSpeed|OpenRLHF|datasets|reasoning-gym)"
_PUBLIC_BEFORE = re.compile(PUBLIC + r"(?:\s+(?:PR|pull|issue))?\s*$")
_TRACKER = re.compile(r"""\bissues?\s+#?\d+|(?<![\w:&/#"'=])#\d+\b|\bitems? \d+(?:,\s*\d+)*\)""", re.I)


def tracker_references(text):
    """(line number, line) of each reference to a tracker a reader cannot open."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        for m in _TRACKER.finditer(line):
            if not _PUBLIC_BEFORE.search(line[:m.start()]):
                out.append((i, line.strip()))
                break
    return out


def test_tracker_pattern_on_hand_written_lines():
    bad = ["the headroom suites (issue 10)", "see #23 for why", "(item 8)", "issues 11, 12",
           "Issue #4 says so", "# per-rollout features (issue 11): only when"]
    good = ["huggingface/trl#3708", "verl PR #6302", "AReaL#450", "(verl #2791)",
            "verl-recipe PR #125", "color:#222", 'stroke="#000"', "an issue with 3 rows", "12 items 3 times"]
    assert [s for s in bad if not tracker_references(s)] == []
    assert [s for s in good if tracker_references(s)] == []


def _offenders(paths):
    return [f"{p.relative_to(ROOT)}:{i}: {line}" for p in paths
            for i, line in tracker_references(p.read_text(encoding="utf-8", errors="replace"))]


def test_no_tracker_references_in_readme_and_docs():
    assert _offenders([README, *sorted(DOCS.rglob("*.md"))]) == []


def test_no_tracker_references_in_code_tests_benchmarks_and_examples():
    # this file alone is left out: its docstring and the hand-written lines above cite a
    # tracker on purpose, as the examples the pattern must catch
    paths = [p for d in (SRC, ROOT / "tests", ROOT / "benchmarks", ROOT / "examples") if d.is_dir()
             for p in sorted(d.rglob("*.py")) if p.resolve() != Path(__file__).resolve()]
    assert paths and _offenders(paths) == []


# ---- the documentation site ---------------------------------------------------------------------
def _nav_pages(node):
    if isinstance(node, str):
        yield node
    elif isinstance(node, list):
        for item in node:
            yield from _nav_pages(item)
    elif isinstance(node, dict):
        for value in node.values():
            yield from _nav_pages(value)


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists():
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = list(_nav_pages(config["nav"]))
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(set(nav)) == pages
    assert len(nav) == len(set(nav))


def _slug(heading):
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_links_point_at_existing_files_and_headings():
    text = README.read_text(encoding="utf-8")
    links = [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+://|#", t)]
    assert links, "the README links no docs page"
    assert [t for t in links if not (ROOT / t.split("#")[0]).exists()] == []
    missing = []
    for link in (t for t in links if "#" in t):
        path, anchor = link.split("#", 1)
        headings = re.findall(r"^#+ (.+)$", (ROOT / path).read_text(encoding="utf-8"), re.M)
        if anchor not in {_slug(h) for h in headings}:
            missing.append(link)
    assert missing == []
    assert _slug("Use with TRL") == "use-with-trl" and _slug("Trust boundary") == "trust-boundary"


def test_every_method_page_rlpace_policies_prints_exists():
    from rlpace.cli import policies as cli_policies
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_policies.run(None) == 0
    pages = set(re.findall(r"docs/methods/[\w.-]+\.md", out.getvalue()))
    assert len(pages) >= 30
    assert sorted(p for p in pages if not (ROOT / p).is_file()) == []


def test_api_reference_fences_bare_doctests_and_leaves_examples_sections():
    pytest.importorskip("griffe")
    import importlib.util
    spec = importlib.util.spec_from_file_location("doctest_blocks", DOCS / "hooks" / "doctest_blocks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    doc = ("Sum.\n\n>>> f(1)\n2\n>>> f(2)\n3\n\nArgs:\n    x: a number.\n\n"
           "Examples:\n    >>> f(3)\n    4\n\n```\n>>> in a fence\n```")
    assert mod.fence_doctests(doc).split("\n") == [
        "Sum.", "", "```pycon", ">>> f(1)", "2", ">>> f(2)", "3", "```", "", "Args:", "    x: a number.",
        "", "Examples:", "    >>> f(3)", "    4", "", "```", ">>> in a fence", "```"]


def _strict_build(tmp_path, change=None):
    """`mkdocs build --strict` of a copy of the site (the API page without its generated part,
    which is slow and tested by the real build), after `change(docs_dir)`; returns (rc, log)."""
    import shutil
    import subprocess
    import sys
    pytest.importorskip("mkdocs")
    root = tmp_path / "repo"
    shutil.copytree(DOCS, root / "docs")
    shutil.copy(ROOT / "mkdocs.yml", root / "mkdocs.yml")
    # the API page without its generated part; the anchors other pages link in it stay
    linked = {m for page in DOCS.rglob("*.md") for m in re.findall(r"api\.md#([\w.]+)", page.read_text(encoding="utf-8"))}
    (root / "docs" / "api.md").write_text("# API reference\n\n" + "".join(f'<a id="{a}"></a>\n' for a in sorted(linked)),
                                          encoding="utf-8")
    if change:
        change(root / "docs")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=root, capture_output=True, text=True, timeout=300)
    return run.returncode, run.stdout + run.stderr


def test_strict_site_build_fails_on_a_broken_link_or_a_page_missing_from_the_nav(tmp_path):
    rc, log = _strict_build(tmp_path / "a")
    assert rc == 0, log
    rc, log = _strict_build(tmp_path / "b", lambda d: (d / "iso.md").open("a").write("\n[gone](no-such-page.md)\n"))
    assert rc != 0 and "no-such-page.md" in log
    rc, log = _strict_build(tmp_path / "c", lambda d: (d / "orphan.md").write_text("# Orphan\n"))
    assert rc != 0 and "orphan.md" in log


def test_api_reference_names_no_private_base_class(tmp_path):
    """`DataPolicy` is built on a private NamedTuple of its fields: the rendered reference shows
    its attributes, never a "Bases: _DataPolicyFields" line a user cannot import."""
    def api_of_data_policy(docs):
        api = docs / "api.md"          # keeps the anchors other pages link
        api.write_text(api.read_text(encoding="utf-8") + "\n::: rlpace.policies.DataPolicy\n", encoding="utf-8")
    rc, log = _strict_build(tmp_path, api_of_data_policy)
    assert rc == 0, log
    html = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    assert "DataPolicy" in html and "kind" in html
    assert "_DataPolicyFields" not in html


def test_api_page_lists_every_name_rlpace_exports():
    import rlpace
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    block = re.search(r"^::: rlpace\n    options:\n      members:\n((?:        - \w+\n)+)", text, re.M).group(1)
    listed = re.findall(r"- (\w+)", block)
    # rlpace.policies has its own section; __version__ is not API to document
    assert sorted(listed) == sorted(set(rlpace.__all__) - {"policies", "__version__"})
    assert "\n::: rlpace.policies\n" in text
