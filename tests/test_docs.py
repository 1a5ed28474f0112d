"""The format reference ships with the project and every section the code, errors and docs cite exists."""

import os
import re
import subprocess
import textwrap

import pytest
from conftest import ROOT, load_script


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


def test_every_cited_benchmark_section_exists():
    """Code and docs cite bench/RESULTS.md sections by name (`bench/RESULTS.md, "Section"`): each is a heading."""
    with open(os.path.join(ROOT, "bench", "RESULTS.md"), encoding="utf-8") as fh:
        headings = {m.group(1) for line in fh if (m := re.match(r"#{2,3} (.+?)(?: \(`bench/.*`\))?$", line))}
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    cited: dict[str, str] = {}
    for f in files:
        if f.startswith("tests/data") or f == "tests/test_docs.py" or not f.endswith((".py", ".pyx", ".md", ".sh")):
            continue
        text = re.sub(r"\s+", " ", open(os.path.join(ROOT, f), encoding="utf-8").read().replace("#", " "))
        for sec in re.findall(r'RESULTS\.md, "([^"]+)"', text):
            cited.setdefault(sec, f)
    missing = {sec: f for sec, f in cited.items() if sec not in headings}
    assert len(cited) >= 5 and not missing, (missing, sorted(headings))


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


def test_the_generated_references_list_every_option_and_key():
    """The site's command-line reference is generated from the parsers: every option of `tank-log`, of each of its
    commands and of every job is on the page; the configuration reference names every top-level key."""
    ref = load_script(os.path.join("scripts", "docs_reference.py"))
    page = ref.cli_reference()
    parsers = {**ref.cli_parsers(), **ref.job_parsers()}
    assert len(parsers) >= 16
    missing = [f"{name} {opt}" for name, p in parsers.items() for opt in ref.options_of(p) if opt not in page]
    assert missing == []
    for name in parsers:
        assert f"### `{name}`" in page
    conf = ref.config_reference()
    from tank_log.jobs.config import TOP_LEVEL_KEYS
    from tank_log.jobs.config.models import Section

    keys = ref.config_keys()
    assert [k for k in keys if f"| `{k}` |" not in conf] == []
    assert set(TOP_LEVEL_KEYS) <= set(keys)
    every_field = {f.alias or n for model in Section.__subclasses__() for n, f in model.model_fields.items()}
    assert every_field == {k.rsplit(".", 1)[-1].removeprefix("brokers[]") for k in keys} - {""}


def readme_docs_commands() -> dict[str, list[str]]:
    """The commands README.md gives for the docs site (`.venv/bin/mkdocs build`, `.venv/bin/mkdocs serve`), by verb."""
    import shlex

    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        found = re.findall(r"`(\.venv/bin/mkdocs (build|serve)\b[^`]*)`", fh.read())
    return {verb: shlex.split(command) for command, verb in found}


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def build_warnings(log: str) -> list[str]:
    """The warnings and errors of an mkdocs log (as it prints them: `WARNING -  ...`), whatever else it prints."""
    return [line for line in ANSI.sub("", log).splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]


def test_the_docs_site_builds_as_the_readme_says(tmp_path):
    """README.md's own build command, run as a user runs it (nothing hidden: no `--quiet`), builds the site with no
    warning at all: every page of the nav exists, every link and anchor resolves (mkdocs.yml is strict, so any
    warning also aborts the build), the generated pages build (the library reference with a heading for every public
    name), the Mermaid diagrams are there."""
    commands = readme_docs_commands()
    assert set(commands) == {"build", "serve"}, commands
    build = commands["build"]
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as fh:
        assert re.search(r"^strict: true$", fh.read(), re.M)  # the README's command is strict without --strict
    r = subprocess.run([*build, "-d", str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and build_warnings(r.stderr + r.stdout) == [], r.stderr[-3000:]
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "--keep-unexported" in cli and "--metrics-file" in cli
    assert 'class="mermaid"' in (tmp_path / "site" / "operations" / "crash-safety" / "index.html").read_text()
    library = (tmp_path / "site" / "reference" / "library" / "index.html").read_text()
    import tank_log

    headed = set(re.findall(r'<h4 id="[^"]*"><code>([^<]+)</code>', library))
    assert [name for name in tank_log.__all__ if name not in headed] == []


@pytest.mark.slow
def test_the_docs_site_serves_as_the_readme_says(tmp_path):
    """README.md's `mkdocs serve` builds the site with no warning and serves its home page."""
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*readme_docs_commands()["serve"], "--dev-addr", f"127.0.0.1:{port}"],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 300
        page = ""
        while not page:
            assert proc.poll() is None, f"mkdocs serve exited {proc.returncode}: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"mkdocs serve did not serve: {log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as resp:
                    page = resp.read().decode()
            except OSError:
                time.sleep(0.5)
        assert "<title>" in page
        assert build_warnings(log.read_text()) == [], log.read_text()[-3000:]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_build_warnings_are_found_in_a_log_as_mkdocs_prints_it():
    log = "INFO    -  Cleaning site directory\n\x1b[33mWARNING \x1b[0m -  Doc file 'a.md' contains a link '#x'\n"
    assert build_warnings(log) == ["WARNING  -  Doc file 'a.md' contains a link '#x'"]
    assert build_warnings(" │  To disable this warning, set NO_MKDOCS_2_WARNING=1.\n") == []


def test_the_library_reference_gives_every_public_name_its_signature_and_docstring():
    """The generated API section: each name of `tank_log.__all__` once, with a signature and a docstring of its own
    (not the one dataclasses make from the fields)."""
    import tank_log

    ref = load_script(os.path.join("scripts", "docs_reference.py"))
    page = ref.library_reference()
    sections = re.split(r"^#### ", page, flags=re.M)[1:]
    names = [section.split("`")[1] for section in sections]
    assert names == [n for _, group in ref.library_groups() for n in group]
    assert sorted(names) == sorted(tank_log.__all__)
    for name, section in zip(names, sections, strict=True):
        signature, doc = section.split("```python\n", 1)[1].split("\n```\n", 1)
        assert name in signature
        assert doc.strip() and not doc.strip().startswith(f"{name}("), name


def test_the_configuration_reference_spells_defaults_as_yaml_does():
    """Sizes and durations appear as a config file would write them (`256mb`, `12h`), and each spelled default loads
    back to the value the model holds."""
    from tank_log.jobs.config.units import duration_ms, size_bytes

    ref = load_script(os.path.join("scripts", "docs_reference.py"))
    spell_duration, spell_size = ref.spell_duration, ref.spell_size
    conf = ref.config_reference()
    assert "| `compaction.key_state_budget` | `256mb` |" in conf
    assert "| `export.orphan_horizon` | `12h` |" in conf
    assert "| `live_window` | `5min` |" in conf
    assert "268435456" not in conf and "43200000" not in conf
    for n in (0, 1, 1023, 1024, 64 << 10, 256 << 20, 3 << 30, (1 << 30) + 1):
        assert size_bytes(spell_size(n)) == n
    for s in (0, 1, 59, 60, 300, 43200, 86400 * 7, 86401):
        assert duration_ms(spell_duration(s)) == s * 1000


def test_the_configuration_example_fits_the_page_and_reads_the_same():
    """The reference's example config is wrapped to the docs' code width, and still loads to the same values."""
    import yaml

    from tank_log.jobs import config

    ref = load_script(os.path.join("scripts", "docs_reference.py"))
    HELP_COLUMNS = ref.HELP_COLUMNS
    page = ref.config_reference()
    shown = page.split("## An example with every section", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    assert max(len(line) for line in shown.split("\n")) <= HELP_COLUMNS
    original = (config.__doc__ or "").split("\n\n", 2)[-1]
    assert yaml.safe_load(shown) == yaml.safe_load(textwrap.dedent(original))


def test_the_monitoring_page_shows_the_alerts_and_metrics_that_ship(tmp_path):
    """docs/operations/monitoring.md's alert list and metric tables are generated when the site is built, from the
    shipped rules (conf/prometheus/tank-log-alerts.yml) and the metrics tank-log writes (tank_log/metrics.py): every
    alert with its severity and its query as the file has it, every metric (those the alerts use among them), and no
    hand-copied rule or metric row beside them that could drift."""
    import shutil

    import yaml

    from tank_log import metrics

    ref = load_script(os.path.join("scripts", "docs_reference.py"))
    with open(os.path.join(ROOT, "docs", "operations", "monitoring.md"), encoding="utf-8") as fh:
        page = fh.read()
    assert ref.METRICS in page and ref.ALERTS in page
    assert not re.search(r"^\s*- alert:|^\| `tank_log_", page, re.M)

    with open(os.path.join(ROOT, "conf", "prometheus", "tank-log-alerts.yml"), encoding="utf-8") as fh:
        rules = [r for g in yaml.safe_load(fh)["groups"] for r in g["rules"] if "alert" in r]
    alerts = ref.alerts_reference()
    assert len(rules) == 6
    assert re.findall(r"^#### `(\w+)`$", alerts, re.M) == [r["alert"] for r in rules]
    shown = re.findall(r"^```text\n(.*?)\n```$", alerts, re.M | re.S)
    assert ["".join(q.split()) for q in shown] == ["".join(r["expr"].split()) for r in rules]
    for rule in rules:
        assert f"| [`{rule['alert']}`](#{rule['alert'].lower()}) | {rule['labels']['severity']} |" in alerts
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not on the PATH: scripts/setup.sh installs it (Debian's prometheus)"
    as_shown = {"groups": [{"name": "shown", "rules": [{**r, "expr": q} for r, q in zip(rules, shown, strict=True)]}]}
    path = tmp_path / "shown-rules.yml"
    path.write_text(yaml.safe_dump(as_shown))
    r = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr  # the wrapped queries are still the rules' queries

    written = {m.name for m in metrics.stats_registry([], table="t").collect()}
    written |= {m.name for m in metrics.report_registry({"job": "maintain", "status": "ok"}).collect()}
    tables = ref.metrics_tables()
    listed = re.findall(r"^\| `(tank_log_\w+)` \|", tables, re.M)
    assert len(listed) == len(set(listed)) and set(listed) == written
    used = {name for rule in rules for name in re.findall(r"\btank_log_\w+", rule["expr"])}
    assert used and used <= set(listed), used - set(listed)


# a selector on the metrics' own `job` label as the files write it: a tank-log job's name (not a scrape job's: `node`)
TANK_LOG_JOB_SELECTOR = re.compile(
    r"tank_log_\w+\{[^}]*(?<!exported_)\bjob\s*(?:=|!=|=~|!~)\s*\"(?:maintain|compact|retention|export|import|rebuild|tank-log)"
)
# what makes a line or code span a PromQL query rather than a sample of a metrics file: an operator, a function, a
# range or an offset
PROMQL = re.compile(
    r"\s(?:[<>]=?|==|[-+*/]|and|or|unless)\s|\b(?:rate|increase|sum|max|min|avg|count|time|resets|absent)\s*\("
    r"|\[\d+[smhdw]\]|\boffset\b|^\s*expr:"
)


def job_label_queries(text: str) -> list[str]:
    """The queries of a page (lines of its code blocks, inline code spans) that select a tank-log job by `job`."""
    found = []
    in_fence = False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        pieces = [line] if in_fence else re.findall(r"`([^`]+)`", line)
        found += [p for p in pieces if TANK_LOG_JOB_SELECTOR.search(p) and PROMQL.search(p)]
    return found


def test_no_doc_selects_the_tank_log_job_by_its_scraped_away_label():
    """On scrape the metrics' own `job` label becomes `exported_job` (Prometheus' default honor_labels: false): a
    query with `job="maintain"` matches nothing. (A metrics file's own samples do carry `job`: they may show it.)"""
    old = 'time() - tank_log_job_last_success_timestamp_seconds{job="maintain"} > 26 * 3600'
    assert job_label_queries(f"```yaml\nexpr: >-\n  {old}\n```") == [f"  {old}"]
    assert job_label_queries('the file: `tank_log_job_partitions{job="export_delta",status="ok"}`') == []
    found = []
    for dirpath, _, names in os.walk(os.path.join(ROOT, "docs")):
        for name in names:
            if name.endswith(".md"):
                with open(os.path.join(dirpath, name), encoding="utf-8") as fh:
                    found += [f"{name}: {q}" for q in job_label_queries(fh.read())]
    assert found == []


MAX_CELL = 500  # characters of one table cell's source: more is a paragraph, which reads better below the table


def test_no_table_cell_is_a_wall_of_text():
    """A table cell of many sentences (650-1,100 characters) squeezed into a column is hard to read: its content goes
    in paragraphs or a list below the table, and the cell points there."""
    long = []
    for dirpath, _, names in os.walk(os.path.join(ROOT, "docs")):
        for name in names:
            if not name.endswith(".md") or "assets" in dirpath:
                continue
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8") as fh:
                for n, line in enumerate(fh, 1):
                    if line.startswith("|"):
                        cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
                        long += [f"{os.path.relpath(path, ROOT)}:{n}: {len(c)}" for c in cells if len(c) > MAX_CELL]
    assert long == []
