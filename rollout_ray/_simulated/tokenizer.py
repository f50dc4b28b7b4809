"""The simulated model's tokenizer: a pure, invertible function between text and token ids.

Three kinds of token, told apart by their id:

- ids ``0..4`` are the special tokens ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``,
  ``<tool_call>``, ``</tool_call>`` (the first three as in the vLLM CPU recipe's tiny model);
  their text anywhere in the input is encoded as the special token, as Hugging Face
  tokenizers do by default; ``5..15`` are reserved;
- a run of ASCII characters is cut into chunks of four characters from the start of the run
  (the last one shorter); a chunk of ``L`` characters is ``ASCII_BASE[L - 1]`` plus its code
  points read as a base-128 number;
- every other character (code point ``c``) is one token, ``CHAR_BASE + c``.

So ``decode(encode(text)) == text`` for every string (lone surrogates included), the ids are
the same in every process and run (plain arithmetic, no ``hash()``), all ids are below
``VOCAB_SIZE`` (under 2**31, so they fit an int32 column), and ASCII text costs
``ceil(len / 4)`` tokens, close to the four-characters-a-token usage estimate. Because the
chunks are aligned to the start of each run, encoding two texts apart is not the same as
encoding them joined: the chat template relies on that to model template drift
(``template.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = [
    "ASCII_BASE", "CHAR_BASE", "CHUNK", "ENDOFTEXT", "IM_END", "IM_START", "SPECIAL_TOKENS",
    "TOOL_CALL", "TOOL_CALL_END", "VOCAB_SIZE", "decode", "encode", "token_bytes", "token_text",
]  # fmt: skip

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>")
ENDOFTEXT, IM_START, IM_END, TOOL_CALL, TOOL_CALL_END = range(len(SPECIAL_TOKENS))
RESERVED = 16
"""Ids below this are special tokens or reserved for more."""
CHUNK = 4
"""Characters in a full ASCII chunk."""
ASCII_BASE = tuple(RESERVED + sum(128**k for k in range(1, length)) for length in range(1, CHUNK + 2))
"""``ASCII_BASE[L - 1]``: the first id of an ASCII chunk of ``L`` characters (``[CHUNK]``: the end)."""
CHAR_BASE = ASCII_BASE[CHUNK]
"""The id of code point 0 as a non-ASCII character token (code points below 128 never use it)."""
VOCAB_SIZE = CHAR_BASE + 0x110000

_SPECIAL_IDS = {text: i for i, text in enumerate(SPECIAL_TOKENS)}
_SPECIAL = re.compile("|".join(re.escape(t) for t in sorted(SPECIAL_TOKENS, key=len, reverse=True)))
_RUN = re.compile(r"[\x00-\x7f]+|[^\x00-\x7f]")


def encode(text: str) -> list[int]:
    """The token ids of ``text`` (special-token text becomes the special token)."""
    ids: list[int] = []
    start = 0
    for match in _SPECIAL.finditer(text):
        _encode_plain(text[start : match.start()], ids)
        ids.append(_SPECIAL_IDS[match.group()])
        start = match.end()
    _encode_plain(text[start:], ids)
    return ids


def _encode_plain(text: str, out: list[int]) -> None:
    for match in _RUN.finditer(text):
        run = match.group()
        if run >= "\x80":  # one non-ASCII character
            out.append(CHAR_BASE + ord(run))
            continue
        for i in range(0, len(run), CHUNK):
            chunk = run[i : i + CHUNK]
            value = 0
            for char in chunk:
                value = value * 128 + ord(char)
            out.append(ASCII_BASE[len(chunk) - 1] + value)


def token_text(token_id: int) -> str:
    """The text of one token; ``ValueError`` for an id no text encodes to."""
    if 0 <= token_id < len(SPECIAL_TOKENS):
        return SPECIAL_TOKENS[token_id]
    if RESERVED <= token_id < CHAR_BASE:
        length = next(n for n in range(1, CHUNK + 1) if token_id < ASCII_BASE[n])
        value = token_id - ASCII_BASE[length - 1]
        chars = []
        for _ in range(length):
            value, code = divmod(value, 128)
            chars.append(chr(code))
        return "".join(reversed(chars))
    if CHAR_BASE + 128 <= token_id < VOCAB_SIZE:
        return chr(token_id - CHAR_BASE)
    raise ValueError(f"not a token id of the simulated tokenizer: {token_id}")


def token_bytes(token_id: int) -> list[int]:
    """The UTF-8 bytes of one token's text (lone surrogates as themselves, like CPython's
    ``surrogatepass``), as the ``bytes`` of an OpenAI logprob entry."""
    return list(token_text(token_id).encode("utf-8", "surrogatepass"))


def decode(ids: Iterable[int]) -> str:
    """The text of ``ids``: the inverse of :func:`encode`."""
    return "".join(token_text(i) for i in ids)
