"""The rollout graph: how a session's calls relate, from their exact token ids alone.

Each call (node) is compared with the earlier node whose prompt + completion shares the longest exact token prefix
with its prompt. Sharing that node's whole prompt makes it the parent: a full match of prompt + completion is a clean
extension; a prompt that re-tokenises the completion differently is a child with *drift* at a position (a finding;
each node's own ids stay exact). A prompt that branches inside that node's prompt (a retry or resample repeats it
exactly; a rewritten history forks earlier) hangs under the deepest ancestor whose whole prompt it holds, or is a
root when there is none. Nodes that share no block of tokens with anything before are roots: fresh conversations
(the agent's main loop, subagents, auxiliary calls). ``finalize`` marks abandoned calls (retried, or unused by the
agent) as discarded and each call's role; ``segments`` cuts the graph into training sequences.

Linking cost does not grow with the number of nodes: every node's prefixes are indexed by a rolling hash at block
boundaries, so finding the parent costs one pass over the new prompt plus a few exact comparisons. Ids are kept as
int32 and logprobs as float64 arrays (the engine's values exactly). Calls share storage: a call that extends the call
at the tip of a chain's arena appends its new tokens there (its prompt and completion are views); one that forks
keeps a copy of its own, which later calls extending it grow. A linear conversation costs about its final context.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from swe_gym_env.trace.compact import materialize
from swe_gym_env.wire import Finding

BLOCK = 16  # prefix granularity of the index; a prompt sharing fewer tokens than this with every node is a root
MAX_PER_KEY = 8  # candidates kept per indexed prefix (siblings beyond this share the prefix with one already kept)
_MULT = np.uint64(0x9E3779B97F4A7C15)

Relation = Literal["root", "extends", "drift"]
Role = Literal["agent", "aux"]


class Arena:
    """A growing int32 buffer holding one chain of calls' tokens: a call that extends the call at its tip appends its
    new tokens, so a linear conversation costs its final context (plus growth room), not the sum of its prompts."""

    __slots__ = ("buf", "size")

    def __init__(self, ids: np.ndarray) -> None:
        self.buf = ids
        self.size = len(ids)

    def append(self, ids: np.ndarray) -> None:
        end = self.size + len(ids)
        if end > len(self.buf):
            grown = np.empty(max(end, 2 * len(self.buf), 1024), dtype=np.int32)
            grown[: self.size] = self.buf[: self.size]
            self.buf = grown
        self.buf[self.size : end] = ids
        self.size = end

    @property
    def nbytes(self) -> int:
        return self.buf.nbytes

    def trim(self) -> None:
        """Drop the growth room (nodes read views of ``buf`` afresh, so none is left pointing at the old one)."""
        if len(self.buf) > self.size:
            self.buf = self.buf[: self.size].copy()


class Node:
    """A call: its prompt + completion are ``[off, off + seq_len)`` of an arena it may share with the calls it
    continues (views, never copies)."""

    __slots__ = (
        "arena",
        "base",
        "children",
        "completion_len",
        "discarded",
        "index",
        "logprobs",
        "off",
        "parent",
        "prompt_len",
        "relation",
        "retry_of",
        "role",
        "root",
        "shared",
    )

    def __init__(self, index: int, prompt: np.ndarray, completion: np.ndarray, logprobs: np.ndarray) -> None:
        self.index = index
        self.logprobs = logprobs  # float64: exactly the values the engine sent
        self.parent: int | None = None  # the call whose whole prompt this prompt holds (None: a root)
        self.relation: Relation = "root"  # extends: holds the parent's prompt + completion exactly; drift: re-tokenised
        self.retry_of: int | None = None  # an earlier call with exactly this prompt (a retry or resample)
        self.base: int | None = None  # the earlier node whose prompt + completion shares the longest prefix
        self.shared = 0  # how many tokens it shares
        self.root = 0
        self.children: list[int] = []
        self.discarded = False
        self.role: Role = "agent"
        self.arena = Arena(np.concatenate([prompt, completion]).astype(np.int32, copy=False))  # its own until commit
        self.off = 0
        self.prompt_len = len(prompt)
        self.completion_len = len(completion)

    @property
    def prompt(self) -> np.ndarray:  # int32, a view
        return self.arena.buf[self.off : self.off + self.prompt_len]

    @property
    def completion(self) -> np.ndarray:  # int32, a view
        start = self.off + self.prompt_len
        return self.arena.buf[start : start + self.completion_len]

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.completion_len

    def seq(self) -> np.ndarray:
        return self.arena.buf[self.off : self.off + self.seq_len]

    def at_tip(self) -> bool:
        return self.arena.size == self.off + self.seq_len


@dataclass
class Segment:
    """One training sequence: calls in order, each extending the previous exactly."""

    turns: list[int]
    role: Role
    discarded: bool


class _PrefixHasher:
    """Polynomial prefix hashes mod 2**64, vectorised: H[i] = sum_{j<=i} (x_j + 1) * B^-j. The table of powers is
    shared by every graph (it only grows: one table for the longest prompt seen, not one per session)."""

    BASE = np.uint64(1_000_003)
    _inv = np.uint64(pow(int(BASE), -1, 2**64))
    _pows = np.ones(1, dtype=np.uint64)

    @classmethod
    def _powers(cls, n: int) -> np.ndarray:
        if len(cls._pows) < n:
            size = max(n, 2 * len(cls._pows))
            with np.errstate(over="ignore"):
                p = np.full(size, cls._inv, dtype=np.uint64)
                p[0] = 1
                cls._pows = np.cumprod(p, dtype=np.uint64)
        return cls._pows[:n]

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
        # indexed prefix -> the node with it (an int: most prefixes have one) or the nodes (a list, up to MAX_PER_KEY)
        self._index: dict[int, int | list[int]] = {}
        self._hasher = _PrefixHasher()
        self.sealed = False

    def add(self, prompt: list[int] | np.ndarray, completion: list[int] | np.ndarray, logprobs) -> list[Finding]:
        node, keys, findings = self.link(prompt, completion, logprobs)
        self.commit(node, keys)
        return findings

    def link(self, prompt, completion, logprobs) -> tuple[Node, np.ndarray, list[Finding]]:
        """Work out where a new call belongs, without changing the graph (``commit`` adds it)."""
        if self.sealed:
            raise ValueError("the graph is sealed: its session closed")
        p = np.asarray(prompt, dtype=np.int32)
        c = np.asarray(completion, dtype=np.int32)
        node = Node(len(self.nodes), p, c, np.asarray(logprobs, dtype=np.float64))
        keys = self._hasher.block_keys(node.seq())
        return node, keys, self._link(node, keys[: len(p) // BLOCK])

    def commit(self, node: Node, keys: np.ndarray) -> None:
        if node.index != len(self.nodes):
            raise ValueError("commit the nodes in the order they were linked")
        base = self.nodes[node.base] if node.base is not None else None
        if base is not None and node.shared == base.seq_len and base.at_tip():  # continues the chain at its tip
            own = node.seq()
            base.arena.append(own[node.shared :])
            node.arena, node.off = base.arena, base.off
        self.nodes.append(node)
        if node.parent is not None:
            self.nodes[node.parent].children.append(node.index)
        # blocks before the shared prefix are indexed already (by the base node); from the last shared one on,
        # this node is a candidate too
        todo = keys[max(0, node.shared // BLOCK - 1) :].tolist()
        index = self._index
        fresh = set(todo).difference(index)
        index.update(dict.fromkeys(fresh, node.index))  # a fresh prompt's blocks in one step (C loops, not Python's)
        if len(fresh) == len(todo):
            return
        for key in todo:
            if key in fresh:
                continue
            bucket = index[key]
            if isinstance(bucket, int):
                index[key] = [bucket, node.index]
            elif len(bucket) < MAX_PER_KEY:
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
        bucket = self._index[int(keys[lo - 1])]
        for cand in (bucket,) if isinstance(bucket, int) else bucket:
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
        same_prompt = best_len == len(node.prompt) == len(m.prompt)
        if best_len >= len(m.prompt) and not same_prompt:
            return self._attach(node, best, best_len)
        if same_prompt:
            node.retry_of = best
        # the branch point lies inside m's prompt: the parent is m's deepest ancestor whose whole prompt this prompt
        # shares (an ancestor's prompt is a prefix of its descendants' prompts: children share all of it)
        a = m.parent
        while a is not None and len(self.nodes[a].prompt) > best_len:
            a = self.nodes[a].parent
        if a is None:  # branches inside a root's own prompt: a fresh conversation (or a resample of one)
            node.root = node.index
            return []
        anc = self.nodes[a]
        return self._attach(node, a, _lcp_node(node.prompt, anc, start=len(anc.prompt)))

    def _attach(self, node: Node, parent: int, shared: int) -> list[Finding]:
        """Make ``parent`` (whose whole prompt this prompt holds) the node's parent: an exact extension, or drift."""
        p = self.nodes[parent]
        node.parent, node.root = parent, p.root
        if shared == p.seq_len:
            node.relation = "extends"
            return []
        node.relation = "drift"
        pos = shared - len(p.prompt)
        return [
            Finding(
                severity="warning",
                code="drift",
                message=f"call {node.index}'s prompt re-tokenises call {parent}'s completion differently from "
                f"token {pos} of {len(p.completion)} (prompt position {shared}); each call keeps its own ids",
                turn=node.index,
            )
        ]

    def seal(self) -> None:
        """No more calls (the session closed): free the prefix index and the arenas' growth room; reading stays."""
        self.sealed = True
        self._index = {}
        for arena in {id(n.arena): n.arena for n in self.nodes}.values():
            arena.trim()

    # -- reading -------------------------------------------------------------------------------------------------
    def roots(self) -> list[int]:
        return [n.index for n in self.nodes if n.parent is None]

    def _subtree(self, r: int) -> list[int]:
        out, stack = [], [r]
        while stack:
            i = stack.pop()
            out.append(i)
            stack.extend(self.nodes[i].children)
        return out

    def finalize(self, demoted: Iterable[int] = ()) -> None:
        """Mark discarded calls and roles (idempotent; called when the session closes, and again on re-reading).

        A call is *discarded* when it was abandoned: a later call repeats its exact prompt (a retry or resample) and
        its branch never grew after that retry was made; or the agent's own record shows it never used the call
        (``demoted``). Everything below a discarded call is discarded too. Branches that rewrite the history (the
        same opening, then a different prompt) are not abandoned: their calls were acted on, so they are kept.

        Roles: conversations (roots) that branch from one another's prompt (a shared opening of at least one block:
        a compaction restart, a resample, a subagent with the agent's own system prompt) form a family; the family
        with the most calls is the agent's (``agent``), every other call is ``aux``.
        """
        for n in self.nodes:
            n.discarded = False
        abandoned = set(demoted)
        for n in self.nodes:
            if n.retry_of is not None and max(self._subtree(n.retry_of)) < n.index:
                abandoned.add(n.retry_of)
        for i in sorted(abandoned):
            if 0 <= i < len(self.nodes):
                for j in self._subtree(i):
                    self.nodes[j].discarded = True
        family = list(range(len(self.nodes)))  # union-find over roots

        def find(i: int) -> int:
            while family[i] != i:
                family[i] = family[family[i]]
                i = family[i]
            return i

        for n in self.nodes:
            if n.parent is None and n.base is not None:
                family[find(n.index)] = find(self.nodes[n.base].root)
        sizes = Counter(find(n.root) for n in self.nodes)
        main = max(sizes, key=lambda f: (sizes[f], -f)) if sizes else None
        for n in self.nodes:
            n.role = "agent" if find(n.root) == main else "aux"

    def segments(self) -> list[Segment]:
        """Training sequences: every call belongs to exactly one. A call continues its parent's sequence when it
        extends the parent exactly and is the first such continuation (of the same kept/discarded kind); otherwise
        (a root, drift, a second branch) it starts a sequence of its own, whose prompt carries the earlier tokens as
        context. Tokens are therefore never trained twice, and tokens never sampled together are never spliced."""
        out: list[Segment] = []
        seg_of: dict[int, int] = {}
        for n in self.nodes:
            p = n.parent
            k = seg_of.get(p) if p is not None else None
            if (
                p is not None
                and k is not None
                and n.relation == "extends"
                and out[k].turns[-1] == p
                and self.nodes[p].discarded == n.discarded
            ):
                out[k].turns.append(n.index)
            else:
                k = len(out)
                out.append(Segment([n.index], n.role, n.discarded))
            seg_of[n.index] = k
        return out

    def sequences(self) -> list[dict]:
        """The segments with their tokens: ids, loss mask (1 = sampled by the engine) and logprobs (0.0 elsewhere)."""
        docs = []
        for s in self.segments():
            nodes = [self.nodes[i] for i in s.turns]
            ids, mask, lps = materialize(
                nodes[-1].prompt.tolist(),
                [(len(n.prompt), n.completion.tolist(), n.logprobs.tolist()) for n in nodes],
            )
            docs.append(
                {
                    "turns": s.turns,
                    "role": s.role,
                    "discarded": s.discarded,
                    "token_ids": ids,
                    "loss_mask": mask,
                    "logprobs": lps,
                }
            )
        return docs

    def stored_bytes(self) -> int:
        arenas = {id(n.arena): n.arena.nbytes for n in self.nodes}
        return sum(arenas.values()) + sum(n.logprobs.nbytes for n in self.nodes)
