"""A stored result fetched in pieces: the summary MCP `tools/call` returns, the resource pages, and the streamed HTTP
form (issue 34).

- **Pages.** A page is a byte range of the result's JSON as stored (`ResultsStore.path_of`), cut where no UTF-8
  character is split, so the pages' texts joined are the file, byte for byte. A page's text travels inside a JSON
  string (MCP `resources/read`), where `"` and `\\` become two bytes and control bytes up to six: pages are cut so
  that this escaped size, not only the raw one, stays within `PAGE_BYTES` (512 KiB), well under the official Python
  SDK's 1 MiB SSE event limit. The manifest of a file (its size, SHA-256 and page bounds) is computed by one pass
  over it in 1 MiB chunks (never the whole file in memory) and cached by (size, mtime).
- **Summary.** `summarize` builds the `ResultSummary` (wire.py) from a result and its manifest, kept within
  `SUMMARY_BYTES` (its JSON travels twice in a tool result: structuredContent and the same text).
- **HTTP.** `stream_response` serves the file itself: `Range` (one range: 206; unsatisfiable: 416), gzip when asked
  for and no range is, `ETag` (the SHA-256), read in chunks off the event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from swe_gym_env.trace.forms import summary_of
from swe_gym_env.wire import Finding, GradingSummary, ResultSummary, RolloutResult

PAGE_BYTES = 512 * 1024  # a page's text, JSON-escaped as it travels in resources/read
SUMMARY_BYTES = 256 * 1024  # a whole tools/call result (the summary's JSON twice, links, envelope)
BLOCK = 16 * 1024  # pages are cut on (UTF-8-safe) block bounds
CHUNK = 1024 * 1024  # reads of a result file
MAX_FINDINGS = 100
MAX_FAILED_TESTS = 50
MAX_LINKS = 64  # resource_link blocks in a tool result (every page is also in page_uris)
MAX_PAGE_URIS = 2000  # 2000 pages of 512 KiB: results up to ~1 GB listed page by page
MANIFESTS = 256
RESULT_URI = "swe-gym://rollouts/{rollout_id}/result"
PAGE_URI = "swe-gym://rollouts/{rollout_id}/result/pages/{page}"
HTTP_PATH = "/rollouts/{rollout_id}/result"
_CTRL = bytes(range(32))


def result_uri(rollout_id: str) -> str:
    return RESULT_URI.format(rollout_id=rollout_id)


def page_uri(rollout_id: str, page: int) -> str:
    return PAGE_URI.format(rollout_id=rollout_id, page=page)


@dataclass(frozen=True)
class Manifest:
    """A stored result file: its size, SHA-256 and page bounds (``bounds[k]`` to ``bounds[k + 1]``)."""

    rollout_id: str
    path: Path
    size: int
    mtime_ns: int
    sha256: str
    bounds: tuple[int, ...]

    @property
    def pages(self) -> int:
        return len(self.bounds) - 1

    def span(self, page: int) -> tuple[int, int]:
        if not 0 <= page < self.pages:
            raise IndexError(f"page {page} of {self.pages}")
        return self.bounds[page], self.bounds[page + 1]

    def meta(self, page: int) -> dict:
        start, end = self.span(page)
        return {
            "rollout_id": self.rollout_id,
            "page": page,
            "pages": self.pages,
            "start": start,
            "end": end,
            "bytes": self.size,
            "sha256": self.sha256,
            # every page, while the list stays small (the summary always has them all)
            "page_uris": [page_uri(self.rollout_id, k) for k in range(self.pages)] if self.pages <= 64 else None,
        }


def escaped_cost(block: bytes) -> int:
    """Bytes of ``block``'s text once written inside a JSON string (an upper bound: every control byte as \\u00XX)."""
    ctrl = len(block) - len(block.translate(None, _CTRL))
    return len(block) + block.count(b'"') + block.count(b"\\") + 5 * ctrl


def _cut(buf: bytes | bytearray, at: int) -> int:
    """``at`` moved forward past UTF-8 continuation bytes (a character is never split)."""
    while at < len(buf) and (buf[at] & 0xC0) == 0x80:
        at += 1
    return at


def scan(path: Path, rollout_id: str, page_bytes: int = PAGE_BYTES) -> Manifest:
    """One pass over a result file: SHA-256 and page bounds. Raises OSError (gone) as it comes."""
    h = hashlib.sha256()
    bounds = [0]
    cost = 0  # escaped bytes of the page being filled
    offset = 0  # file offset of buf[pos]
    buf, pos = b"", 0
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        eof = False
        while True:
            if not eof and len(buf) - pos < BLOCK + 4:
                chunk = f.read(CHUNK)
                if chunk:
                    h.update(chunk)
                    buf, pos = buf[pos:] + chunk, 0
                    continue
                eof = True
            if pos >= len(buf):
                break
            end = _cut(buf, pos + BLOCK) if len(buf) - pos > BLOCK else len(buf)
            c = escaped_cost(buf[pos:end])
            if cost and cost + c > page_bytes:
                bounds.append(offset)
                cost = 0
            cost += c
            offset += end - pos
            pos = end
    size = offset
    if size == 0 or bounds[-1] != size:
        bounds.append(size)
    return Manifest(rollout_id, path, size, st.st_mtime_ns, h.hexdigest(), tuple(bounds))


class Manifests:
    """Manifests of stored result files, cached by (size, mtime): a file stored again is scanned again."""

    def __init__(self, limit: int = MANIFESTS) -> None:
        self.limit = limit
        self._cache: OrderedDict[str, Manifest] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: Path, rollout_id: str) -> Manifest:
        st = path.stat()
        with self._lock:
            hit = self._cache.get(rollout_id)
            if hit is not None and hit.path == path and (hit.size, hit.mtime_ns) == (st.st_size, st.st_mtime_ns):
                self._cache.move_to_end(rollout_id)
                return hit
        m = scan(path, rollout_id)
        with self._lock:
            self._cache[rollout_id] = m
            while len(self._cache) > self.limit:
                self._cache.popitem(last=False)
        return m

    def read_page(self, path: Path, rollout_id: str, page: int) -> tuple[str, Manifest]:
        """A page's text and the manifest it belongs to (rescanned if the file changed under it)."""
        for _ in range(3):
            m = self.get(path, rollout_id)
            start, end = m.span(page)
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                f.seek(start)
                data = f.read(end - start)
            if (st.st_size, st.st_mtime_ns) == (m.size, m.mtime_ns) and len(data) == end - start:
                return data.decode("utf-8"), m
        raise OSError(f"result {rollout_id} kept changing while it was read")


# -- the summary ----------------------------------------------------------------------------------------------------
def _grading(result: RolloutResult) -> GradingSummary | None:
    g = result.grading
    if g is None:
        return None
    failed = [*(g.fail_to_pass.get("failure") or []), *(g.pass_to_pass.get("failure") or [])]
    return GradingSummary(
        resolution=g.resolution,
        graded_by=g.graded_by,
        parser=g.parser,
        junit_cross_check=g.junit_cross_check,
        integrity=g.integrity,
        fail_to_pass={k: len(v) for k, v in g.fail_to_pass.items()},
        pass_to_pass={k: len(v) for k, v in g.pass_to_pass.items()},
        failed_tests=[t[:300] for t in failed[:MAX_FAILED_TESTS]],
    )


def _findings(result: RolloutResult, limit: int) -> list[Finding]:
    order = {"fatal": 0, "warning": 1, "info": 2}
    ranked = sorted(result.findings, key=lambda f: order.get(f.severity, 3))[:limit]
    return [f.model_copy(update={"message": f.message[:500]}) for f in ranked]


def counts(result: RolloutResult, result_bytes: int | None) -> dict[str, int]:
    out = {
        "calls": len(result.turns),
        "sequences": len(result.sequences),
        "trainable_sequences": sum(1 for s in result.sequences if not s.discarded),
        "completion_tokens": sum(len(t.completion_token_ids) for t in result.turns),
        "last_prompt_tokens": result.turns[-1].prompt_len if result.turns else 0,
        "max_prompt_tokens": max((t.prompt_len for t in result.turns), default=0),
        "prompt_tokens_total": sum(t.prompt_len for t in result.turns),
        "model_patch_bytes": len((result.model_patch or "").encode()),
    }
    if result_bytes is not None:
        out["result_bytes"] = result_bytes
    return out


def base_summary(result: RolloutResult) -> ResultSummary:
    """The summary of a result without where its pages are (kept in the results index, so a summary is read
    without parsing the result)."""
    summary = summary_of(
        result,
        ResultSummary,
        stop_reason=result.stop_reason,
        grading=_grading(result),
        integrity=result.grading.integrity if result.grading else None,
        findings=_findings(result, MAX_FINDINGS),
        findings_total=len(result.findings),
        cross_check=result.cross_check,
        cross_check_detail=result.cross_check_detail[:2000],
        capture_level=result.capture_level,
        logprobs_mode=result.logprobs_mode,
        timings=result.timings,
        wall_s=result.wall_s,
        agent_exit_code=result.agent_exit_code,
        counts=counts(result, None),
    )
    assert isinstance(summary, ResultSummary)
    return summary


def with_pages(s: ResultSummary, manifest: Manifest | None, note: str | None = None) -> ResultSummary:
    """The summary with where the whole result is (its pages), within SUMMARY_BYTES / 2 (its JSON travels twice)."""
    rid = s.rollout_id
    pages = manifest.pages if manifest is not None else 0
    if manifest is None:
        why = "the whole result is not stored on this server (see error), so it has no pages to fetch"
        note = f"{note}; {why}" if note else why
    s = s.model_copy(
        update={
            "counts": {**s.counts, **({"result_bytes": manifest.size} if manifest else {})},
            "result_bytes": manifest.size if manifest else None,
            "sha256": manifest.sha256 if manifest else None,
            "pages": pages,
            "result_uri": result_uri(rid) if pages else None,
            "page_uris": [page_uri(rid, k) for k in range(min(pages, MAX_PAGE_URIS))],
            "http_path": HTTP_PATH.format(rollout_id=rid) if pages else None,
            "note": note,
        }
    )
    limit = SUMMARY_BYTES // 2 - 16 * 1024  # twice over, plus the links and the envelope
    while len(s.model_dump_json()) > limit and (s.findings or len(s.page_uris) > 1):  # pathological sizes only
        s.findings = s.findings[: len(s.findings) // 2]
        s.page_uris = s.page_uris[: max(1, len(s.page_uris) // 2)]
    return s


def summarize(result: RolloutResult, manifest: Manifest | None, note: str | None = None) -> ResultSummary:
    """The summary form of a finished result, with its pages."""
    return with_pages(base_summary(result), manifest, note)


# -- HTTP -----------------------------------------------------------------------------------------------------------
def parse_range(header: str | None, size: int) -> tuple[int, int] | str | None:
    """One byte range of ``size`` as (start, end exclusive); None: no usable Range (serve it whole: several ranges
    or a malformed one are ignored, as RFC 9110 allows); "unsatisfiable": 416."""
    if not header:
        return None
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash:
        return None
    try:
        if first == "":
            n = int(last)
            if n <= 0:
                return "unsatisfiable"
            return max(0, size - n), size
        start = int(first)
        end = int(last) + 1 if last else size
    except ValueError:
        return None
    if start >= size:
        return "unsatisfiable"
    if start < 0 or end <= start:
        return None
    return start, min(end, size)


async def file_chunks(path: Path, start: int, end: int, gzip_it: bool = False) -> AsyncIterator[bytes]:
    """Bytes [start, end) of a file, read in CHUNK pieces off the event loop (gzip-compressed when asked)."""
    f = await asyncio.to_thread(open, path, "rb")
    z = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS) if gzip_it else None
    try:
        await asyncio.to_thread(f.seek, start)
        left = end - start
        while left > 0:
            data = await asyncio.to_thread(f.read, min(CHUNK, left))
            if not data:
                break
            left -= len(data)
            if z is not None:
                data = await asyncio.to_thread(z.compress, data)
                if not data:
                    continue
            yield data
        if z is not None:
            yield z.flush()
    finally:
        await asyncio.to_thread(f.close)


def accepts_gzip(header: str | None) -> bool:
    for part in (header or "").split(","):
        name, _, params = part.strip().partition(";")
        if name.strip().lower() in ("gzip", "x-gzip"):
            q = params.strip().removeprefix("q=").strip()
            try:
                return not q or float(q) > 0
            except ValueError:
                return True
    return False


__all__ = [
    "HTTP_PATH",
    "PAGE_BYTES",
    "SUMMARY_BYTES",
    "Manifest",
    "Manifests",
    "accepts_gzip",
    "file_chunks",
    "page_uri",
    "parse_range",
    "result_uri",
    "scan",
    "summarize",
]
