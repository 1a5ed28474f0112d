"""The `tank-log` command as a user runs it (a real subprocess)."""

import json
import os
import subprocess
import sys

from conftest import ROOT, data_dir

CLI = [sys.executable, "-m", "tank_log.tools.cli"]


def run(*args, **kw):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, **kw)


def test_demo_stats_verify_dump(tmp_path):
    demo = tmp_path / "demo"
    r = run("demo", str(demo))
    assert r.returncode == 0, r.stderr
    r = run("stats", str(demo), "--json")
    rows = json.loads(r.stdout)
    assert {(x["topic"], x["partition"]) for x in rows} == {
        ("clicks", 0),
        ("orders", 0),
        ("orders", 1),
        ("orders", 2),
        ("profiles", 0),
        ("profiles", 1),
    }
    profiles = [x for x in rows if x["topic"] == "profiles"]
    assert all(x["tombstones"] > 0 and x["keyless"] > 0 and x["ro_segments"] >= 2 for x in profiles)
    assert all(x["snappy_bundles"] > 0 for x in rows if x["topic"] == "orders")
    r = run("verify", str(demo))
    assert r.returncode == 0, r.stdout + r.stderr
    r = run("dump", str(demo / "clicks" / "0"))
    lines = r.stdout.splitlines()
    assert len(lines) == 2000 and json.loads(lines[0])["seq"] == 1
    assert run("demo", str(demo)).returncode == 2  # refuses to overwrite


def test_bundles_listing():
    seg = os.path.join(data_dir("A_multi"), "seqgap", "0", "1-881_1795261032.ilog")
    r = run("dump", "--bundles", seg)
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert rows[0]["offset"] == 0 and rows[-1]["last_seq"] == 881
    assert any(x["sparse"] for x in rows) and any(x["codec"] == "snappy" for x in rows)


def test_verify_reports_and_fails(tmp_path):
    import shutil

    d = tmp_path / "d"
    shutil.copytree(data_dir("A_multi"), d)
    os.chmod(d / "small" / "0", 0o755)
    idx = d / "small" / "0" / "106.index"
    os.chmod(idx, 0o644)
    idx.write_bytes(b"")
    r = run("verify", str(d), "--json")
    assert r.returncode == 1
    problems = [json.loads(x) for x in r.stdout.splitlines()]
    assert [(p["code"], os.path.basename(p["path"])) for p in problems] == [("index-empty", "106.index")]


def test_bad_path_is_a_usage_error(tmp_path):
    r = run("stats", str(tmp_path / "nope"))
    assert r.returncode == 2 and "nope" in r.stderr


def test_a_reader_closing_the_pipe_is_not_an_error():
    proc = subprocess.Popen(
        [sys.executable, "-m", "tank_log.tools.cli", "dump", data_dir("A_multi")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout.readline()  # like `| head -1`
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and b"tank-log:" not in err


def test_dump_fails_on_mid_file_corruption_and_warns_on_torn_tails(fixture_copy):
    """`dump` no longer stops silently at a corrupt length varint with intact bundles after it."""
    base = fixture_copy("A_multi")
    part_dir = os.path.join(base, "events", "1")
    (active,) = [n for n in os.listdir(part_dir) if n.endswith(".log")]
    path = os.path.join(part_dir, active)
    data = bytearray(open(path, "rb").read())
    data[776] ^= 0x80
    open(path, "wb").write(bytes(data))
    res = run("dump", part_dir)
    assert res.returncode == 1
    assert f"{path} @775" in res.stderr and "data follows" in res.stderr and "Traceback" not in res.stderr
    data[776] ^= 0x80
    open(path, "wb").write(bytes(data[:-3]))  # a torn tail: every complete bundle is dumped, with a warning
    res = run("dump", part_dir)
    assert res.returncode == 0 and "torn tail of" in res.stderr
    assert len(res.stdout.splitlines()) > 7000


def test_dump_and_stats_exit_1_when_an_ro_segment_lost_its_tail(fixture_copy):
    """A torn tail of an RO segment is data lost: dump prints every complete bundle, says which file lost how many
    bytes from which offset, and exits 1, so `tank-log dump ... | load` cannot take a partial dump for a whole one."""
    base = fixture_copy("A_multi")
    part_dir = os.path.join(base, "small", "0")
    ro = sorted(n for n in os.listdir(part_dir) if n.endswith(".ilog"))[0]
    path = os.path.join(part_dir, ro)
    whole = run("dump", part_dir)
    assert whole.returncode == 0, whole.stderr
    size = os.path.getsize(path)
    os.truncate(path, size - 37)
    res = run("dump", part_dir)
    assert res.returncode == 1, res.stderr
    lost = len(whole.stdout.splitlines()) - len(res.stdout.splitlines())
    assert lost > 0 and res.stdout.splitlines() == [
        x for x in whole.stdout.splitlines() if x in set(res.stdout.splitlines())
    ]
    assert f"{path} @" in res.stderr and "bytes not read" in res.stderr and "RO segment" in res.stderr
    assert "incomplete" in res.stderr.splitlines()[-2] and "Traceback" not in res.stderr
    st = run("stats", part_dir, "--json")
    assert st.returncode == 1 and f"{path} @" in st.stderr
    assert json.loads(st.stdout)[0]["torn_bytes"] > 0


def test_dump_and_stats_exit_1_when_they_leave_a_partition_out(fixture_copy):
    """Partition directories 0 and 2 (no 1): the broker serves 0..1 by count and never opens 2 (§1.4); a dump or
    stats of the base path leaves 2 out, says so on stderr and exits 1."""
    import shutil

    base = fixture_copy("A_multi")
    shutil.rmtree(os.path.join(base, "events", "1"))
    for cmd in (("dump", base), ("stats", base), ("dump", os.path.join(base, "events"))):
        res = run(*cmd)
        assert res.returncode == 1, (cmd, res.stderr)
        assert os.path.join(base, "events", "2") in res.stderr and "not read" in res.stderr
    res = run("dump", base, "--topics", "small")  # the topic left out is not asked for: complete
    assert res.returncode == 0, res.stderr


def _options_without_help(parser):
    import argparse

    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += [f"{name} {o}" for o in _options_without_help(sub)]
        elif not isinstance(action, argparse._HelpAction) and not action.help:
            out.append("/".join(action.option_strings) or action.dest)
    return out


def test_every_option_of_the_cli_and_the_jobs_has_a_help_text():
    """`tank-log compact --help` listed --force, --topics, --dry-run with no description."""
    from tank_log.tools.cli import build_parser

    assert _options_without_help(build_parser()) == []
    from tank_spark import compact, maintain, rebuild_indexes, retention
    from tank_spark.export import plan
    from tank_spark.job_options import job_parser

    for module in (maintain, compact, retention, rebuild_indexes, plan):
        parser = job_parser("job", "")
        module.add_options(parser)
        assert _options_without_help(parser) == [], module.__name__


def test_ctrl_c_prints_what_finished_and_leaves_consistent_data(tmp_path):
    """Ctrl-C: the CLI prints the partitions already done (exit 130, no traceback)."""
    import signal

    from conftest import many_small_partitions

    from tank_log.maintenance.verify import verify_path

    base = many_small_partitions(tmp_path / "many", 300)
    # unbuffered: `readline` takes one line only (a buffered reader keeps more, which `communicate` never sees)
    proc = subprocess.Popen(
        [*CLI, "compact", base, "--broker-stopped"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0
    )
    first = proc.stdout.readline().decode()  # one partition done
    proc.send_signal(signal.SIGINT)
    out, err = (b.decode() for b in proc.communicate(timeout=120))
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "tank-log compact: interrupted;" in err
    done = [json.loads(line) for line in [first, *out.splitlines()] if line.startswith("{")]
    assert 1 <= len(done) < 300 and f"{len(done)} partition(s) finished" in err
    assert not [p for p in verify_path(base) if p.severity == "error"]


def test_job_path_names_every_job_entry_point():
    """`tank-log job-path NAME` knows every module of tank_spark/entry_points (import_delta was missing), and a
    checkout's jobs/ has the same entry points; an unknown name is a usage error (exit 2)."""
    from tank_spark.entry_points import NAMES

    def entry_points(folder: str) -> set[str]:
        return {f.removesuffix(".py") for f in os.listdir(folder) if f.endswith(".py") and not f.startswith("_")}

    package_dir = os.path.join(ROOT, "tank_spark", "entry_points")
    modules, checkout = entry_points(package_dir), entry_points(os.path.join(ROOT, "jobs"))
    assert set(NAMES) == modules == checkout
    for name in NAMES:
        r = run("job-path", name)
        assert r.returncode == 0 and r.stdout.strip() == os.path.join(package_dir, f"{name}.py"), r.stderr
    r = run("job-path", "vacuum")
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_the_cli_and_every_job_tell_their_version():
    """`--version` (what an operator quotes in a bug report) is the installed package's version, from the one place
    it is written (`tank_log.__version__`, which pyproject.toml reads); job reports record it (tests/e2e/test_demo)."""
    import importlib.metadata

    import tank_log
    from tank_spark.entry_points import NAMES

    assert importlib.metadata.version("tank-log") == tank_log.__version__
    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"tank-log {tank_log.__version__}"
    for name in NAMES:
        r = subprocess.run(
            [sys.executable, "-m", f"tank_spark.entry_points.{name}", "--version"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0 and r.stdout.strip() == f"{name} (tank-log {tank_log.__version__})", r.stderr


def test_bad_paths_are_usage_errors_naming_the_path(tmp_path):
    """A path that does not exist, a symbolic link loop, a file that is not a segment (or, for rebuild-index, a
    directory): exit 2 with one line naming the path and the rule, whatever the command (it was 1 or 2 at random)."""
    seg = os.path.join(data_dir("A_multi"), "small", "0")
    seg = os.path.join(seg, next(n for n in sorted(os.listdir(seg)) if n.endswith((".ilog", ".log"))))
    (tmp_path / "notes.txt").write_text("not a segment\n")
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    missing, loop, text = str(tmp_path / "missing"), str(tmp_path / "a"), str(tmp_path / "notes.txt")
    index = os.path.join(os.path.dirname(seg), os.path.basename(seg).split("-")[0].split("_")[0] + ".index")
    cases = [
        (("dump", text), text, "not a segment log file"),
        (("dump", index), index, "not a segment log file"),
        (("dump", missing), missing, "no such file or directory"),
        (("dump", loop), loop, "a loop of symbolic links"),
        (("verify", missing), missing, "no such file or directory"),
        (("stats", loop), loop, "a loop of symbolic links"),
        (("repair", missing), missing, "no such file or directory"),
        (("rebuild-index", missing), missing, "no such file or directory"),
        (("rebuild-index", loop), loop, "a loop of symbolic links"),
        (("rebuild-index", text), text, "not a segment log file"),
        (("rebuild-index", str(tmp_path)), str(tmp_path), "a directory, not a segment log file"),
    ]
    assert os.path.exists(index)
    for args, path, rule in cases:
        r = run(*args)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert "Traceback" not in r.stderr and r.stdout == "", (args, r.stderr)
        (line,) = r.stderr.strip().splitlines()
        assert path in line and rule in line, (args, line)
    r = run("dump", seg)  # a segment file is still dumped
    assert r.returncode == 0 and r.stdout, r.stderr
