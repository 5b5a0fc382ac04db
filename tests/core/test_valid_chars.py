"""Bodies and string values are checked with ``str.isprintable`` first and the XML character
pattern only for what that refuses: the answer is the pattern's for every character."""

from __future__ import annotations

from sqsq.core.messages import _INVALID_CHAR_RE, _has_invalid_chars


def test_every_code_point_is_judged_as_the_pattern_judges_it() -> None:
    wrong = [hex(cp) for cp in range(0x110000)
             if _has_invalid_chars(chr(cp)) != (_INVALID_CHAR_RE.search(chr(cp)) is not None)]
    assert wrong == []


def test_strings_mixing_printable_and_other_characters() -> None:
    for text in ("plain", "line\nbreak\ttab\r", "bell\x07", "lone \ud800 surrogate", "\ufffe",
                 "\uffff", "emoji \U0001f600", "private \ue000", "nbsp\u00a0", "del\x7f", ""):
        assert _has_invalid_chars(text) == (_INVALID_CHAR_RE.search(text) is not None), text
