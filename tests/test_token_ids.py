"""The prompt cache's token id runs (mlxrt.cache.token_ids) against a plain Python reference."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxrt.cache.prompt_cache import token_array
from mlxrt.cache.token_ids import TokenIds, common_prefix

ids = st.lists(st.integers(-(2**31), 2**31 - 1), max_size=300)


def _reference(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=300, deadline=None)
@given(ids, ids, st.integers(0, 3000))
def test_common_prefix_is_the_longest_shared_run(a, b, shared):
    head = [(i * 7919) % 50000 for i in range(shared)]  # long shared heads cross the byte chunks
    a, b = head + a, head + b
    assert common_prefix(TokenIds(a), TokenIds(b)) == _reference(a, b)


@settings(max_examples=100, deadline=None)
@given(ids)
def test_token_ids_keep_their_values(values):
    t = TokenIds(values)
    assert t.tolist() == values and len(t) == t.size == len(values) and list(t) == values
    assert t[1:4] == tuple(values[1:4])
    assert TokenIds(t) == t and hash(TokenIds(values)) == hash(t)
    source = list(values)
    copy = token_array(source)
    source.append(1)
    assert copy.tolist() == values  # a copy: the caller's list may change afterwards


def test_a_difference_in_one_byte_of_one_id_is_found_everywhere():
    base = list(range(5000))
    for at in (0, 1, 2047, 2048, 2049, 4095, 4999):
        changed = list(base)
        changed[at] += 1 << 24  # only the id's high byte differs
        assert common_prefix(TokenIds(base), TokenIds(changed)) == at


@pytest.mark.parametrize("bad", [[1.5], [2**31], [[1, 2]], ["7"]])
def test_token_array_refuses_what_is_not_int32(bad):
    with pytest.raises(ValueError, match="int32"):
        token_array(bad)
