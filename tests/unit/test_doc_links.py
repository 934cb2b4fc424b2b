"""Every relative Markdown link in README.md and docs/ points at a file that exists: the results pages move
(docs/results/archive/, raw records under docs/results/raw/, compressed ones renamed *.xz), and a link left
behind would send a reader to nothing. Web links and in-page anchors are not checked."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
LINK = re.compile(r"\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")


def markdown_files() -> list[Path]:
    """README.md and every .md under docs/, without following symbolic links (the results folder keeps links
    at raw folders' old names, which would list their files twice)."""
    files = [ROOT / "README.md"]
    for folder, dirs, names in os.walk(ROOT / "docs"):
        dirs.sort()
        files += [Path(folder) / n for n in sorted(names) if n.endswith(".md")]
    return files


def relative_links(text: str) -> list[str]:
    """The targets of the links a Markdown renderer would draw, minus web links and anchors: code blocks and
    code spans are not links."""
    text = CODE_SPAN.sub("", FENCE.sub("", text))
    targets = []
    for match in LINK.finditer(text):
        target = match.group(1).strip("<>")
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue
        targets.append(unquote(target.split("#", 1)[0].split("?", 1)[0]))
    return [t for t in targets if t]


def broken_links(path: Path) -> list[str]:
    """The relative link targets of one file that name no existing file or folder (a leading / is the
    repository's root, as GitHub reads it)."""
    return [t for t in relative_links(path.read_text(encoding="utf-8"))
            if not (ROOT / t.lstrip("/") if t.startswith("/") else path.parent / t).exists()]


def test_every_relative_link_in_the_readme_and_docs_resolves():
    broken = {str(p.relative_to(ROOT)): b for p in markdown_files() if (b := broken_links(p))}
    assert not broken, "links to nothing:\n" + "\n".join(f"  {f}: {', '.join(b)}" for f, b in broken.items())


def test_the_scan_sees_the_links_it_checks():
    """Not vacuous: the README's link to the results index and a results page's link into raw/ are found,
    and what a renderer would not draw as a link is left out."""
    assert "docs/results/README.md" in relative_links((ROOT / "README.md").read_text(encoding="utf-8"))
    pages = (ROOT / "docs/results").glob("*.md")
    assert any(t.startswith("raw/") for p in pages for t in relative_links(p.read_text(encoding="utf-8")))
    sample = ("[a](x.md) [b](https://example.com/y) [c](#anchor) [d](z.md#part \"title\") ![e](<img/f g.png>)\n"
              "`[h](in-a-span.md)`\n```\n[i](in-a-block.md)\n```\n")
    assert relative_links(sample) == ["x.md", "z.md", "img/f g.png"]
