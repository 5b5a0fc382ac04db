"""The project's documents stand on their own in a clone: the design is in docs/design.md,
linked from the README, and nothing points outside the repository (such as ../shared)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_readme_links_the_design_and_nothing_outside_the_repository() -> None:
    readme = (REPO / "README.md").read_text()
    assert "(docs/design.md)" in readme
    design = (REPO / "docs" / "design.md").read_text()
    for heading in ("## The parts", "## The rules (invariants)", "## The wire",
                    "## What happens when something fails"):
        assert heading in design
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
                REPO / "deploy" / "README.md"]:
        text = doc.read_text()
        assert "../shared" not in text and "shared/DESIGN" not in text, doc
        for target in re.findall(r"\]\(([^)#\s]+)", text):
            if not re.match(r"[a-z]+://", target):
                assert (doc.parent / target).exists(), f"{doc.name} links {target}"
