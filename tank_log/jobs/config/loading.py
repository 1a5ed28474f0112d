"""Reading a job configuration file: YAML (a key given twice is an error), validation by the models with every
error naming its key path (`compaction.topics.orders.policy: expected one of cleanup, delete, got 'compact'`), and
relative paths resolved against the file's directory."""

from __future__ import annotations

import os
import typing
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from tank_log.errors import JobConfigError
from tank_log.jobs.config.models import EXPORT_TABLE, JobConfig, KeepUnexported

MAX_NODES = 100_000  # far above any job config (a few hundred values); an alias bomb expands far beyond it


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's last key silently wins; a job config must not (a repeated section would hide the first). Its document
    is refused when its aliases expand it beyond `MAX_NODES` (`_expanded_nodes`): work bounded by the text's size."""

    def get_single_node(self) -> yaml.Node | None:
        """Raises:
        JobConfigError: the document's aliases expand it beyond `MAX_NODES` nodes, or an alias lies inside its own
            anchor (a cycle no validation could walk).
        """
        node: yaml.Node | None = super().get_single_node()
        if node is not None:
            _expanded_nodes(node)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """Raises:
        JobConfigError: a key given twice in one mapping.
        """
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: its keys are defaults, written ones win
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise JobConfigError(f"duplicate key {key!r} (line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep)


def _expanded_nodes(root: yaml.Node) -> int:
    """How many nodes `root` has once every alias is expanded (a composed document shares one node per anchor, so
    this is computed once per distinct node: time bounded by the text's size, without recursion).

    Raises:
        JobConfigError: more than `MAX_NODES`, or an alias inside its own anchor.
    """
    size: dict[int, int] = {}
    on_path: set[int] = set()
    todo: list[tuple[yaml.Node, bool]] = [(root, False)]
    while todo:
        node, children_done = todo.pop()
        if id(node) in size:
            continue
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if children_done:
            on_path.discard(id(node))
            size[id(node)] = total = 1 + sum(size[id(c)] for c in children)
            if total > MAX_NODES:
                raise JobConfigError(
                    f"its aliases expand it to more than {MAX_NODES:,} values (line {node.start_mark.line + 1}): "
                    "a job config is refused beyond that (an alias bomb?)"
                )
            continue
        if id(node) in on_path:
            raise JobConfigError(
                f"an alias inside its own anchor (line {node.start_mark.line + 1}): a job config cannot be recursive"
            )
        on_path.add(id(node))
        todo.append((node, True))
        todo.extend((c, False) for c in children if id(c) not in size)
    return size[id(root)]


def parse_job_config(doc: Any, source: str = "config") -> JobConfig:
    """Validate a parsed YAML document.

    Raises:
        JobConfigError: an unknown key or a bad value, naming the key.
    """
    if not isinstance(doc, dict):
        raise JobConfigError(f"{source}: expected a mapping, got {type(doc).__name__}")
    try:
        return JobConfig.model_validate(doc)
    except ValidationError as err:
        raise JobConfigError("; ".join(_describe(e) for e in err.errors())) from None


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _describe(error: Any) -> str:
    """One validation error as `key.path: what was expected`."""
    loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and (p.startswith("function-") or "[" in p)))
    kind, msg = error["type"], str(error["msg"]).removeprefix("Value error, ")
    parent = _path(loc[:-1]) or "config"
    if kind == "extra_forbidden":
        allowed = ", ".join(sorted(_keys_at(loc[:-1])))
        return f"{parent}: unknown key(s) {loc[-1]} (allowed: {allowed})"
    if kind == "missing":
        return f"{parent}: missing {loc[-1]}"
    if kind == "model_type":
        return f"{_path(loc) or 'config'}: expected a mapping, got {type(error['input']).__name__}"
    if kind in ("literal_error", "union_tag_invalid") or "valid dictionary" in msg:
        msg = f"expected a mapping or false, got {error['input']!r}"
    return f"{_path(loc) or 'config'}: {msg}"


def _keys_at(loc: tuple[Any, ...]) -> set[str]:
    """The YAML keys allowed at `loc` (for an unknown-key error)."""
    model: Any = JobConfig
    skip = False  # the next part is a mapping's key or a list's index
    for part in loc:
        if skip:
            skip = False
            continue
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None) if model else None
        if field is None:
            return set()
        model, skip = _inner(field.annotation), _is_container(field.annotation)
    return {f.alias or n for n, f in model.model_fields.items()} if model else set()


def _is_container(annotation: Any) -> bool:
    """A dict or tuple annotation (possibly inside Annotated or `| None`)."""
    if typing.get_origin(annotation) in (dict, tuple):
        return True
    return any(_is_container(a) for a in typing.get_args(annotation) if not isinstance(a, BaseModel))


def _inner(annotation: Any) -> Any:
    """The model inside an annotation (`dict[str, M]`, `tuple[M, ...]`, `M | None`, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in reversed(typing.get_args(annotation)):
        found = _inner(arg)
        if found is not None:
            return found
    return None


MAX_DEPTH = 32  # far above any job config; deeper documents are refused before validation recurses into them


def _depth(doc: Any, limit: int = MAX_DEPTH + 1) -> int:
    """How deeply `doc` nests (counted up to `limit`, without recursion)."""
    deepest, todo = 0, [(doc, 0)]
    while todo:
        node, d = todo.pop()
        deepest = max(deepest, d)
        if deepest >= limit:
            return deepest
        if isinstance(node, dict):
            todo.extend((v, d + 1) for v in node.values())
        elif isinstance(node, list):
            todo.extend((v, d + 1) for v in node)
    return deepest


def load_job_config(path: str | os.PathLike[str] | None) -> JobConfig:
    """Read and validate a YAML job config; None = defaults. Relative paths in it (`data_dirs`, a local
    `export.table`) are relative to the config file's directory, so a config works from any working directory
    (an Airflow worker's is not the repository).

    Raises:
        JobConfigError: a missing file, invalid YAML, a repeated key, aliases expanding beyond `MAX_NODES`, an
            unknown key or a bad value.
    """
    if path is None:
        return JobConfig()
    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.load(fh, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except FileNotFoundError:
        raise JobConfigError(f"config file not found: {path}") from None
    except UnicodeDecodeError as err:
        raise JobConfigError(f"{path}: byte {err.start} is not UTF-8 (a job config is UTF-8 text)") from None
    except OSError as err:
        raise JobConfigError(f"{path}: cannot be read: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise JobConfigError(f"{path}: not valid YAML: {err}") from None
    except JobConfigError as err:
        raise JobConfigError(f"{path}: {err}") from None
    except RecursionError:
        raise JobConfigError(f"{path}: nested too deeply (a job config is a few levels of mappings)") from None
    if _depth(doc) > MAX_DEPTH:
        raise JobConfigError(
            f"{path}: nested deeper than {MAX_DEPTH} levels (a job config is a few levels of mappings)"
        )
    try:
        config = parse_job_config(doc or {}, os.fspath(path))
    except JobConfigError as err:
        raise JobConfigError(f"{path}: {err}") from None
    return relative_to(config, os.path.dirname(os.path.abspath(path)))


def relative_to(config: JobConfig, directory: str) -> JobConfig:
    """The config with its relative local paths resolved against `directory` (URIs and absolute paths kept)."""
    from tank_log.lakehouse.location import RestCatalog

    def resolve(p: str) -> str:
        return p if "://" in p else os.path.normpath(os.path.join(directory, os.path.expanduser(p)))

    def keep(k: Any) -> Any:
        if isinstance(k, KeepUnexported) and k.table != EXPORT_TABLE and not isinstance(k.catalog, RestCatalog):
            return k.model_copy(update={"table": resolve(k.table)})
        return k

    export = config.export
    if export.table is not None and not isinstance(export.catalog, RestCatalog):  # a REST catalog's: a name
        export = export.model_copy(update={"table": resolve(export.table)})
    retention = config.retention.model_copy(
        update={
            "keep_unexported": keep(config.retention.keep_unexported),
            "topics": {
                t: o.model_copy(update={"keep_unexported": keep(o.keep_unexported)})
                for t, o in config.retention.topics.items()
            },
        }
    )
    brokers = tuple(
        b.model_copy(
            update={
                "data_dirs": tuple(resolve(d) for d in b.data_dirs),
                "job_config": None if b.job_config is None else resolve(b.job_config),
            }
        )
        for b in config.brokers
    )
    return config.model_copy(
        update={
            "data_dirs": tuple(resolve(d) for d in config.data_dirs),
            "metrics_file": None if config.metrics_file is None else resolve(config.metrics_file),
            "export": export,
            "retention": retention,
            "brokers": brokers,
        }
    )


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the job configuration file (its YAML keys), for editors and the docs."""
    schema = JobConfig.model_json_schema(by_alias=True)
    schema["title"] = "tank-log job configuration"
    return schema
