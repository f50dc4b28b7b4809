"""The KV cache of the simulated engine's capacity model: fixed-size blocks, prefix caching.

As vLLM's block manager: a sequence holds a block per ``block_size`` tokens it has computed
(and one for the next token). A full block is named by the hash of its tokens and of every
token before it (a chain), so two sequences with the same prefix share its blocks. A block no
sequence holds stays cached, in least-recently-freed order, until a new block needs its room
(LRU eviction). A sequence's partial last block is its own.

A sequence's whole ids (prompt and the completion it will produce) are known when it is
submitted (the simulated model plans its answer at once), so its block hashes are computed
once; what it has *computed* grows a token per decode step.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

__all__ = ["KVCache", "Seq"]


class Seq:
    """One sequence: ``prompt`` ids then ``length`` completion tokens (the ids of both in
    ``ids``); ``on_done`` is called when its last token is produced."""

    __slots__ = ("generated", "hashes", "held", "ids", "length", "on_done", "private", "prompt")

    def __init__(
        self, ids: Sequence[int], prompt: int, block_size: int, on_done: Callable[[], None] | None = None
    ) -> None:
        if not 0 <= prompt <= len(ids):
            raise ValueError(f"`prompt` must be within the {len(ids)} ids, got {prompt}")
        self.ids, self.prompt, self.length = ids, prompt, len(ids) - prompt
        self.generated = 0
        self.hashes = _chain(ids, block_size)
        self.held: list[int] = []
        """The hashes of the full blocks it holds (its computed prefix)."""
        self.private = 0
        """Blocks it holds that are not full yet (its last one)."""
        self.on_done = on_done

    @property
    def computed(self) -> int:
        """Tokens in its KV cache: the prompt and the tokens produced (recomputed after a
        preemption)."""
        return self.prompt + self.generated

    @property
    def finished(self) -> bool:
        return self.generated >= self.length


def _chain(ids: Sequence[int], block_size: int) -> list[int]:
    """The chained hash of each full block of ``ids``."""
    hashes, h = [], 0
    for start in range(0, len(ids) - block_size + 1, block_size):
        h = hash((h, tuple(ids[start : start + block_size])))
        hashes.append(h)
    return hashes


class KVCache:
    """``blocks`` blocks of ``block_size`` tokens, shared by prefix."""

    def __init__(self, blocks: int, block_size: int) -> None:
        self.blocks, self.block_size = blocks, block_size
        self._refs: dict[int, int] = {}
        """Full blocks some sequence holds: hash → how many hold it."""
        self._lru: OrderedDict[int, None] = OrderedDict()
        """Full blocks no sequence holds, still cached: least recently freed first."""
        self._private = 0

    @property
    def used(self) -> int:
        """Blocks held by sequences (what vLLM's ``kv_cache_usage_perc`` counts)."""
        return len(self._refs) + self._private

    def cached(self, h: int) -> bool:
        return h in self._refs or h in self._lru

    def _room(self, wanted: int) -> bool:
        """Make ``wanted`` blocks free, evicting unheld cached blocks oldest first."""
        while self.blocks - self.used - len(self._lru) < wanted:
            if not self._lru:
                return False
            self._lru.popitem(last=False)
        return True

    def admit(self, seq: Seq) -> int | None:
        """Give ``seq`` the blocks of what it has computed and of its next token; the tokens
        found in the cache (its leading cached blocks), or ``None`` if there is no room."""
        full = seq.hashes[: seq.computed // self.block_size]
        hits = 0
        while hits < len(full) and self.cached(full[hits]):
            hits += 1
        missing = sum(1 for h in full[hits:] if not self.cached(h))
        # Free blocks and unheld cached ones can make its room, but not the cached ones it reuses.
        reusable = sum(1 for h in full if h in self._lru)
        if self.blocks - self.used - reusable < missing + 1:
            return None
        for h in full:
            self._hold(h)
        self._room(missing + 1)
        for h in full:
            self._refs.setdefault(h, 1)
        seq.held, seq.private = list(full), 1
        self._private += 1
        return hits * self.block_size

    def _hold(self, h: int) -> None:
        if h in self._refs:
            self._refs[h] += 1
        elif h in self._lru:
            del self._lru[h]
            self._refs[h] = 1

    def grow(self, seq: Seq) -> bool:
        """Room for ``seq``'s next token: a new block when its last one is full (``False``:
        none is free, so someone must be preempted)."""
        if seq.computed + 1 <= (len(seq.held) + seq.private) * self.block_size:
            return True
        if not self._room(1):
            return False
        seq.private += 1
        self._private += 1
        return True

    def produced(self, seq: Seq) -> None:
        """``seq`` computed one more token: a block it filled becomes a shared, named one."""
        seq.generated += 1
        if seq.computed % self.block_size or seq.computed // self.block_size > len(seq.hashes):
            return
        h = seq.hashes[seq.computed // self.block_size - 1]
        seq.private -= 1
        self._private -= 1
        self._hold(h)
        self._refs.setdefault(h, 1)
        seq.held.append(h)

    def release(self, seq: Seq) -> None:
        """``seq`` finished or was preempted: its named blocks stay cached, its last goes."""
        for h in reversed(seq.held):  # the tail is evicted first, as vLLM frees it
            n = self._refs[h] - 1
            if n:
                self._refs[h] = n
            else:
                del self._refs[h]
                self._lru[h] = None
        self._private -= seq.private
        seq.held, seq.private = [], 0
