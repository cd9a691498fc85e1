"""RELIABILITY.md, written from the results of a ``make chaos`` session (never by hand)."""

from __future__ import annotations

import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from tests.chaos.scenarios import PLANT_EXPECTS, RunResult


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def render(runs: Sequence[RunResult], plants: Sequence[RunResult], *, seed: int, faults: int,
           mode: str, command: str) -> str:
    out = [
        "# Reliability: the fault suite (tests/chaos)",
        "",
        f"Written by `{command}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} at commit "
        f"{_commit()}; do not edit by hand.  Network: {mode}.",
        "",
        "Each run: 3 replicad replicas on a 3-node ZooKeeper ensemble; 3 insert clients (5 rows per insert, "
        "a unique `insert_deduplication_token`, quorum 1 or 2, retried with the same token on an unknown "
        "outcome) and an admin client (OPTIMIZE, ALTER UPDATE/DELETE, DROP PARTITION) while "
        f"{faults} nemeses picked by the seed strike one after the other; then everything is healed and "
        "the independent checker (tests/chaos/checker.py: HTTP, ZooKeeper, files on disk; no replicad "
        "code) judges.",
        "",
        *_s3_paragraph(runs),
        "## Planted bugs (the checker must catch each)",
        "",
        "| plant | caught | violations reported |",
        "|---|---|---|",
    ]
    for p in plants:
        plant = p.name.split(" ", 1)[1]
        kinds = p.verdict.kinds()
        caught = bool(kinds & PLANT_EXPECTS.get(plant, set()))
        out.append(f"| {plant} | {'yes' if caught else '**NO**'} | {', '.join(sorted(kinds)) or '-'} |")
    if not plants:
        out.append("| (not run) | | |")

    injected = Counter(e.nemesis for r in runs for e in r.events)
    failing_by = Counter(e.nemesis for r in runs if r.verdict.violations for e in r.events)
    kinds = Counter(k for r in runs for k, _ in r.verdict.violations)
    recoveries = [r.verdict.recovery_s for r in runs if r.verdict.recovery_s is not None]
    inserts = sum(len(r.inserts) for r in runs)
    out += [
        "",
        "## Totals",
        "",
        f"- runs: {len(runs)} (seeds {seed}..{seed + len(runs) - 1}; "
        f"{dict(Counter(r.variant for r in runs))}), failing: "
        f"{sum(1 for r in runs if r.verdict.violations)}",
        f"- faults injected: {sum(injected.values())}",
        f"- operations: {inserts} inserts ({sum(r.indeterminate for r in runs)} indeterminate), "
        f"{sum(r.admin_ops for r in runs)} merges/mutations/drops",
        f"- acknowledged rows: {sum(r.acked_rows for r in runs)}",
        f"- lost rows: {kinds.get('lost', 0)} batches; duplicated: {kinds.get('duplicate', 0)}; "
        f"all violations: {dict(sorted(kinds.items())) or 0}",
    ]
    notes = sum(len(r.verdict.notes) for r in runs)
    if notes:
        out.append(f"- parts whose replicas differ in compressed bytes only (same uncompressed contents, "
                   f"which is all ClickHouse compares): {notes}")
    if recoveries:
        median = statistics.median(recoveries)
        out.append(f"- recovery after the heal (queues drained): median {median:.1f} s, "
                   f"max {max(recoveries):.1f} s")
    out += ["", "## Fault matrix", "", "| nemesis | injected | in failing runs |", "|---|---|---|"]
    for name in sorted(injected):
        out.append(f"| {name} | {injected[name]} | {failing_by.get(name, 0)} |")
    out += ["", "## Runs", "",
            "| seed | variant | faults | inserts | acked rows | indeterminate | admin ops | violations | "
            "recovery s | duration s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: r.seed):
        recovery = r.verdict.recovery_s if r.verdict.recovery_s is not None else ">60"
        faults = ", ".join(e.nemesis for e in r.events)
        out.append(f"| {r.seed} | {r.variant} | {faults} | {len(r.inserts)} | {r.acked_rows} | "
                   f"{r.indeterminate} | {r.admin_ops} | {len(r.verdict.violations)} | "
                   f"{recovery} | {r.duration_s} |")
    failing = [r for r in runs if r.verdict.violations]
    out += ["", "## Failing seeds", ""]
    if not failing:
        out.append("None.")
    for r in failing:
        out.append(f"### seed {r.seed} ({r.variant})")
        out.append("")
        for e in r.events:
            out.append(f"- t={e.at_s}s {e.nemesis}: {e.what} (healed after {e.held_s}s)")
        for k, d in r.verdict.violations[:20]:
            out.append(f"- **{k}**: {d}")
        out.append("")
    return "\n".join(out) + "\n"


def _s3_paragraph(runs: Sequence[RunResult]) -> list[str]:
    if not any(r.variant.startswith("s3") for r in runs):
        return []
    return [
        "The `s3 zero-copy` runs (`make chaos S3=K`) put the same table on an S3 disk (a moto server in "
        "its own network namespace, or on loopback) with `allow_remote_fs_zero_copy_replication`, a short "
        "`old_parts_lifetime` and an orphan scan every few seconds; besides the suite's nemeses they draw "
        "from partition_s3, pause_s3, kill_merging (kill -9 of the replica holding a merged part's "
        "exclusive lock) and wipe_local (the local copies removed: parts are read back from the bucket). "
        "The checker's S3 half (tests/chaos/s3_checker.py: boto3, the local metadata files, ZooKeeper) "
        "then requires: every object of an active or locked part present (`s3_lost`), every active part "
        "locked (`s3_unlocked`), every lock matching a part instance on its replica (`s3_lock`), and no "
        "object left unreferenced once the orphan scan's grace has passed (`s3_orphan`).",
        "",
    ]


def write(path: Path, text: str) -> None:
    path.write_text(text)
