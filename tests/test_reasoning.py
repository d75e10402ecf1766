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


def split_whole(text):
    """The split of the whole text at once, and the parts it drops: text before the first open
    tag is content, then reasoning up to the first close tag, then content less the newlines
    right after that tag. Joined back in order, the parts are ``text`` again."""
    at = text.find(FMT.open)
    if at < 0:
        return ("", text), [text]
    before, rest = text[:at], text[at + len(FMT.open):]
    end = rest.find(FMT.close)
    if end < 0:
        return (rest, before), [before, FMT.open, rest]
    after = rest[end + len(FMT.close):]
    newlines = after[:len(after) - len(after.lstrip("\n"))]
    parts = [before, FMT.open, rest[:end], FMT.close, newlines, after[len(newlines):]]
    return (rest[:end], before + after[len(newlines):]), parts


#: Texts made of whole tags, pieces of tags and plain characters (random characters alone
#: would almost never spell a tag).
TEXTS = st.lists(st.sampled_from(["<think>", "</think>", "<", "</", "<th", "</thi", "think>", ">", "a", "b", "\n"]),
                 max_size=12).map("".join)


@given(TEXTS, st.integers(1, 5))
def test_nothing_is_lost(text, n):
    """Streamed in pieces of any size, the split drops only the two tags and the newlines after
    the close tag: every other character comes out, in its channel, in order."""
    (reasoning, content), parts = split_whole(text)
    assert "".join(parts) == text  # the whole text: what is dropped is only tags and newlines
    pieces = [text[i:i + n] for i in range(0, len(text), n)]
    assert split(pieces) == (reasoning, content)
