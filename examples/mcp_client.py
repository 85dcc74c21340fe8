"""Run a rollout with the official MCP Python SDK (`mcp`) at its default settings, then fetch the whole result.

    python examples/mcp_client.py http://127.0.0.1:8000/mcp [--token T] [--args '{"split": "bundled"}'] [--out F]

`run_rollout` answers with the result's summary (ok, reward, grading, counts) and resource links; the whole result
is read page by page with `resources/read` and checked against the summary's SHA-256. Prints one JSON line: the
summary's size, the page count, the fetch time and whether the hash matched; `--out` writes the result's JSON.
`tests/test_mcp_size.py` runs this file.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
from pathlib import Path

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def main(url: str, token: str | None, args: dict, out: str | None) -> dict:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=3600))
    async with http, streamable_http_client(url, http_client=http) as (read, write), ClientSession(read, write) as s:
        await s.initialize()
        t0 = time.monotonic()
        res = await s.call_tool("run_rollout", args)
        summary = res.structured_content  # ok, reward, grading, findings, counts, result_uri, page_uris, sha256
        if res.is_error or summary is None:
            raise SystemExit(f"run_rollout failed: {res.content}")
        call_s = time.monotonic() - t0
        print(f"ok={summary['ok']} reward={summary['reward']} calls={summary['counts'].get('calls')}", file=sys.stderr)

        t0 = time.monotonic()
        whole = bytearray()
        for uri in summary["page_uris"]:  # or: read summary["result_uri"] and follow each page's _meta["next"]
            page = (await s.read_resource(uri)).contents[0]
            whole += page.text.encode()
        fetch_s = time.monotonic() - t0
    ok = hashlib.sha256(whole).hexdigest() == summary["sha256"]
    if out:
        await asyncio.to_thread(Path(out).write_bytes, bytes(whole))
    return {
        "rollout_id": summary["rollout_id"],
        "ok": summary["ok"],
        "summary_bytes": len(res.model_dump_json(by_alias=True, exclude_none=True)),
        "pages": summary["pages"],
        "result_bytes": len(whole),
        "sha256_ok": ok,
        "call_s": round(call_s, 3),
        "fetch_s": round(fetch_s, 3),
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("--token")
    p.add_argument("--args", default="{}", help="run_rollout arguments (JSON)")
    p.add_argument("--out")
    a = p.parse_args()
    print(json.dumps(asyncio.run(main(a.url, a.token, json.loads(a.args), a.out))))
