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
    """The split of the whole text at once: text before the first open tag is content, then
    reasoning up to the first close tag, then content less the newlines right after that tag."""
    at = text.find(FMT.open)
    if at < 0:
        return "", text
    before, rest = text[:at], text[at + len(FMT.open):]
    end = rest.find(FMT.close)
    if end < 0:
        return rest, before
    after = rest[end + len(FMT.close):]
    return rest[:end], before + after.lstrip("\n")


def rebuilds(text, reasoning, content):
    """Whether ``text`` is ``content`` with ``reasoning`` put back inside the tags somewhere in
    it: content's head, the open tag, the reasoning, and then either nothing more (an unclosed
    block) or the close tag, newlines and content's tail. That is, the only characters missing
    from the two channels are the two tags and the newlines right after the close tag."""
    if not reasoning and content == text:
        return FMT.open not in text
    for i in range(len(content) + 1):
        head, tail = content[:i], content[i:]
        opened = head + FMT.open + reasoning
        if text == opened and not tail:
            return True
        if text.startswith(opened + FMT.close) and text[len(opened + FMT.close):].lstrip("\n") == tail:
            return True
    return False


#: Texts made of whole tags, pieces of tags and plain characters (random characters alone
#: would almost never spell a tag).
TEXTS = st.lists(st.sampled_from(["<think>", "</think>", "<", "</", "<th", "</thi", "think>", ">", "a", "b", "\n"]),
                 max_size=12).map("".join)


@given(TEXTS, st.integers(1, 5))
def test_nothing_is_lost(text, n):
    """Streamed in pieces of any size, the split drops only the two tags and the newlines after
    the close tag: every other character comes out, in its channel, in order."""
    pieces = [text[i:i + n] for i in range(0, len(text), n)]
    reasoning, content = split(pieces)
    assert rebuilds(text, reasoning, content), (reasoning, content)
    # and the split is the whole text's: at the first open tag and the first close tag after it
    assert (reasoning, content) == split_whole(text)
