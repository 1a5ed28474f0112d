"""The format reference ships with the project and every section the code, errors and docs cite exists."""

import os
import re
import subprocess

from conftest import ROOT


def test_every_cited_section_of_docs_format_exists():
    headings = set()
    for line in open(os.path.join(ROOT, "docs", "FORMAT.md")):
        m = re.match(r"#{2,3} (\d+(?:\.\d+)?)\.? ", line)
        if m:
            headings.add(m.group(1))
        item = re.match(r"(\d+)\. ", line)  # the numbered pitfalls of §11 (§11.N)
        if item:
            headings.add(f"11.{item.group(1)}")
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    cited: dict[str, str] = {}
    for f in files:
        if f.startswith("tests/data") or not f.endswith((".py", ".md", ".yaml", ".sh")):
            continue
        for sec in re.findall(r"§(\d+(?:\.\d+)?)", open(os.path.join(ROOT, f), encoding="utf-8").read()):
            cited.setdefault(sec, f)
    missing = {sec: f for sec, f in cited.items() if sec not in headings}
    assert len(cited) > 30 and not missing, missing


def test_no_internal_milestone_names():
    """Code, tests and docs cite reasons, benchmark sections and docs/FORMAT.md sections, never the team's internal
    milestones or issue numbers, which a reader of the repository cannot follow."""
    import re
    import subprocess

    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    pattern = re.compile(r"\bstop \d+\b|(?<![\w/-])#\d{1,3}(\.\d+)?\b|\bissues? #?\d+\b", re.IGNORECASE)
    found = []
    for name in files:
        if name.startswith("tests/data/") or not name.endswith((".py", ".pyx", ".md", ".sh", ".yaml", ".toml")):
            continue
        with open(os.path.join(ROOT, name), encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if pattern.search(line.replace("delta-io/delta-rs#", "")):
                    found.append(f"{name}:{n}: {line.strip()[:100]}")
    assert found == []
