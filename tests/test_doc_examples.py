"""Every command and snippet of the documentation runs, so a doc example cannot break silently.

Each ```bash, ```python and ```yaml block of README.md and docs/ carries an HTML comment on the line before it
(invisible on the site) that says how the suite checks it:

- `<!-- test: run -->`: run it. The blocks of a page run in order in one scratch directory, so a page's tour keeps
  its state from block to block; shell blocks with `bash -e` from the repository root (the virtualenv on the PATH),
  Python blocks in their own interpreter, which must exit 0.
- `<!-- test: run spark -->`: a Python block that uses `spark`: run with a local SparkSession bound to it.
- `<!-- test: config -->`: a job configuration (or a part of one): `tank-log config check` must accept it. When its
  first line is a comment naming a file (`# conf/cluster.yaml`), the page's commands that name that file get it.
- `<!-- test: alerts -->`: Prometheus alert rules: every `tank_log_*` metric they use is one tank-log writes (so must
  those of the shipped rules, conf/prometheus/tank-log-alerts.yml).
- `<!-- test: skip: REASON -->`: not run here, and why (a cluster, Airflow's services, the suite itself).

`; setup: exported` after `run` exports the demo base path to the demo table first, and moves its topics' retention
limits out of their broker configs, as docs/guides/retention.md asks of a guarded topic. `; setup: s3` starts the
loopback S3 server (moto), exports the demo base path to `s3://lakehouse/tank/events` there, and gives the page's
blocks its endpoint and credentials as the `AWS_*` variables a user's environment would hold.

Paths of a production host are mapped into the scratch directory: `/tmp/X` → `SCRATCH/X`, `/var/lib/tank` (a demo
base path written by `tank-log demo`), `/var/log/tank-log`, `/var/lib/node_exporter`, and a Delta table at
`s3://lake/...` → the local table `SCRATCH/lake` (the object-storage code path has its own tests on a loopback S3
server).
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

LANGS = {"bash", "sh", "python", "yaml"}
MARKER = re.compile(r"^\s*<!-- test: (run|config|alerts|skip)(.*?)-->\s*$")
FENCE = re.compile(r"^(\s*)```(\w+)")
TIMEOUT_S = 600


@dataclass
class Block:
    page: str
    line: int
    lang: str
    kind: str  # run | config | alerts | skip | "" (no marker)
    options: str
    code: str


def doc_pages() -> list[str]:
    pages = ["README.md"]
    for dirpath, _, names in os.walk(os.path.join(ROOT, "docs")):
        pages += [os.path.relpath(os.path.join(dirpath, n), ROOT) for n in names if n.endswith(".md")]
    return sorted(pages)


def blocks_of(page: str) -> list[Block]:
    lines = Path(ROOT, page).read_text(encoding="utf-8").split("\n")
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if lang in LANGS:
            j = i - 1
            while j >= 0 and not lines[j].strip():
                j -= 1
            marker = MARKER.match(lines[j]) if j >= 0 else None
            body = "\n".join(line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end])
            out.append(
                Block(
                    page,
                    i + 1,
                    lang,
                    marker.group(1) if marker else "",
                    marker.group(2).strip() if marker else "",
                    body + "\n",
                )
            )
        i = end + 1
    return out


ALL = [b for p in doc_pages() for b in blocks_of(p)]
# Pages whose blocks are not marked yet, and why: each must name the tests that exercise its commands meanwhile.
UNMARKED_PAGES = {
    "docs/guides/airflow.md": "its commands need Airflow's services: tests/e2e/test_airflow_services.py runs them",
}


def test_every_doc_block_says_how_it_is_tested():
    """A new example cannot escape the suite: each shell, Python and YAML block has a marker, a skip has a reason."""
    unmarked = [f"{b.page}:{b.line}" for b in ALL if not b.kind and b.page not in UNMARKED_PAGES]
    assert unmarked == []
    no_reason = [f"{b.page}:{b.line}" for b in ALL if b.kind == "skip" and len(b.options.strip(": ")) < 8]
    assert no_reason == []
    run = [b for b in ALL if b.kind == "run"]
    assert len(run) >= 15 and {b.lang for b in run} >= {"bash", "python"}


def _pages_with(kinds: set[str]) -> list[str]:
    return sorted({b.page for b in ALL if b.kind in kinds})


def _is_slow(page: str) -> bool:
    text = "".join(b.code + b.options for b in ALL if b.page == page and b.kind == "run")
    return any(w in text for w in ("spark", "jobs/", "scripts/"))


def _param(page: str) -> object:
    marks = [pytest.mark.slow, pytest.mark.spark] if _is_slow(page) else []
    return pytest.param(page, marks=marks, id=page)


def _mapped(code: str, scratch: Path) -> str:
    """The block with a production host's paths mapped into the scratch directory (in one pass: a mapped path is not
    mapped again)."""
    paths = {
        "s3://lake/tank/events": f"{scratch}/lake",
        "s3://lake/tank": f"{scratch}/lake",
        "/var/lib/tank": f"{scratch}/tank",
        "/var/log/tank-log": f"{scratch}/log",
        "/var/lib/node_exporter": f"{scratch}/node_exporter",
        "/tmp/": f"{scratch}/",
    }
    return re.sub("|".join(re.escape(p) for p in paths), lambda m: paths[m.group(0)], code)


S3_TABLE = "s3://lakehouse/tank/events"  # `setup: s3`: the demo data exported to the loopback S3 server


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=ROOT, NO_COLOR="1", SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    env.update(extra or {})
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def _run(argv: list[str], what: str, cwd: str, env: dict[str, str] | None = None) -> None:
    r = subprocess.run(argv, cwd=cwd, env=_env(env), capture_output=True, text=True, timeout=TIMEOUT_S)
    output = f"--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"
    assert r.returncode == 0, f"{what} exited {r.returncode}\n{output}"


def _setup(
    scratch: Path, page_text: str, options: str, done: set[str], env: dict[str, str], request: pytest.FixtureRequest
) -> None:
    for d in ("log", "node_exporter"):
        (scratch / d).mkdir(exist_ok=True)
    tank = scratch / "tank"
    wants_demo = "/var/lib/tank" in page_text or "conf/cluster.yaml" in page_text or "setup: s3" in options
    if "demo" not in done and wants_demo:
        _run([sys.executable, "-m", "tank_log.tools.cli", "demo", str(tank)], "tank-log demo", ROOT)
        done.add("demo")
    if "setup: exported" in options and "exported" not in done:
        job = os.path.join(ROOT, "jobs", "export_delta.py")
        _run([sys.executable, job, "--data-dir", str(tank), "--table", str(scratch / "lake")], "export", ROOT)
        # what the retention guide asks of a guarded topic: its limits move from the broker's config to the job's
        for config in tank.glob("*/config"):
            kept = [line for line in config.read_text().splitlines() if not line.startswith("log.retention.")]
            config.write_text("".join(line + "\n" for line in kept))
        done.add("exported")
    if "setup: s3" in options and "s3" not in done:
        from conftest import new_bucket

        s3 = request.getfixturevalue("s3_server")
        new_bucket(s3, S3_TABLE.split("/")[2])
        env.update({**s3["env"], "AWS_ENDPOINT_URL": s3["endpoint"], "AWS_ALLOW_HTTP": "true"})
        job = os.path.join(ROOT, "jobs", "export_delta.py")
        _run([sys.executable, job, "--data-dir", str(tank), "--table", S3_TABLE], "export to S3", ROOT, env)
        done.add("s3")


def _configs(page: str, scratch: Path) -> dict[str, str]:
    """The page's config blocks that name their file, merged over a base config for the scratch demo data."""
    files: dict[str, dict[str, object]] = {}
    for b in ALL:
        first = b.code.split("\n", 1)[0]
        if b.page == page and b.kind == "config" and re.match(r"# conf/\S+\.yaml$", first):
            base: dict[str, object] = {"data_dirs": [str(scratch / "tank")], "broker_stopped": True}
            conf = files.setdefault(first[2:], base)
            conf.update(yaml.safe_load(_mapped(b.code, scratch)) or {})
    written = {}
    for name, conf in files.items():
        path = scratch / os.path.basename(name)
        path.write_text(yaml.safe_dump(conf))
        written[name] = str(path)
    return written


@pytest.mark.parametrize("page", [_param(p) for p in _pages_with({"run"})])
def test_doc_page_examples_run(page, tmp_path, request):
    scratch = tmp_path
    text = Path(ROOT, page).read_text(encoding="utf-8")
    configs = _configs(page, scratch)
    done: set[str] = set()
    env: dict[str, str] = {}  # what the setup steps give the page's blocks (`setup: s3`: the S3 server's)

    def code_of(b: Block) -> str:
        _setup(scratch, text, b.options, done, env, request)
        code = _mapped(b.code, scratch)
        for name, path in configs.items():
            code = code.replace(name, path)
        return code

    blocks = [b for b in ALL if b.page == page and b.kind == "run"]
    for spark, run in itertools.groupby(blocks, key=lambda b: b.lang not in ("bash", "sh") and "spark" in b.options):
        group = list(run)
        if spark:  # consecutive Spark blocks share one session (one JVM start: ~15 s a block)
            code = "\n".join(f"print('block at line {b.line}', file=sys.stderr)\n{code_of(b)}" for b in group)
            script = scratch / f"block{group[0].line}.py"
            script.write_text(SPARK_PREAMBLE + code + "\nspark.stop()\n")
            _run([sys.executable, str(script)], f"{page}:{','.join(str(b.line) for b in group)}", str(scratch), env)
            continue
        for b in group:
            code, what = code_of(b), f"{page}:{b.line}"
            if b.lang in ("bash", "sh"):
                _run(["bash", "-e", "-c", code], what, ROOT, env)
            else:
                script = scratch / f"block{b.line}.py"
                script.write_text(code)
                _run([sys.executable, str(script)], what, str(scratch), env)


SPARK_PREAMBLE = textwrap.dedent(
    """\
    import sys
    from pyspark.sql import SparkSession
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    """
)


@pytest.mark.parametrize("block", [pytest.param(b, id=f"{b.page}:{b.line}") for b in ALL if b.kind == "config"])
def test_doc_config_examples_load(block, tmp_path):
    path = tmp_path / "conf.yaml"
    path.write_text(block.code)
    _run([sys.executable, "-m", "tank_log.tools.cli", "config", "check", str(path)], f"{block.page}:{block.line}", ROOT)


SHIPPED_RULES = "conf/prometheus/tank-log-alerts.yml"  # what the docs show of alerts is generated from it


def _alert_blocks() -> list[Block]:
    """The docs' alert rule blocks, and the shipped rules file the monitoring page lists."""
    shipped = Block(SHIPPED_RULES, 1, "yaml", "alerts", "", Path(ROOT, SHIPPED_RULES).read_text(encoding="utf-8"))
    return [b for b in ALL if b.kind == "alerts"] + [shipped]


@pytest.mark.parametrize("block", [pytest.param(b, id=f"{b.page}:{b.line}") for b in _alert_blocks()])
def test_doc_alert_rules_use_real_metrics(block):
    from tank_log import metrics

    names = {m.name for m in metrics.stats_registry([], table="t").collect()}
    names |= {m.name for m in metrics.report_registry({"job": "maintain", "status": "ok"}).collect()}
    rules = yaml.safe_load(block.code)
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    used = {n for e in exprs for n in re.findall(r"\btank_log_\w+", e)}
    assert used and used <= names, used - names
