"""The simulated tokenizer: invertible, deterministic, about four characters a token."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_ray._simulated import tokenizer
from rollout_ray._simulated.tokenizer import (
    CHAR_BASE,
    IM_END,
    IM_START,
    SPECIAL_TOKENS,
    TOOL_CALL,
    TOOL_CALL_END,
    VOCAB_SIZE,
    decode,
    encode,
    token_bytes,
    token_text,
)

SAMPLE = "<|im_start|>user\nWhat is 17 + 25? héllo 🙂<tool_call>{}</tool_call><|im_end|>"
SAMPLE_IDS = [
    IM_START,
    249377666,
    24524017,
    245921155,
    70032432,
    92821957,
    1052920,
    CHAR_BASE + ord("é"),
    230389808,
    CHAR_BASE + ord("🙂"),
    TOOL_CALL,
    16013,
    TOOL_CALL_END,
    IM_END,
]
"""Pinned: the ids may never change between processes, runs or versions."""

# Special-token text, ASCII around it, and any other character (lone surrogates included).
TEXT = st.lists(
    st.sampled_from(SPECIAL_TOKENS)
    | st.text(alphabet=st.characters(codec=None), max_size=12)
    | st.text(alphabet="<|>/_ imtoolcalsend\n", max_size=12),
    max_size=6,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_decode_inverts_encode(text: str) -> None:
    ids = encode(text)
    assert decode(ids) == text
    assert all(0 <= i < VOCAB_SIZE < 2**31 for i in ids)
    assert encode(text) == ids  # a pure function


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=80))
def test_ascii_costs_a_token_per_four_characters(text: str) -> None:
    if not any(t in text for t in SPECIAL_TOKENS):
        assert len(encode(text)) == math.ceil(len(text) / 4)


def test_ids_are_pinned_and_tokens_have_text_and_bytes() -> None:
    assert encode(SAMPLE) == SAMPLE_IDS
    assert [token_text(i) for i in SAMPLE_IDS][1:9] == ["user", "\nWha", "t is", " 17 ", "+ 25", "? h", "é", "llo "]
    assert [token_text(i) for i in encode("What is 17 + 25?")] == ["What", " is ", "17 +", " 25?"]
    assert token_text(IM_END) == "<|im_end|>" and encode("<|im_end|>") == [IM_END]
    assert token_bytes(CHAR_BASE + ord("é")) == [0xC3, 0xA9]
    assert token_bytes(CHAR_BASE + 0xD800) == [0xED, 0xA0, 0x80]  # a lone surrogate, as surrogatepass
    for bad in (-1, 5, 15, CHAR_BASE + 65, VOCAB_SIZE):
        with pytest.raises(ValueError, match="not a token id"):
            token_text(bad)


def test_ids_do_not_depend_on_the_process() -> None:
    # The module imports nothing of the package: load it alone, in a process with another hash seed.
    code = (
        "import importlib.util, sys; spec = importlib.util.spec_from_file_location('tok', sys.argv[1]); "
        "tok = importlib.util.module_from_spec(spec); spec.loader.exec_module(tok); print(tok.encode(sys.argv[2]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code, tokenizer.__file__, SAMPLE],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == str(SAMPLE_IDS)


def test_encoding_apart_is_not_encoding_joined() -> None:
    """What the template's drift mode relies on: chunks align to the start of each text."""
    assert encode("assistant\n") + encode("42") != encode("assistant\n42")
    assert decode(encode("assistant\n") + encode("42")) == decode(encode("assistant\n42"))
