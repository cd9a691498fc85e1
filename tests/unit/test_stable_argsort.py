"""The insert sort permutation: the packed (key, row) sort equals numpy's stable argsort."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from replicad.storage.block import _stable_argsort

DTYPES = [np.int8, np.uint8, np.int16, np.int32, np.uint32, np.int64, np.uint64]


@given(st.sampled_from(DTYPES).flatmap(lambda dt: hnp.arrays(dt, st.integers(0, 300))))
def test_matches_numpy_stable_argsort(key: npt.NDArray[Any]) -> None:
    assert _stable_argsort(key).tolist() == np.argsort(key, kind="stable").tolist()


@pytest.mark.parametrize("dtype", DTYPES)
def test_duplicates_and_extremes(dtype: type) -> None:
    info = np.iinfo(dtype)
    rng = np.random.default_rng(1)
    for values in ([info.min, info.max, 0, info.min, info.max], [info.max - 1, info.max, info.max - 1]):
        key: npt.NDArray[Any] = np.array(values * 50, dtype=dtype)
        assert (_stable_argsort(key) == np.argsort(key, kind="stable")).all()
    key = rng.integers(0, 5, 100_000).astype(dtype)  # many ties: the packed path
    assert (_stable_argsort(key) == np.argsort(key, kind="stable")).all()
