"""Automatic prefix caching, as vLLM's: one replica's cached blocks of shared prompt prefixes.

Requests of a prefix group open their prompts with the same tokens (a system prompt, a
few-shot header). The cache keeps, per group, a chain of the leading *full* blocks of that
prefix (`block_tokens` each; a partial block is never cached). A block is *pinned* while a
running request references it and *evictable* once none does: it stays cached in the free
KV space until room is needed, then goes least recently freed first, as vLLM's free-block
queue hands blocks out. Within a group the tail goes first (vLLM frees a request's blocks in
reverse order, and a later block is never used by more requests than an earlier one), so
what a group keeps is always a leading run of its chain and a lookup is one comparison.

Pure bookkeeping in blocks, no SimPy: the engine (colocated prefill) and the cluster's
prefill pool (disaggregated) own one each and do the token accounting around it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PrefixCache:
    """A replica's cached prefix blocks: per group a chain of leading blocks, evicted LRU."""

    block_tokens: int
    cached: dict[int, int] = field(default_factory=dict)  # group -> leading blocks cached
    # group -> {blocks referenced: running requests referencing that many}
    users: dict[int, dict[int, int]] = field(default_factory=dict)
    # group -> when each cached block was last freed (a counter, not sim time); ticks never
    # increase along a chain, so the oldest free block of all is some group's tail
    freed_at: dict[int, list[int]] = field(default_factory=dict)
    cached_blocks: int = 0
    pinned_blocks: int = 0
    tick: int = 0
    # what the run's lookups found (the summary's prefix_cache block)
    prompt_tokens: int = 0  # fresh prompts looked up
    cached_tokens: int = 0  # of those, found cached (their prefill skipped)
    saved_tokens: int = 0  # every lookup's hits, recomputations after preemption included
    evicted_blocks: int = 0

    @property
    def evictable_blocks(self) -> int:
        return self.cached_blocks - self.pinned_blocks

    def pinned(self, group: int) -> int:
        """Return the leading blocks of `group` some running request references."""
        refs = self.users.get(group)
        return max(refs) if refs else 0

    def lookup(self, group: int, shared_tokens: int, prompt_tokens: int) -> int:
        """Return how many leading blocks a prompt finds cached (its prefill skips them).

        Only full blocks of the shared part count, and at least one prompt token is left
        to compute: a fully cached prompt recomputes its last block to get the logits that
        emit its first token (vLLM caps a hit at prompt − 1 tokens, in whole blocks).
        """
        if group < 0:
            return 0
        usable = min(shared_tokens, prompt_tokens - 1) // self.block_tokens
        return min(self.cached.get(group, 0), max(usable, 0))

    def count(self, prompt_tokens: int, hit_blocks: int, fresh: bool) -> None:
        """Record one lookup's outcome: a fresh prompt's, or a preempted request's recomputation."""
        hit = hit_blocks * self.block_tokens
        self.saved_tokens += hit
        if fresh:
            self.prompt_tokens += prompt_tokens
            self.cached_tokens += hit

    def newly_pinned(self, group: int, blocks: int) -> int:
        """Return how many of `group`'s first `blocks` blocks are evictable now (acquiring them
        takes them out of the free space)."""
        return max(blocks - self.pinned(group), 0)

    def acquire(self, group: int, blocks: int) -> None:
        """A running request references `group`'s first `blocks` cached blocks (0: nothing)."""
        if group < 0 or blocks <= 0:
            return
        self.pinned_blocks += self.newly_pinned(group, blocks)
        refs = self.users.setdefault(group, {})
        refs[blocks] = refs.get(blocks, 0) + 1

    def release(self, group: int, blocks: int) -> int:
        """A request stops referencing `group`'s first `blocks` blocks; return the blocks that
        became evictable (they are freed now: the most recently used of all)."""
        if group < 0 or blocks <= 0:
            return 0
        refs = self.users[group]
        before = max(refs)
        refs[blocks] -= 1
        if not refs[blocks]:
            del refs[blocks]
        after = max(refs) if refs else 0
        if not refs:
            del self.users[group]
        freed = before - after
        if freed:
            self.tick += 1
            ticks = self.freed_at[group]
            ticks[after:before] = [self.tick] * freed
            self.pinned_blocks -= freed
        return freed

    def extend(self, group: int, held: int, blocks: int) -> int:
        """A request holding `held` blocks of `group` has computed its prompt up to `blocks`
        full shared blocks: cache them, now referenced by it. Return the blocks moved from the
        request's own KV into the cache (they are then counted once, whoever reuses them).

        Only a request whose references reach the end of the group's chain extends it; one
        that computed blocks another request cached meanwhile keeps its duplicates private,
        as vLLM keeps both copies.
        """
        if group < 0 or blocks <= held or self.cached.get(group, 0) != held:
            return 0
        grown = blocks - held
        self.cached[group] = blocks
        self.cached_blocks += grown
        self.freed_at.setdefault(group, []).extend([0] * grown)
        refs = self.users.setdefault(group, {})
        if held:
            refs[held] -= 1
            if not refs[held]:
                del refs[held]
        refs[blocks] = refs.get(blocks, 0) + 1
        self.pinned_blocks += grown  # its `held` blocks were pinned by it already
        return grown

    def evict(self, blocks: int) -> int:
        """Evict up to `blocks` evictable blocks, least recently freed first; return how many went."""
        gone = 0
        while gone < blocks:
            tails = [(self.freed_at[g][n - 1], g) for g, n in self.cached.items() if n > self.pinned(g)]
            if not tails:
                break
            tails.sort()
            _, g = tails[0]
            runner_up = tails[1][0] if len(tails) > 1 else None
            ticks, floor = self.freed_at[g], self.pinned(g)
            n = self.cached[g]
            # a whole run of this group's tail that is older than every other group's tail
            while gone < blocks and n > floor and (runner_up is None or ticks[n - 1] <= runner_up):
                n -= 1
                gone += 1
            del ticks[n:]
            self.cached_blocks -= self.cached[g] - n
            if n:
                self.cached[g] = n
            else:
                del self.cached[g], self.freed_at[g]
        self.evicted_blocks += gone
        return gone

    def fit(self, free_tokens: int) -> None:
        """Evict until the evictable blocks fit in `free_tokens` of free KV space."""
        over = self.evictable_blocks * self.block_tokens - max(free_tokens, 0)
        if over > 0:
            self.evict(-(-over // self.block_tokens))


def prefix_cache_summary(caches: list[PrefixCache]) -> dict[str, Any]:
    """The summary's `prefix_cache` block over a run's caches (one per replica or pool instance).

    Counted over every prompt the run looked up, not only the steady window's: the cold
    misses that fill the cache are part of what it saves.
    """
    prompt = sum(c.prompt_tokens for c in caches)
    cached = sum(c.cached_tokens for c in caches)
    return {
        "block_tokens": caches[0].block_tokens if caches else None,
        "prompt_tokens": prompt,
        "cached_prompt_tokens": cached,
        "hit_rate": cached / prompt if prompt else float("nan"),
        "prefill_tokens_saved": sum(c.saved_tokens for c in caches),
        "evicted_blocks": sum(c.evicted_blocks for c in caches),
        "note": "hit_rate = cached prompt tokens / prompt tokens over every fresh prompt of the run; "
                "prefill_tokens_saved also counts recomputations after preemption",
    }
