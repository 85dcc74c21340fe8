"""The rollout graph: how a session's calls relate, from their exact token ids alone.

Each call (node) is linked to the earlier node whose prompt + completion shares the longest exact token prefix with
its prompt. A full match is a clean extension; a prompt that re-tokenises the earlier completion differently is a
child with *drift* at a position (a finding; each node's own ids stay exact); a prompt that branches inside the earlier
node's prompt is a sibling (a retry, a resample, a fork). Nodes that share no block of tokens with anything before are
roots: fresh conversations (the agent's main loop, subagents, auxiliary calls).

Linking cost does not grow with the number of nodes: every node's prefixes are indexed by a rolling hash at block
boundaries, so finding the parent costs one pass over the new prompt plus a few exact comparisons. Ids are kept as
int32 and logprobs as float32 arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from swe_gym_env.wire import Finding

BLOCK = 16  # prefix granularity of the index; a prompt sharing fewer tokens than this with every node is a root
MAX_PER_KEY = 8  # candidates kept per indexed prefix (siblings beyond this share the prefix with one already kept)
_MULT = np.uint64(0x9E3779B97F4A7C15)

Relation = Literal["root", "extends", "drift", "sibling"]


@dataclass
class Node:
    index: int
    prompt: np.ndarray  # int32
    completion: np.ndarray  # int32
    logprobs: np.ndarray  # float32
    parent: int | None = None
    relation: Relation = "root"
    base: int | None = None  # the earlier node whose prompt + completion shares the longest prefix with this prompt
    shared: int = 0  # how many tokens it shares
    root: int = 0
    children: list[int] = field(default_factory=list)
    discarded: bool = False

    @property
    def seq_len(self) -> int:
        return len(self.prompt) + len(self.completion)

    def seq(self) -> np.ndarray:
        return np.concatenate([self.prompt, self.completion])


class _PrefixHasher:
    """Polynomial prefix hashes mod 2**64, vectorised: H[i] = sum_{j<=i} (x_j + 1) * B^-j."""

    BASE = np.uint64(1_000_003)

    def __init__(self) -> None:
        inv = pow(int(self.BASE), -1, 2**64)
        self._inv = np.uint64(inv)
        self._pows = np.ones(1, dtype=np.uint64)

    def _powers(self, n: int) -> np.ndarray:
        if len(self._pows) < n:
            size = max(n, 2 * len(self._pows))
            with np.errstate(over="ignore"):
                p = np.full(size, self._inv, dtype=np.uint64)
                p[0] = 1
                self._pows = np.cumprod(p, dtype=np.uint64)
        return self._pows[:n]

    def block_keys(self, ids: np.ndarray) -> np.ndarray:
        """Keys of the prefixes of length BLOCK, 2·BLOCK, … (uint64)."""
        n = (len(ids) // BLOCK) * BLOCK
        if n == 0:
            return np.empty(0, dtype=np.uint64)
        with np.errstate(over="ignore"):
            h = np.cumsum((ids[:n].astype(np.uint64) + np.uint64(1)) * self._powers(n), dtype=np.uint64)
            lengths = np.arange(BLOCK, n + 1, BLOCK, dtype=np.uint64)
            return h[BLOCK - 1 :: BLOCK] ^ (lengths * _MULT)


def _lcp(a: np.ndarray, b: np.ndarray, start: int = 0) -> int:
    n = min(len(a), len(b))
    if start >= n:
        return n
    diff = np.flatnonzero(a[start:n] != b[start:n])
    return start + int(diff[0]) if len(diff) else n


def _lcp_node(query: np.ndarray, node: Node, start: int) -> int:
    """Longest common prefix of ``query`` and the node's prompt + completion, without concatenating them."""
    shared = _lcp(query, node.prompt, start)
    if shared < len(node.prompt) or shared == len(query):
        return shared
    return len(node.prompt) + _lcp(query[len(node.prompt) :], node.completion)


class RolloutGraph:
    """Nodes in call order; ``add`` links each new call and returns the findings it raised."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self._index: dict[int, list[int]] = {}
        self._hasher = _PrefixHasher()

    def add(self, prompt: list[int] | np.ndarray, completion: list[int] | np.ndarray, logprobs) -> list[Finding]:
        node, keys, findings = self.link(prompt, completion, logprobs)
        self.commit(node, keys)
        return findings

    def link(self, prompt, completion, logprobs) -> tuple[Node, np.ndarray, list[Finding]]:
        """Work out where a new call belongs, without changing the graph (``commit`` adds it)."""
        p = np.asarray(prompt, dtype=np.int32)
        c = np.asarray(completion, dtype=np.int32)
        node = Node(len(self.nodes), p, c, np.asarray(logprobs, dtype=np.float32))
        keys = self._hasher.block_keys(node.seq())
        return node, keys, self._link(node, keys[: len(p) // BLOCK])

    def commit(self, node: Node, keys: np.ndarray) -> None:
        if node.index != len(self.nodes):
            raise ValueError("commit the nodes in the order they were linked")
        self.nodes.append(node)
        if node.parent is not None:
            self.nodes[node.parent].children.append(node.index)
        # blocks before the shared prefix are indexed already (by the base node); from the last shared one on,
        # this node is a candidate too
        for key in keys[max(0, node.shared // BLOCK - 1) :].tolist():
            bucket = self._index.setdefault(key, [])
            if len(bucket) < MAX_PER_KEY:
                bucket.append(node.index)

    def _link(self, node: Node, keys: np.ndarray) -> list[Finding]:
        # prefixes are nested: if block k is indexed, so is every block before it -> binary search the deepest
        lo, hi = 0, len(keys)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if int(keys[mid - 1]) in self._index:
                lo = mid
            else:
                hi = mid - 1
        if lo == 0:
            node.root = node.index
            return []
        best, best_len, best_rank = -1, -1, (-1, -1)
        for cand in self._index[int(keys[lo - 1])]:
            m = self.nodes[cand]
            shared = _lcp_node(node.prompt, m, start=(lo - 1) * BLOCK)
            if shared < lo * BLOCK:  # a hash collision: not really this prefix
                continue
            # on a tie prefer the node this prompt extends exactly, then the one whose prompt it repeats, then
            # the latest
            rank = (shared, 2 if shared == m.seq_len else 1 if shared == len(m.prompt) else 0)
            if (rank, cand) > (best_rank, best):
                best, best_len, best_rank = cand, shared, rank
        if best < 0:
            node.root = node.index
            return []
        m = self.nodes[best]
        node.base, node.shared = best, best_len
        findings: list[Finding] = []
        if len(m.prompt) <= best_len < len(node.prompt) or best_len == m.seq_len:
            node.parent, node.root = best, m.root
            if best_len == m.seq_len:
                node.relation = "extends"
            else:
                node.relation = "drift"
                pos = best_len - len(m.prompt)
                findings.append(
                    Finding(
                        severity="warning",
                        code="drift",
                        message=f"call {node.index}'s prompt re-tokenises call {best}'s completion differently from "
                        f"token {pos} of {len(m.completion)} (prompt position {best_len}); each call keeps its own ids",
                        turn=node.index,
                    )
                )
        else:  # branches inside m's prompt (or repeats it): a sibling of m under m's parent
            node.relation = "sibling"
            node.parent, node.root = m.parent, m.root
            if m.parent is None:  # a second root with the same opening: a resample of a fresh conversation
                node.root = node.index
        return findings

    # -- reading -------------------------------------------------------------------------------------------------
    def roots(self) -> list[int]:
        return [n.index for n in self.nodes if n.parent is None]

    def mark_discarded(self) -> None:
        """Per root, the path to its latest leaf is kept; every other branch led nowhere and is discarded."""
        for n in self.nodes:
            n.discarded = True
        for r in self.roots():
            leaf = max(self._subtree(r))
            i: int | None = leaf
            while i is not None:
                self.nodes[i].discarded = False
                i = self.nodes[i].parent

    def _subtree(self, r: int) -> list[int]:
        out, stack = [], [r]
        while stack:
            i = stack.pop()
            out.append(i)
            stack.extend(self.nodes[i].children)
        return out

    def leaves(self) -> list[int]:
        return [n.index for n in self.nodes if not n.children]

    def path(self, leaf: int) -> list[int]:
        out: list[int] = []
        i: int | None = leaf
        while i is not None:
            out.append(i)
            i = self.nodes[i].parent
        return out[::-1]

    def sequences(self) -> list[dict]:
        """Training sequences: one per leaf, split where the path drifts (tokens never sampled together are never
        spliced). Each has the leaf segment's full token ids, a loss mask (1 = sampled by the engine) and the
        captured logprob of every masked token (0.0 elsewhere)."""
        out = []
        for leaf in self.leaves():
            path = self.path(leaf)
            segment: list[int] = []
            for i in path:
                if segment and self.nodes[i].relation != "extends":
                    out.append(self._segment(segment, leaf))
                    segment = []
                segment.append(i)
            out.append(self._segment(segment, leaf))
        return out

    def _segment(self, members: list[int], leaf: int) -> dict:
        last = self.nodes[members[-1]]
        tokens = last.seq()
        mask = np.zeros(len(tokens), dtype=np.int8)
        lps = np.zeros(len(tokens), dtype=np.float32)
        for i in members:
            n = self.nodes[i]
            a, b = len(n.prompt), n.seq_len
            mask[a:b] = 1
            lps[a:b] = n.logprobs
        return {
            "turns": members,
            "discarded": self.nodes[leaf].discarded,
            "token_ids": tokens.tolist(),
            "loss_mask": mask.tolist(),
            "logprobs": lps.tolist(),
        }

    def stored_bytes(self) -> int:
        return sum(n.prompt.nbytes + n.completion.nbytes + n.logprobs.nbytes for n in self.nodes)
