"""The format reference ships with the project (#13) and every section the code, errors and docs cite exists."""

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
