from hypothesis import given
from hypothesis import strategies as st

from mlxrt import ThinkingFormat
from mlxrt.text.reasoning import ReasoningSplitter, prompt_opens_thinking

FMT = ThinkingFormat(open="<think>", close="</think>")


def split(pieces, **kw):
    s = ReasoningSplitter(FMT, **kw)
    reasoning, content = [], []
    for p in pieces:
        r, c = s.feed(p)
        reasoning.append(r)
        content.append(c)
    r, c = s.flush()
    return "".join(reasoning) + r, "".join(content) + c


def test_tags_split_across_pieces():
    assert split(["<th", "ink>plan", "ning</thi", "nk>\n\nanswer"]) == ("planning", "answer")


def test_starts_in_thinking():
    assert split(["plan</think>", "\n\nok"], starts_in_thinking=True) == ("plan", "ok")


def test_no_format_is_all_content():
    s = ReasoningSplitter(None)
    assert s.feed("<think>x</think>") == ("", "<think>x</think>")


def test_unclosed_reasoning_is_kept():
    assert split(["<think>still going"]) == ("still going", "")


def test_prompt_opens_thinking():
    assert prompt_opens_thinking("<|im_start|>assistant\n<think>\n", FMT)
    assert not prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n", FMT)
    assert not prompt_opens_thinking("<|im_start|>assistant\n", FMT)


@given(st.text(alphabet="ab<>/thinkc", max_size=30), st.integers(1, 5))
def test_nothing_is_lost(text, n):
    pieces = [text[i:i + n] for i in range(0, len(text), n)]
    reasoning, content = split(pieces)
    tags_removed = len(text) - len(reasoning) - len(content)
    assert tags_removed >= 0
    if "<think>" not in text:
        assert content == text and reasoning == ""
