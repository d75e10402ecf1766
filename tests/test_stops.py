from hypothesis import given
from hypothesis import strategies as st

from mlxrt.text.stops import StopMatcher


def run(stops, pieces):
    m = StopMatcher(stops)
    out = []
    for p in pieces:
        text, stopped = m.feed(p)
        out.append(text)
        if stopped:
            return "".join(out), True
    return "".join(out) + m.flush(), False


def test_stop_inside_a_piece_cuts_there():
    assert run(["END"], ["abcEN", "Dxyz"]) == ("abc", True)


def test_partial_prefix_is_held_then_released():
    m = StopMatcher(["STOP"])
    assert m.feed("hello ST") == ("hello ", False)
    assert m.feed("ART") == ("START", False)


def test_earliest_stop_wins():
    assert run(["b", "a"], ["xxab"]) == ("xx", True)


def test_no_stops_passes_through():
    assert run([], ["a", "b"]) == ("ab", False)


@given(st.lists(st.text(alphabet="abc", max_size=5), max_size=8), st.text(alphabet="abc", min_size=1, max_size=3))
def test_matches_the_text_search(pieces, stop):
    text = "".join(pieces)
    out, stopped = run([stop], pieces)
    at = text.find(stop)
    if at >= 0:
        assert stopped and out == text[:at]
    else:
        assert not stopped and out == text
