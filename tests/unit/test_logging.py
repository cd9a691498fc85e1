"""JSON log lines: one object per line, ts/level/event first, stdlib records and warnings included."""

from __future__ import annotations

import io
import json
import logging
import warnings
from collections.abc import Iterator

import pytest

from replicad import logging as rlog


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    out = io.StringIO()
    rlog.configure("info", stream=out)
    yield out
    rlog.reset()
    rlog.set_level("info")


def lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_json_lines_with_fields(stream: io.StringIO) -> None:
    log = rlog.get_logger("replicad.test", table="db.t")
    log.info("part_committed", part="202611_1_1_0", rows=3, raw=b"\xff")
    log.debug("not_shown")
    got = lines(stream)
    assert len(got) == 1
    assert list(got[0])[:4] == ["ts", "level", "event", "logger"]
    assert got[0]["event"] == "part_committed" and got[0]["level"] == "info"
    assert got[0]["table"] == "db.t" and got[0]["rows"] == 3 and got[0]["raw"] == "\\xff"
    assert str(got[0]["ts"]).endswith("Z")


def test_level_changes_at_run_time(stream: io.StringIO) -> None:
    log = rlog.get_logger("x")
    rlog.set_level("debug")
    log.debug("now_shown")
    rlog.set_level("error")
    log.warning("hidden")
    log.error("shown_error")
    assert [e["event"] for e in lines(stream)] == ["now_shown", "shown_error"]


def test_exceptions_stdlib_and_warnings(stream: io.StringIO) -> None:
    log = rlog.get_logger("x")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("task_crashed", task="t")
    logging.getLogger("kazoo.client").warning("Connection dropped: %s", "socket closed")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("deprecated thing", FutureWarning, stacklevel=1)
    got = lines(stream)
    assert got[0]["event"] == "task_crashed" and "ValueError: boom" in str(got[0]["exception"])
    assert got[1] == {**got[1], "event": "Connection dropped: socket closed", "logger": "kazoo.client",
                      "level": "warning"}
    assert got[2]["logger"] == "py.warnings" and "deprecated thing" in str(got[2]["event"])


def test_event_names_are_snake_case() -> None:
    assert rlog.is_event_name("part_committed") and not rlog.is_event_name("Part committed")


def test_shell_modules_use_snake_case_event_names() -> None:
    import re
    from pathlib import Path

    root = Path(rlog.__file__).parent
    files = ["daemon.py", "tasks.py", "sd_notify.py", "server/api.py", "server/metrics.py",
             "server/status.py", "server/routing.py"]
    pattern = re.compile(r"\blog\.(?:debug|info|warning|error|exception)\(\s*\"([^\"]+)\"")
    names = [m.group(1) for f in files for m in pattern.finditer((root / f).read_text())]
    assert len(names) > 20
    assert [n for n in names if not rlog.is_event_name(n)] == []
