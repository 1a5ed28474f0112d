"""The docs site's reference pages, generated from the code when the site is built (never copied by hand): every
option of `tank-log` and of every job from their argument parsers, and the job configuration from its models.

Part of the docs' build (scripts/mkdocs_hooks.py loads it), not of the library: it imports both tank_log and
tank_spark, which the library itself never does."""

from __future__ import annotations

import argparse
import json
import os
import re
import typing
from typing import Any

from tank_log.jobs import config

PIPE = "\\|"  # a literal | inside a Markdown table cell


def job_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each job's full parser, as `jobs/<job>.py --help` builds it."""
    from tank_spark import compact, import_delta, maintain, rebuild_indexes, retention
    from tank_spark.export import plan
    from tank_spark.job_options import job_parser

    modules = {
        "maintain": maintain,
        "compact": compact,
        "retention": retention,
        "rebuild_indexes": rebuild_indexes,
        "export_delta": plan,
        "import_delta": import_delta,
    }
    out = {}
    for job, module in modules.items():
        parser = job_parser(job, (module.__doc__ or "").strip().split("\n\n")[0])
        module.add_options(parser)
        out[job] = parser
    return out


def cli_parsers() -> dict[str, argparse.ArgumentParser]:
    """`tank-log` and each of its commands."""
    from tank_log.tools.cli import build_parser

    top = build_parser()
    out = {"tank-log": top}
    for action in top._actions:  # argparse keeps its subcommands here; there is no public accessor
        if isinstance(action, argparse._SubParsersAction):
            out.update({f"tank-log {name}": sub for name, sub in action.choices.items()})
    return out


def options_of(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string and positional of a parser (not its subcommands)."""
    out = []
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            continue
        out += list(a.option_strings) or [a.dest]
    return out


HELP_COLUMNS = 78  # the same wrapping on every machine, and within the docs site's content column on a laptop


def _help(parser: argparse.ArgumentParser) -> str:
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(HELP_COLUMNS)
    try:
        return parser.format_help()
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def cli_reference() -> str:
    lines = [
        "# Command line and job options",
        "",
        "Generated from the argument parsers when the site is built: what `--help` prints.",
        "",
        "## tank-log",
        "",
    ]
    for name, parser in cli_parsers().items():
        lines += [f"### `{name}`", "", "```text", _help(parser).rstrip(), "```", ""]
    lines += [
        "## Jobs",
        "",
        "`spark-submit jobs/<job>.py …`, `python jobs/<job>.py …` or `python -m tank_spark.entry_points.<job> …`.",
        "",
    ]
    for job, parser in job_parsers().items():
        lines += [f"### `{job}`", "", "```text", _help(parser).rstrip(), "```", ""]
    return "\n".join(lines)


def config_keys() -> list[str]:
    """Every key path of the job configuration (`compaction.topics.<topic>.policy`, `brokers[].name`)."""
    return [path for path, _, _ in _config_rows()]


def _config_rows() -> list[tuple[str, str, str]]:
    """(key path, default, description) of every field of the configuration models, depth first."""
    import typing

    from pydantic import BaseModel

    from tank_log.jobs.config import JobConfig

    def inner(annotation: Any) -> tuple[type[BaseModel] | None, str]:
        """The model inside an annotation, and how its keys continue the path (`.`, `.<topic>.`, `[].`)."""
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return annotation, "."
        origin = typing.get_origin(annotation)
        for arg in typing.get_args(annotation):
            model, _ = inner(arg)
            if model is not None:
                suffix = ".<topic>." if origin is dict else "[]." if origin is tuple else "."
                return model, suffix
        return None, "."

    rows: list[tuple[str, str, str]] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            key = prefix + (field.alias or name)
            sub, suffix = inner(field.annotation)
            if sub is not None and sub is not model:
                rows.append((key, "", (sub.__doc__ or "").strip().split("\n")[0]))
                walk(sub, key + suffix)
                continue
            default = "" if field.is_required() else _yaml_default(field)
            rows.append((key, default, field.description or ""))

    walk(JobConfig, "")
    return rows


def config_reference() -> str:
    sample = (config.__doc__ or "").split("\n\n", 2)
    lines = [
        "# Configuration reference",
        "",
        "Generated from the configuration models (`tank_log/jobs/config/models.py`) when the site is built. One YAML",
        "format for every job, validated at load: unknown keys and bad values are errors naming the key path;",
        "durations and sizes use the broker's grammar (`30s`, `15min`, `7days`; `64kb`, `1gb`; a bare number is",
        "seconds or bytes), and the defaults below are spelled that way too; flags override the file; relative",
        "paths are relative to the file. `tank-log config schema` prints the JSON Schema (for editors).",
        "",
        "| key | default | meaning |",
        "|---|---|---|",
    ]
    for key, default, meaning in _config_rows():
        shown = f"`{default}`" if default else ""
        lines.append(f"| `{key}` | {shown} | {meaning.replace('|', PIPE)} |")
    lines += [
        "",
        "## An example with every section",
        "",
        "```yaml",
        _fit_yaml([line[4:] if line.startswith("    ") else line for line in sample[-1].strip("\n").split("\n")]),
        "```",
        "",
    ]
    return "\n".join(lines)


def _fit_yaml(lines: list[str], width: int = HELP_COLUMNS) -> str:
    """YAML lines within `width`, read the same: trailing comments go on their own lines above their key, and a long
    flow mapping continues on the next lines."""
    import textwrap

    out = []
    for line in lines:
        code, sep, comment = line.partition("  # ")
        indent = code[: len(code) - len(code.lstrip())]
        if sep and code.strip():
            out += textwrap.wrap(comment.strip(), width, initial_indent=indent + "# ", subsequent_indent=indent + "# ")
            line = code.rstrip()
        brace = line.find("{")
        if len(line) > width and brace > 0 and line.endswith("}"):
            out += textwrap.wrap(line, width, subsequent_indent=" " * (brace + 1), break_on_hyphens=False)
        else:
            out.append(line)
    return "\n".join(out)


def _yaml_default(field: Any) -> str:
    """A field's default as a YAML file would spell it: sizes and durations in the broker's units (`256mb`, `7days`,
    `12h`), not the bytes, seconds or milliseconds the model holds."""
    from tank_log.jobs.config.units import DURATION_HELP, SIZE_HELP, duration_ms

    value = field.get_default(call_default_factory=True)
    helps = [getattr(m, "json_schema", {}).get("description") for m in field.metadata]
    if isinstance(value, int) and not isinstance(value, bool):
        if SIZE_HELP in helps:
            return spell_size(value)
        if DURATION_HELP in helps:
            millis = any(getattr(m, "func", None) is duration_ms for m in field.metadata)
            return spell_duration(value // 1000 if millis else value)
    return _yaml_value(value)


def spell_size(n: int) -> str:
    """Bytes in the largest unit of the broker's size grammar that holds them exactly: 268435456 → `256mb`."""
    for unit, size in (("gb", 1 << 30), ("mb", 1 << 20), ("kb", 1 << 10)):
        if n and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}b" if n else "0"


def spell_duration(seconds: int) -> str:
    """Seconds in the largest unit of the broker's duration grammar that holds them exactly: 43200 → `12h`."""
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s" if seconds else "0"


def _yaml_value(value: object) -> str:
    """A default as the YAML file spells it: null, false, [], {}, a bare string."""
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str)


ENUM_REPR = re.compile(r"<(\w+\.\w+): [^>]*>")  # an enum member's repr, as its source spells it: SnappyPolicy.NEVER
LIBRARY_API = "<!-- the public API: generated from tank_log.__all__ by scripts/docs_reference.py -->"


def library_groups() -> list[tuple[str, list[str]]]:
    """`tank_log.__all__` by the groups `tank_log/__init__.py` declares them in: (its comment, the names)."""
    import tank_log

    groups: list[tuple[str, list[str]]] = [("the package", ["__version__"])]
    with open(tank_log.__file__, encoding="utf-8") as fh:
        source = fh.read()
    body = source[source.index("_EXPORTS = {") : source.index("\n}\n")]
    for line in body.splitlines()[1:]:
        line = line.strip()
        if line.startswith("# "):
            groups.append((line[2:], []))
        elif line.startswith('"'):
            groups[-1][1].append(line.split('"')[1])
    return groups


class _Annotation:
    """An annotation as its source spells it (the modules use `from __future__ import annotations`)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _annotation(annotation: Any) -> Any:
    """A string or forward reference as the source spells it; anything else as it is."""
    if isinstance(annotation, typing.ForwardRef):
        return _Annotation(annotation.__forward_arg__)
    return _Annotation(annotation) if isinstance(annotation, str) else annotation


def _default(value: Any) -> Any:
    """A default that is its class's own default instance as `Class()`; anything else as it is."""
    kind = type(value)
    try:
        plain = kind.__module__ != "builtins" and value == kind()
    except Exception:  # a class that needs arguments, or compares otherwise
        plain = False
    return _Annotation(f"{kind.__name__}()") if plain else value


def _signature(name: str, obj: object, width: int = 80) -> str:
    """`name(parameters)` as Python declares it (a class: its constructor), or `name = value`; one parameter a line
    when it is wider than `width`."""
    import inspect

    if not callable(obj):
        return f"{name} = {obj!r}"
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return f"{name}(...)"
    params = [
        p.replace(annotation=_annotation(p.annotation), default=_default(p.default)) for p in sig.parameters.values()
    ]
    ret = inspect.Signature.empty if inspect.isclass(obj) else sig.return_annotation
    sig = sig.replace(parameters=params, return_annotation=_Annotation(ret) if isinstance(ret, str) else ret)
    head = f"{'class ' if inspect.isclass(obj) else ''}{name}"
    text = ENUM_REPR.sub(r"\1", f"{head}{sig}")
    if len(text) <= width or not params:
        return text
    returns = "" if sig.return_annotation is inspect.Signature.empty else f" -> {sig.return_annotation!r}"
    lines, star = [], False
    for p in params:
        if p.kind is p.KEYWORD_ONLY and not star:
            lines.append("    *,")
            star = True
        star = star or p.kind is p.VAR_POSITIONAL
        lines.append(f"    {p},")
    return ENUM_REPR.sub(r"\1", f"{head}(\n" + "\n".join(lines) + f"\n){returns}")


def _docstring(obj: object) -> str:
    """A docstring as Markdown: paragraphs joined, an indented block (`Raises:` entries, examples) as a list."""
    import inspect

    doc = inspect.getdoc(obj) or ""
    out: list[str] = []
    for para in doc.split("\n\n"):
        lines = para.splitlines()
        if lines and lines[-1].endswith("::"):
            lines[-1] = lines[-1][:-1]
        head = [ln for ln in lines if not ln.startswith(" ")]
        items: list[str] = []  # the indented lines, a more indented one continuing the item above it
        indent = None
        for ln in lines:
            if not ln.startswith(" "):
                continue
            depth = len(ln) - len(ln.lstrip())
            if indent is None or depth <= indent or not items:
                indent = depth if indent is None else min(indent, depth)
                items.append(ln.strip().removeprefix("- "))
            else:
                items[-1] += " " + ln.strip()
        if head:
            out.append(" ".join(head))
        if items:
            out.append("\n".join(f"- {item}" for item in items))
    return "\n\n".join(out)


def library_reference() -> str:
    """The library's public API: every name of `tank_log.__all__` with its signature and docstring, by group."""
    import tank_log

    parts = []
    for title, names in library_groups():
        parts.append(f"### {title[0].upper()}{title[1:]}\n")
        for name in names:
            obj = getattr(tank_log, name)
            doc = _docstring(obj) if name != "__version__" else "The package's version; job reports record it."
            parts.append(f"#### `{name}`\n\n```python\n{_signature(name, obj)}\n```\n")
            if doc:
                parts.append(doc + "\n")
    return "\n".join(parts)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALERT_RULES = os.path.join("conf", "prometheus", "tank-log-alerts.yml")
METRICS = "<!-- the metrics: generated from tank_log/metrics.py by scripts/docs_reference.py -->"
ALERTS = "<!-- the alert rules: generated from conf/prometheus/tank-log-alerts.yml by scripts/docs_reference.py -->"
LABEL = re.compile(r"\{\{\s*\$labels\.(\w+)\s*\}\}")


def metric_families() -> dict[str, list[tuple[str, tuple[str, ...], str]]]:
    """(name, labels, help) of every metric tank-log writes, by what writes it: "run" (every job's and command's
    `--metrics-file`, from its report) and "data" (`tank-log stats`, with an export table). Taken from the registries
    `tank_log.metrics` builds, fed a run and a partition that set every metric."""
    from tank_log import metrics
    from tank_log.tools.stats import PartitionStats

    report = {
        "job": "maintain",
        "status": "ok",
        "duration_s": 1,
        "summary": {"by_status": {"ok": 1}},
        "partitions": [
            {
                "topic": "t",
                "partition": 0,
                "status": "data-loss",
                "kept_unexported": {"table": "t", "bytes": 1, "max_bytes": 2},
            }
        ],
    }
    row = PartitionStats("t", 0, last_seq=1, dirty_ratio=0.5, export_lag_messages=1, export_lag_seconds=1.0, error=None)
    out: dict[str, list[tuple[str, tuple[str, ...], str]]] = {}
    for kind, registry in (
        ("run", metrics.report_registry(report)),
        ("data", metrics.stats_registry([row], table="t")),
    ):
        for family in registry.collect():
            labels: dict[str, None] = {}
            for sample in family.samples:
                labels.update(dict.fromkeys(sample.labels))
            out.setdefault(kind, []).append((family.name, tuple(labels), family.documentation))
    return out


def metrics_tables() -> str:
    """The monitoring page's two metric tables, of every run and of the data."""
    titles = {
        "run": "Metrics of every run",
        "data": "Metrics of the data",
    }
    intros = {
        "run": "Written from the job's report at the end of each run, by every job's `--metrics-file` (and "
        "`metrics_file:`) and by `tank-log compact` and `maintain`; the `job` label is the tank-log job (`compact`, "
        "`retention`, `maintain`, …), which Prometheus renames `exported_job` on scrape (below).",
        "data": "Written by `tank-log stats --metrics-file` (or printed by `--format prometheus`), one series per "
        "partition; the export lag ones with `--export-table TABLE`. Run it every few minutes (cron, a systemd "
        "timer).",
    }
    lines = []
    for kind, families in metric_families().items():
        lines += [f"### {titles[kind]}", "", intros[kind], "", "| metric | labels | what it says |", "|---|---|---|"]
        for name, labels, doc in families:
            shown = ", ".join(f"`{label}`" for label in labels)
            lines.append(f"| `{name}` | {shown} | {doc.replace('|', PIPE)} |")
        lines.append("")
    return "\n".join(lines)


def alert_rules() -> list[dict[str, Any]]:
    """The alerting rules of the shipped rules file, in its order."""
    import yaml

    with open(os.path.join(ROOT, ALERT_RULES), encoding="utf-8") as fh:
        groups = yaml.safe_load(fh)["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def _labels_as_code(text: str) -> str:
    """An annotation's `{{ $labels.topic }}` as `topic`."""
    return LABEL.sub(lambda m: f"`{m.group(1)}`", " ".join(text.split()))


def alerts_reference() -> str:
    """The monitoring page's list of the shipped alerts: a table, then each rule with its description and query."""
    import textwrap

    rules = alert_rules()
    lines = [
        f"The {len(rules)} alerts of `{ALERT_RULES}`, as the file has them (the queries wrapped to fit the page):",
        "",
        "| alert | severity | says |",
        "|---|---|---|",
    ]
    for rule in rules:
        name, summary = rule["alert"], _labels_as_code(rule["annotations"]["summary"]).replace("|", PIPE)
        lines.append(f"| [`{name}`](#{name.lower()}) | {rule['labels']['severity']} | {summary} |")
    lines.append("")
    for rule in rules:
        pending = f", after holding for {rule['for']}" if rule.get("for") else ", as soon as it holds"
        words = []  # a selector too long for a line gets its matchers on a line of their own
        for word in rule["expr"].split():
            long = len(word) > HELP_COLUMNS - 20 and "{" in word and word.endswith("}")
            words += [word[: word.index("{") + 1], word[word.index("{") + 1 : -1], "}"] if long else [word]
        query = textwrap.wrap(
            " ".join(words), HELP_COLUMNS, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
        )
        lines += [
            f"#### `{rule['alert']}`",
            "",
            f"Severity {rule['labels']['severity']}{pending}. {_labels_as_code(rule['annotations']['description'])}",
            "",
            "```text",
            *query,
            "```",
            "",
        ]
    return "\n".join(lines)
