"""The scale bench's growth orders and its table (bench/scale.py, bench/scale_plot.py), without servers."""

from __future__ import annotations

import pytest

from bench import scale_plot
from bench.scale import Curve, Point, figures, growth


@pytest.mark.parametrize(("ys", "higher_is_better", "name"), [
    ((12.0, 12.5), False, "flat"),
    ((7.6, 27.1), False, "linear"),
    ((10.0, 100.0), False, "worse than linear"),
    ((313.5, 141.6), True, "falling"),  # ClickHouse's drain rate from 3,000 to 10,000 entries
    ((186.9, 183.1), True, "flat"),
    ((313.5, 141.6), False, "flat"),  # a falling cost is no growth
])
def test_growth_names(ys: tuple[float, float], higher_is_better: bool, name: str) -> None:
    assert growth([3_000, 10_000], ys, higher_is_better)[1] == name


def test_figures_and_table_of_a_partial_run() -> None:
    drain = Curve("drain", "Queue drain rate", "log entries", "entries/s", higher_is_better=True)
    drain.points = {"replicad": [Point(3_000, 186.9), Point(10_000, 183.1)],
                    "clickhouse": [Point(3_000, 313.5), Point(10_000, 141.6)]}
    [fig] = figures([drain])
    assert "10,000 log entries" in fig.title and "falling" in fig.status
    text = scale_plot.markdown([drain], None)
    assert "| Queue drain rate (entries/s) | 10,000 log entries | 183.1 | 141.6 | 1.29× |" in text
    assert "flat (slope -0.02)" in text and "falling (slope -0.66)" in text


def test_the_clients_curve_posts_distinct_blocks_from_many_threads() -> None:
    """Every insert of the clients curve a different block (a repeated one merges into a part compressed n:1,
    which the merge selection then takes for a small part); past the last, the deck says it wrapped."""
    import threading

    from bench.scale import BodyDeck, client_bodies

    bodies = client_bodies(12, 50)
    assert len(set(bodies)) == 12
    assert all(b.count(b"\n") == 50 for b in bodies)
    assert client_bodies(12, 50) is bodies  # made once, the same for both systems
    deck = BodyDeck(bodies)
    taken: list[bytes] = []
    lock = threading.Lock()

    def client() -> None:
        for _ in range(3):
            b = deck.take()
            with lock:
                taken.append(b)

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken) == sorted(bodies) and not deck.wrapped
    deck.take()
    assert deck.wrapped and deck.taken == 13
