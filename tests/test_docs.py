"""The documentation holds together: README.md and every docs/**/*.md.

Checked without a network: code fences are balanced, every relative Markdown link
resolves to a file or folder (and, into a Markdown file, to a heading there), README.md
stays a manual (at most 300 lines, the two commands in its first bash block), nothing
points at a folder outside the repository, and the benchmark write-ups in docs/results/
state findings, not work sessions.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").rglob("*.md"))
FILES = [ROOT / "README.md", *DOCS]
RESULTS = sorted((ROOT / "docs" / "results").glob("*.md"))

FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
# [text](target) or [text](target "title"); images too. Nested brackets are not used here.
LINK = re.compile(r"!?\[([^\]]*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def fence_spans(text: str) -> tuple[list[bool], list[tuple[int, str]]]:
    """Per line, whether it is inside (or is) a fenced block; and each fence's opening
    line number and info string. A fence still open at the end is an error (raised)."""
    inside: list[bool] = []
    fences: list[tuple[int, str]] = []
    open_char, open_len, open_line = "", 0, 0
    for number, line in enumerate(text.split("\n"), 1):
        if open_char:
            inside.append(True)
            stripped = line.strip()
            if (len(line) - len(line.lstrip(" ")) <= 3 and stripped
                    and set(stripped) == {open_char} and len(stripped) >= open_len):
                open_char = ""
            continue
        match = FENCE_OPEN.match(line)
        if match and not (match.group(1)[0] == "`" and "`" in match.group(2)):
            open_char, open_len, open_line = match.group(1)[0], len(match.group(1)), number
            fences.append((number, match.group(2).strip()))
            inside.append(True)
            continue
        inside.append(False)
    if open_char:
        raise AssertionError(f"code fence opened on line {open_line} is never closed")
    return inside, fences


def prose_lines(text: str) -> list[tuple[int, str]]:
    """Lines outside fenced blocks, with inline code spans blanked out."""
    inside, _ = fence_spans(text)
    return [(number, INLINE_CODE.sub("``", line))
            for number, (line, fenced) in enumerate(zip(text.split("\n"), inside, strict=True), 1)
            if not fenced]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings (GitHub's, duplicates numbered)."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    inside, _ = fence_spans(path.read_text())
    for line, fenced in zip(path.read_text().split("\n"), inside, strict=True):
        if fenced:
            continue
        match = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> list[tuple[int, str]]:
    links = []
    for number, line in prose_lines(path.read_text()):
        for match in LINK.finditer(line):
            target = match.group(2)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
                continue  # http(s), mailto and other schemes; anchors within the page
            links.append((number, target))
    return links


def test_the_checks_see_an_open_fence_and_a_broken_link(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="line 2"):
        fence_spans("text\n```bash\nspecroute up\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](page.md) [gone](missing.md#x) `[code](no.md)` [web](https://a.b)\n"
                    "```\n[fenced](no.md)\n```\n")
    assert relative_links(page) == [(1, "page.md"), (1, "missing.md#x")]
    assert slug("Live: `specroute bench live`") == "live-specroute-bench-live"
    assert slug("1 → 2 processes") == "1--2-processes"


def test_the_files_are_found() -> None:
    assert (ROOT / "README.md").is_file()
    assert len(DOCS) >= 8 and RESULTS, "docs/*.md and docs/results/*.md"


@pytest.mark.parametrize("path", FILES, ids=_rel)
def test_code_fences_are_balanced(path: Path) -> None:
    fence_spans(path.read_text())
    # and the plain count agrees: every ``` line that opens a block has one that closes it
    ticks = [line for line in path.read_text().split("\n") if line.lstrip(" ").startswith("```")]
    assert len(ticks) % 2 == 0, f"{_rel(path)}: {len(ticks)} lines start with ```"


@pytest.mark.parametrize("path", FILES, ids=_rel)
def test_relative_links_resolve(path: Path) -> None:
    broken = []
    for number, target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve()
        if not resolved.exists():
            broken.append(f"line {number}: {target} (no {resolved})")
            continue
        if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"line {number}: {target} (no heading #{anchor} in {resolved.name})")
    assert not broken, f"{_rel(path)}:\n" + "\n".join(broken)


@pytest.mark.parametrize("path", FILES, ids=_rel)
def test_in_page_anchors_resolve(path: Path) -> None:
    own = anchors(path)
    broken = [f"line {number}: {match.group(2)}"
              for number, line in prose_lines(path.read_text())
              for match in LINK.finditer(line)
              if match.group(2).startswith("#") and match.group(2)[1:] not in own]
    assert not broken, f"{_rel(path)}:\n" + "\n".join(broken)


def test_readme_is_a_manual_of_at_most_300_lines() -> None:
    lines = (ROOT / "README.md").read_text().split("\n")
    if lines and lines[-1] == "":
        lines = lines[:-1]
    assert len(lines) <= 300, f"README.md has {len(lines)} lines"


def test_readme_starts_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    _, fences = fence_spans(text)
    bash = [number for number, info in fences if info.split()[:1] == ["bash"]]
    assert bash, "README.md has no ```bash block"
    body = text.split("\n")[bash[0]:]
    block = body[:next(i for i, line in enumerate(body) if line.strip().startswith("```"))]
    joined = "\n".join(block)
    assert "specroute up" in joined and "bash scripts/test.sh" in joined, joined


OUTSIDE = "/".join(("..", "shared"))  # the folder beside the checkout; spelt so, not named


def test_no_markdown_points_outside_the_repository() -> None:
    offenders = [_rel(path) for path in FILES if OUTSIDE in path.read_text()]
    assert not offenders, offenders


@pytest.mark.parametrize("path", RESULTS, ids=_rel)
def test_results_are_findings_not_session_notes(path: Path) -> None:
    """A write-up names the date and the command, never the work session or a commit."""
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md", path.name), path.name
    text = path.read_text()
    assert not re.search(r"\bsession\s+\d|\bthis session\b", text, re.I), path.name
    hashes = [word for word in re.findall(r"\b[0-9a-f]{7,12}\b", text)
              if re.search(r"[0-9]", word) and re.search(r"[a-f]", word)]
    assert not hashes, f"{path.name}: commit-like hashes {hashes}"
