"""Every relative link in the README, the docs and the result cards resolves: to a file or
folder of the repository, and, with a #fragment, to a heading of that page (GitHub's anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.doc_commands import DOC_FILES as PAGES  # the pages whose commands are checked too

ROOT = Path(__file__).resolve().parent.parent
# [text](target) and ![alt](target), skipping code spans; a target ends at a space or ")".
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def github_anchor(heading: str) -> str:
    """GitHub's slug: lower case, punctuation dropped (hyphens and underscores kept), each
    space a hyphen."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in CODE.sub("", page.read_text(encoding="utf-8")).splitlines():
        if match := re.match(r"#{1,6}\s+(.*)", line):
            slug = github_anchor(match.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def relative_links(page: Path) -> list[str]:
    text = CODE.sub("", page.read_text(encoding="utf-8"))
    return [target for target in LINK.findall(text)
            if not re.match(r"[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: ...


def test_the_pages_are_found():
    names = {str(page.relative_to(ROOT)) for page in PAGES}
    assert {"README.md", "docs/architecture.md", "cards/glue.md",
            "cards/README.md"} <= names
    assert len(names) == len(list(ROOT.glob("docs/*.md")) + list(ROOT.glob("cards/*.md"))) + 1
    assert sum(len(relative_links(page)) for page in PAGES) > 50


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in relative_links(page):
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file):
            broken.append(f"{target} (no heading #{fragment} in {file.name})")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_anchors_follow_github():
    assert github_anchor("The lean step on one H100") == "the-lean-step-on-one-h100"
    assert github_anchor("`make bench-step`: the host's cost") == "make-bench-step-the-hosts-cost"
    assert github_anchor("Speed & memory (GPU)") == "speed--memory-gpu"
