"""Retention (docs/FORMAT.md §5) with the broker's policies and without its weaknesses."""

import os

from conftest import copy_tree, data_dir, load_dump, tree_digest

from tank_log.format.bundle import Message
from tank_log.maintenance.retention import RetentionOptions, RetentionRules, apply_retention, plan_retention
from tank_log.maintenance.verify import check_partition
from tank_log.storage.datadir import partitions_at, scan_partition
from tank_log.storage.writer import write_segment

NOW = 1_800_000_000  # seconds
STOPPED = RetentionOptions(broker_stopped=True, now_s=NOW)


def make_partition(path, n_segments=6, per_segment=50, ts_step_s=86400, legacy=()):
    """RO segment i (0-based) holds messages (n_segments - i) days old, named with its newest message ts (s), then
    an active segment with fresh messages. Segments in `legacy` get the legacy name without ts."""
    os.makedirs(path)
    seq = 1
    for i in range(n_segments + 1):
        t_ms = (NOW - (n_segments - i) * ts_step_s) * 1000
        msgs = [Message(seq + j, t_ms + j, b"k%d" % j, b"x%d" % j * 40) for j in range(per_segment)]
        seq += per_segment
        active = i == n_segments
        w = write_segment(path, msgs, active=active, ts=(msgs[0].ts if active else msgs[-1].ts) // 1000)
        if i in legacy:
            os.rename(w.log_path, os.path.join(path, f"{w.base}-{w.last}.ilog"))
    return scan_partition(path, "t", 0)


def names(part):
    return [os.path.basename(s.path) for s in part.segments]


def test_segments_count(tmp_path):
    part = make_partition(str(tmp_path / "p"))
    assert len(part.ro) == 6
    res = apply_retention(part, RetentionRules(segments_count=2), STOPPED)
    assert res.status == "deleted" and res.segments_deleted == 4
    after = scan_partition(part.path, "t", 0)
    assert [s.base for s in after.ro] == [s.base for s in part.ro[4:]] and after.active.base == part.active.base
    assert res.first_seq_after == part.ro[4].base and res.messages_deleted == 200
    assert all("retention.segments.count" in d["reason"] for d in res.deleted)
    assert check_partition(after) == []


def test_bytes_use_real_sizes(tmp_path):
    part = make_partition(str(tmp_path / "p"))
    limit = sum(s.size for s in part.ro[-3:])
    res = apply_retention(part, RetentionRules(max_bytes=limit), STOPPED)
    assert res.segments_deleted == 3 and res.bytes_deleted == sum(s.size for s in part.ro[:3])


def test_age_by_name_and_by_message(tmp_path):
    part = make_partition(str(tmp_path / "p"))
    # segment i's newest message is (6 - i) days old; name ts = newest message ts
    res = apply_retention(
        part, RetentionRules(max_age_s=3 * 86400 + 100), RetentionOptions(broker_stopped=True, now_s=NOW, dry_run=True)
    )
    assert res.status == "dry-run" and res.segments_deleted == 3
    # give every name a fresh ts: by name nothing is old, by message the same 3 are
    for s in part.ro:
        os.rename(s.path, os.path.join(part.path, f"{s.base}-{s.last}_{NOW}.ilog"))
    part = scan_partition(part.path, "t", 0)
    by_name = apply_retention(part, RetentionRules(max_age_s=3 * 86400 + 100), STOPPED)
    assert by_name.status == "nothing-to-do"
    by_msg = apply_retention(part, RetentionRules(max_age_s=3 * 86400 + 100, time_basis="message"), STOPPED)
    assert by_msg.segments_deleted == 3 and "newest message ts" in by_msg.deleted[0]["reason"]


def test_legacy_front_segment_does_not_block(tmp_path):
    """The broker tests only the front segment's name ts; a legacy front (ts 0) blocks everything (§5)."""
    part = make_partition(str(tmp_path / "p"), legacy=(0,))
    assert part.ro[0].name.ts is None
    res = apply_retention(part, RetentionRules(max_age_s=2 * 86400 + 100), STOPPED)
    assert res.segments_deleted == 4
    assert "legacy" in res.deleted[0]["reason"]
    assert not any(n.startswith(f"{part.ro[0].base}") for n in os.listdir(part.path))  # really gone


def test_prefix_rule_stops_at_the_first_young_segment(tmp_path):
    part = make_partition(str(tmp_path / "p"))
    # make segment 1 young by name: segments 2.. are older but behind it, so only segment 0 goes
    s = part.ro[1]
    os.rename(s.path, os.path.join(part.path, f"{s.base}-{s.last}_{NOW}.ilog"))
    part = scan_partition(part.path, "t", 0)
    plan = plan_retention(part, RetentionRules(max_age_s=86400), NOW)
    assert [p[0].base for p in plan] == [part.ro[0].base]


def test_active_segment_survives_and_rule_4(tmp_path):
    part = make_partition(str(tmp_path / "p"))
    res = apply_retention(part, RetentionRules(max_age_s=1), STOPPED)
    after = scan_partition(part.path, "t", 0)
    assert after.ro == [] and after.active is not None and after.active.base == part.active.base
    assert res.segments_deleted == 6
    # a broker killed between a roll and its next active segment: the preflight's repair makes the last RO segment
    # active again (§2.5), and retention keeps it as the active segment
    part2 = make_partition(str(tmp_path / "q"))
    os.unlink(part2.active.path)
    res2 = apply_retention(scan_partition(part2.path, "t", 0), RetentionRules(max_age_s=1), STOPPED)
    assert res2.status == "deleted" and res2.segments_deleted == 5
    repaired = scan_partition(part2.path, "t", 0)
    assert repaired.ro == [] and repaired.active is not None and repaired.active.base == part2.ro[-1].base
    # without a non-empty active segment that repair can restore (a segment lost before the last RO one, its index
    # left: repair names the loss and never merges across the gap it left), nothing is deleted, and the partition
    # needs attention with repair's reason, as `tank-log repair` exits 1 on it
    part3 = make_partition(str(tmp_path / "r"))
    os.unlink(part3.active.path)
    os.unlink(part3.ro[-2].path)
    before = tree_digest(part3.path)
    res3 = apply_retention(scan_partition(part3.path, "t", 0), RetentionRules(max_age_s=1), STOPPED)
    assert res3.status == "needs-attention" and "repair refused" in res3.reason, res3
    assert "not made active: seq gap" in res3.reason and "an index without its segment file" in res3.reason
    assert tree_digest(part3.path) == before


def test_dry_run_is_byte_identical(tmp_path):
    part = make_partition(str(tmp_path / "p"))
    before = tree_digest(part.path, include_lock=True)
    res = apply_retention(
        part, RetentionRules(segments_count=2, max_age_s=86400), RetentionOptions(dry_run=True, now_s=NOW)
    )
    assert res.status == "dry-run" and res.segments_deleted == 5
    assert tree_digest(part.path, include_lock=True) == before


def test_fixture_retained_reads_on(tmp_path):
    """A_multi/retained (retention.segments.count=3): one more run with count 2 drops exactly its first segment."""
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    pdir = os.path.join(base, "retained", "0")
    (part,) = partitions_at(pdir)  # with the topic-level config
    assert part.config.retention_segments_count == 3
    assert apply_retention(part, RetentionRules.from_config(part.config), STOPPED).status == "nothing-to-do"
    res = apply_retention(part, RetentionRules(segments_count=2), STOPPED)
    assert res.segments_deleted == 1 and res.first_seq_after == 559
    after = scan_partition(pdir, "retained", 0)
    got = [m.seq for s in after.segments for m in s.messages()]
    assert got == [m[0] for m in load_dump("A_multi")[("retained", 0)] if m[0] >= 559]


def test_live_partition_refused(tmp_path):
    part = make_partition(str(tmp_path / "p"))
    res = apply_retention(part, RetentionRules(segments_count=2), RetentionOptions())  # real clock: just written
    assert res.status == "failed" and "--broker-stopped" in res.error


def test_the_policy_table_drives_the_rules_the_config_and_the_broker_keys():
    """Each row of POLICIES has its field in RetentionRules, its key (config_key, parsed as its unit) in the job
    config's per-topic overrides, and its field in the broker's PartitionConfig when the broker has the policy."""
    import dataclasses

    from tank_log.format.broker_config import PartitionConfig
    from tank_log.jobs.config.models import TopicRetention
    from tank_log.maintenance.retention import POLICIES

    samples = {"count": (5, 5), "size": ("2kb", 2048), "duration": ("2days", 2 * 86400)}
    rule_fields = {f.name for f in dataclasses.fields(RetentionRules)}
    for policy in POLICIES:
        assert policy.name in rule_fields
        field = TopicRetention.model_fields[policy.name]
        assert (field.alias or policy.name) == policy.config_key
        text, value = samples[policy.unit]
        assert getattr(TopicRetention.model_validate({policy.config_key: text}), policy.name) == value
        assert TopicRetention.model_validate({policy.config_key: text}).limits == {policy.name: value}
        if policy.broker_field is not None:
            assert hasattr(PartitionConfig(), policy.broker_field)
    assert set(TopicRetention.model_fields) - {p.name for p in POLICIES} == {"enabled", "time_basis", "keep_unexported"}
