"""The documentation stays inside the repository: every `docs/*.md` that the README or
the docs cite exists here (paths of other projects' docs are written with their
repository in front, `qwen-ane/docs/...`, and are not ours to check)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CITED = re.compile(r"(?<![\w/-])docs/[\w.-]+\.md")


def test_every_cited_doc_exists():
    sources = [REPO / "README.md", *REPO.glob("docs/*.md")]
    missing = {(m, str(src.relative_to(REPO))) for src in sources
               for m in CITED.findall(src.read_text(encoding="utf-8", errors="replace"))
               if not (REPO / m).is_file()}
    assert not missing, sorted(missing)
