"""mkdocs hooks: the reference pages generated from the code (scripts/docs_reference.py) join the site's files, and
every page's prose gets its links: each "§N" citation of the format reference links to that section, and the first
use of each glossary term on a page links to its definition in docs/glossary.md."""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from markdown.extensions.toc import slugify
from mkdocs.structure.files import File

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # docs_reference.py, beside this file

from docs_reference import (  # noqa: E402
    ALERTS,
    LIBRARY_API,
    METRICS,
    alerts_reference,
    cli_reference,
    config_reference,
    library_reference,
    metrics_tables,
)

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
GLOSSARY = "glossary.md"
FORMAT = "FORMAT.md"
NOT_GLOSSED = {GLOSSARY, FORMAT, "reference/benchmarks.md"}

# What is never rewritten inside a line: inline code, links and images, HTML tags and comments, URLs, footnote refs.
PROTECTED = re.compile(
    r"(``.+?``|`[^`]*`|!?\[[^\]]*\]\([^)]*\)|!?\[[^\]]*\]\[[^\]]*\]|<!--.*?-->|<[^>\n]+>|https?://\S+|\[\^[^\]]+\])"
)
SECTION = re.compile(r"(?:docs/FORMAT\.md,?\s+)?§(\d+)(\.\d+)?((?:\s+rules?\s+\d+(?:\s*(?:,|and|–|-)\s*\d+)*))?")
FENCE = re.compile(r"^\s*(```|~~~)")


def on_files(files: Any, config: Any) -> Any:
    for path, text in (("reference/cli.md", cli_reference()), ("reference/configuration.md", config_reference())):
        files.append(File.generated(config, path, content=text))
    return files


def format_anchors() -> dict[str, str]:
    """Section number ("6.2", "11") → the anchor of its heading in docs/FORMAT.md."""
    anchors = {}
    with open(os.path.join(DOCS, FORMAT), encoding="utf-8") as fh:
        for line in fh:
            m = re.match(r"#{2,3} ((\d+(?:\.\d+)?)\.? .*)$", line.rstrip("\n"))
            if m:
                anchors[m.group(2)] = slugify(re.sub(r"[`*]", "", m.group(1)), "-")
    return anchors


def glossary_terms() -> list[tuple[str, str]]:
    """(term, anchor) of every `### Term` of the glossary, longest first (so "sparse bundle" wins over "bundle")."""
    terms = []
    with open(os.path.join(DOCS, GLOSSARY), encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("### "):
                title = line[4:].strip()
                terms.append((title.strip("`"), slugify(re.sub(r"[`*]", "", title), "-")))
    return sorted(terms, key=lambda t: -len(t[0]))


def _term_pattern(terms: list[tuple[str, str]]) -> re.Pattern[str]:
    words = [r"\s+".join(re.escape(w) for w in term.split()) for term, _ in terms if not term.startswith(".")]
    return re.compile(r"(?<![\w./-])(" + "|".join(words) + r")(?:e?s)?(?![\w-])", re.IGNORECASE)


def link_prose(markdown: str, src_uri: str) -> str:
    """The page's markdown with its "§N" citations and the first use of each glossary term linked."""
    here = os.path.dirname(src_uri)
    fmt = "" if src_uri == FORMAT else os.path.relpath(FORMAT, here).replace(os.sep, "/")
    glossary = os.path.relpath(GLOSSARY, here).replace(os.sep, "/")
    anchors = format_anchors()
    terms = glossary_terms() if src_uri not in NOT_GLOSSED else []
    by_name = {term.lower(): anchor for term, anchor in terms}
    pattern = _term_pattern(terms) if terms else None
    linked: set[str] = set()

    def section(m: re.Match[str]) -> str:
        number = m.group(1) + (m.group(2) or "")
        anchor = anchors.get(number) or anchors.get(m.group(1))
        if anchor is None:
            return m.group(0)
        text = re.sub(r"^docs/FORMAT\.md,?\s+", "format reference ", m.group(0))
        return f"[{text}]({fmt}#{anchor})"

    def term(m: re.Match[str]) -> str:
        key = re.sub(r"\s+", " ", m.group(1)).lower()
        if key in linked or key not in by_name:
            return m.group(0)
        linked.add(key)
        return f"[{m.group(0)}]({glossary}#{by_name[key]})"

    def free_text(text: str) -> str:
        pieces = []
        last = 0
        for m in SECTION.finditer(text):
            pieces.append(("text", text[last : m.start()]))
            pieces.append(("link", section(m)))
            last = m.end()
        pieces.append(("text", text[last:]))
        out = []
        for kind, piece in pieces:
            if kind == "text" and pattern is not None:
                piece = pattern.sub(term, piece)
            out.append(piece)
        return "".join(out)

    lines = markdown.split("\n")
    in_fence = False
    for i, line in enumerate(lines):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence or line.lstrip().startswith(("#", "--8<--")):
            continue
        chunks = PROTECTED.split(line)
        lines[i] = "".join(c if n % 2 else free_text(c) for n, c in enumerate(chunks))
    return "\n".join(lines)


def host_slug(heading: str) -> str:
    """The anchor a Git host (GitHub, GitLab) gives a heading: lower case, punctuation dropped, each space a hyphen,
    hyphens kept as they are ("(`bench/fleet.py --tank`)" → "benchfleetpy---tank")."""
    text = re.sub(r"[^\w\- ]", "", re.sub(r"[`*]", "", heading).lower())
    return text.replace(" ", "-")


def site_anchors(markdown: str) -> str:
    """An included file's links to its own headings, from the anchors a Git host gives them (the file is read there
    too) to the ones this site's table of contents gives them, which collapse runs of hyphens."""
    for line in markdown.split("\n"):
        m = re.match(r"#{1,6} (.+?)\s*$", line)
        if m and host_slug(m.group(1)) != (ours := slugify(re.sub(r"[`*]", "", m.group(1)), "-")):
            markdown = markdown.replace(f"](#{host_slug(m.group(1))})", f"](#{ours})")
    return markdown


def inline_snippets(markdown: str) -> str:
    """A page that is a whole-file include (`--8<-- "bench/RESULTS.md"`) gets the file's text here, so its prose is
    linked like any page's, and its links to its own headings find them (`site_anchors`)."""
    root = os.path.dirname(DOCS)

    def include(m: re.Match[str]) -> str:
        with open(os.path.join(root, m.group(1)), encoding="utf-8") as fh:
            return site_anchors(fh.read())

    return re.sub(r'^--8<-- "([^"]+)"$', include, markdown, flags=re.MULTILINE)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if LIBRARY_API in markdown:  # reference/library.md: its prose, then the public API from the code
        markdown = markdown.replace(LIBRARY_API, library_reference())
    if METRICS in markdown or ALERTS in markdown:  # operations/monitoring.md: from tank_log/metrics.py, conf/prometheus
        markdown = markdown.replace(METRICS, metrics_tables()).replace(ALERTS, alerts_reference())
    return link_prose(inline_snippets(markdown), page.file.src_uri)
