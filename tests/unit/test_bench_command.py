"""The command line a benchmark report records (bench/__main__.py): the options that shape the figures, never
a scratch directory's path on the machine that ran it."""

from __future__ import annotations

import pytest

from bench.__main__ import recorded_command


@pytest.mark.parametrize(("args", "shown"), [
    (["--only", "scale", "--runs", "1", "--output", "B.md", "--work-dir", "/scratch/w"],
     "python -m bench --only scale --runs 1 --output B.md"),
    (["--work-dir=/scratch/w", "--keep", "--only", "lag"], "python -m bench --only lag"),
    (["--keep", "--work-dir", "/scratch/w"], "python -m bench"),
    (["--quick"], "python -m bench --quick"),
])
def test_machine_local_options_are_left_out(args: list[str], shown: str) -> None:
    assert recorded_command(args) == shown
