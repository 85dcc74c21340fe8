"""create→ready of `hf` vs `hf-pool` (cold host, warm host) and agent-bundle delivery (upload vs fetch), in the HF
emulator: ``python tests/hf_sandbox_bench.py --state-dir D --endpoint URL [--image I] [--bundle T.tar.gz] [-n N]``
with an emulator running (``python tests/hf_emulator/run.py --state-dir D --port P``). Prints one JSON object.

Re-runs itself in a private mount namespace with the emulator's hosts file over /etc/hosts (as the emulator
fixture's `run_sdk` does), so the SDK resolves `<job>--49983.<domain>` to loopback. Figures are loopback figures:
no Jobs proxy, no WAN, one machine's docker — they rank the paths, they do not predict HF's numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import http.server
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

IMAGE = "swe-gym-env-standin/sweb.eval.x86_64.tkem_s_cachetools-3.1.0"
BUNDLE = Path.home() / ".cache/swe_gym_env/bundles/pi-0.73.1-204ae0b29243f38d.tar.gz"


def timed(fn, *a, **kw) -> tuple[float, object]:
    t = time.monotonic()
    out = fn(*a, **kw)
    return time.monotonic() - t, out


def p50(xs: list[float]) -> float:
    return round(statistics.median(xs), 3)


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def serve(path: Path) -> tuple[str, http.server.ThreadingHTTPServer]:
    handler = functools.partial(Quiet, directory=str(path.parent))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}/{path.name}", srv


def delivery(sbx, bundle: Path, url: str, n: int) -> dict:
    """Upload (`files.upload`, what the backends do) vs fetch (the sandbox downloads it from a loopback URL)."""
    up, fetch = [], []
    get = "import sys, urllib.request as u; u.urlretrieve(sys.argv[1], sys.argv[2])"
    for i in range(n):
        up.append(timed(sbx.files.upload, str(bundle), f"/tmp/up{i}.tar.gz")[0])
        cmd = ["python3", "-c", get, url, f"fetch{i}.tar.gz"]
        dt, r = timed(sbx.run, cmd, check=False, timeout=300)
        assert r.exit_code == 0, r.stderr  # type: ignore[attr-defined]
        fetch.append(dt)
        sbx.run(f"rm -f /tmp/up{i}.tar.gz fetch{i}.tar.gz", check=False)
    return {"upload_s_p50": p50(up), "fetch_s_p50": p50(fetch), "runs": n}


async def backend_ready(backend: str, image: str, n: int) -> list[float]:
    """Our backends' create (SDK create + home/copy/strip/secrets), without a bundle."""
    from swe_gym_env.server.sandbox.base import SandboxSpec
    from swe_gym_env.server.sandbox.registry import create_sandbox

    times = []
    for _ in range(n):
        t = time.monotonic()
        sbx = await create_sandbox(backend, SandboxSpec(image=image, deadline_s=600, secrets={"K": "v"}))
        times.append(time.monotonic() - t)
        await sbx.close()
    return times


def inner(args) -> dict:
    from huggingface_hub import Sandbox, SandboxPool

    from swe_gym_env.server.sandbox import hf_pool

    out: dict = {"image": args.image, "bundle_bytes": args.bundle.stat().st_size}
    url, srv = serve(args.bundle)
    # hf: every sandbox is a job booted for it
    hf, boxes = [], []
    for _ in range(args.n):
        dt, sbx = timed(Sandbox.create, args.image, idle_timeout=600)
        hf.append(dt)
        boxes.append(sbx)
    out["hf_sdk_create_s"] = {"p50": p50(hf), "all": [round(x, 2) for x in hf]}
    out["hf_delivery"] = delivery(boxes[0], args.bundle, url, 3)
    for sbx in boxes:
        sbx.kill()
    # hf-pool, cold: the pool boots its host, then the first sandbox; warm: more sandboxes on that host
    cold = []
    for _ in range(min(3, args.n)):
        t = time.monotonic()
        pool = SandboxPool(args.image, sandboxes_per_host=8, warm_up=1, adopt_hosts="never")
        first = pool.create(idle_timeout=600)
        cold.append(time.monotonic() - t)
        warm = [timed(pool.create, idle_timeout=600) for _ in range(min(7, args.n))]
        if len(cold) == 1:
            out["pool_warm_sdk_create_s"] = {"p50": p50([w[0] for w in warm]), "all": [round(w[0], 3) for w in warm]}
            out["pool_delivery"] = delivery(first, args.bundle, url, 3)
        pool.close()
    out["pool_cold_sdk_create_s"] = {"p50": p50(cold), "all": [round(x, 2) for x in cold]}
    # the backends end to end (home, copy of /testbed, secrets file): hf = a job each; hf-pool = warm host
    os.environ.setdefault("SWE_GYM_PUBLIC_URL", "http://127.0.0.1:9")
    os.environ["SWE_GYM_SERVER_ID"] = f"bench{os.getpid()}"
    out["backend_hf_ready_s"] = p50(asyncio.run(backend_ready("hf", args.image, min(3, args.n))))
    pool_times = asyncio.run(backend_ready("hf-pool", args.image, args.n + 1))
    out["backend_pool_first_ready_s"] = round(pool_times[0], 3)  # includes booting the host
    out["backend_pool_warm_ready_s"] = p50(pool_times[1:])
    hf_pool.close_pools()
    srv.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state-dir", type=Path, required=True)
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--image", default=IMAGE)
    ap.add_argument("--bundle", type=Path, default=BUNDLE)
    ap.add_argument("-n", type=int, default=5)
    args = ap.parse_args()
    if os.environ.get("HFBENCH_INNER") != "1":
        state = args.state_dir.resolve()
        env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "SSL_CERT_DIR") and "PROXY" not in k}
        env.update(HFBENCH_INNER="1", HF_ENDPOINT=args.endpoint, HF_TOKEN="hf_emulator_dummy_token")
        env.update(SSL_CERT_FILE=str(state / "tls/ca.pem"), HF_HOME=str(state / "hf_home"))
        script = 'mount --bind "$1" /etc/hosts && shift && exec "$@"'
        argv = ["unshare", "-m", "sh", "-c", script, "sh", str(state / "hosts"), sys.executable, *sys.argv]
        raise SystemExit(subprocess.run(argv, env=env).returncode)
    print(json.dumps(inner(args), indent=1))


if __name__ == "__main__":
    main()
