"""Start the HF emulator: ``python tests/hf_emulator/run.py --state-dir D [--port P] [--domain hfjobs.test]``.

Prepares the state dir (a test CA and a ``*.<domain>`` certificate under ``tls/``, the ``hosts`` file naming every
pre-allocated job id, a copy of ``sandbox_server.py``), serves the Jobs API on 127.0.0.1, prints one JSON line
(endpoint, token, ca, hosts, …) once it answers, and on SIGTERM/SIGINT removes every container it started.
A state dir that already exists is reused as is (same ids, CA and instance), so a restarted emulator sees its jobs.
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import socket
import sys
import time
from pathlib import Path

import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: import as the tests do

from hf_emulator.api import create_app
from hf_emulator.jobs import SERVER_PORT, Emulator

DEFAULT_TOKEN = "hf_emulator_dummy_token"
DEFAULT_DOMAIN = "hfjobs.test"


def job_id() -> str:
    """An id shaped like a real job's (a 24-hex ObjectId: seconds since the epoch, then random)."""
    return f"{int(time.time()):08x}{secrets.token_hex(8)}"


def prepare_state(state: Path, domain: str, n_ids: int = 256) -> None:
    """Make (or keep) the files the emulator, its job containers and the SDK processes share."""
    state.mkdir(parents=True, exist_ok=True)
    tls = state / "tls"
    if not (tls / "key.pem").is_file():
        import trustme  # a test dependency: uv pip install trustme

        tls.mkdir(exist_ok=True)
        ca = trustme.CA(organization_name="hf-emulator test CA")
        cert = ca.issue_cert(f"*.{domain}", domain, "localhost", "127.0.0.1")
        ca.cert_pem.write_to_path(str(tls / "ca.pem"))
        (tls / "cert.pem").write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
        cert.private_key_pem.write_to_path(str(tls / "key.pem"))
    if not (state / "instance").is_file():
        (state / "instance").write_text(secrets.token_hex(6) + "\n")
    hosts = state / "hosts"
    if not hosts.is_file():  # written once: containers bind-mount this very file (inode)
        ids = {job_id() for _ in range(n_ids)}
        lines = ["127.0.0.1 localhost", *(f"127.0.0.1 {i}--{SERVER_PORT}.{domain}" for i in sorted(ids))]
        hosts.write_text("\n".join(lines) + "\n")
    server = Path(__file__).resolve().parent / "sandbox_server.py"
    if server.is_file():
        shutil.copyfile(server, state / "sandbox_server.py")


class Server(uvicorn.Server):
    """Uvicorn that prints the ready line once it listens."""

    def __init__(self, config: uvicorn.Config, ready: dict[str, str]) -> None:
        super().__init__(config)
        self.ready = ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            print(json.dumps(self.ready), flush=True)


def serve(state: Path, port: int, domain: str, token: str) -> None:
    emu = Emulator(state, domain, token)
    ready = {
        "endpoint": f"http://127.0.0.1:{port}",
        "token": token,
        "domain": domain,
        "ca": str(state / "tls" / "ca.pem"),
        "hosts": str(state / "hosts"),
        "state_dir": str(state),
        "instance": emu.instance,
    }
    config = uvicorn.Config(create_app(emu), host="127.0.0.1", port=port, log_level="warning")
    Server(config, ready).run()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--port", type=int, default=0, help="default: a free loopback port")
    parser.add_argument("--domain", default=DEFAULT_DOMAIN)
    parser.add_argument("--token", default=DEFAULT_TOKEN, help="the dummy HF token the emulator accepts")
    parser.add_argument("--ids", type=int, default=256, help="job ids to pre-allocate in the hosts file")
    args = parser.parse_args(argv)
    if not args.port:
        from swe_gym_env.core.procs import free_port

        args.port = free_port()
    state = Path(args.state_dir).resolve()
    prepare_state(state, args.domain, args.ids)
    serve(state, args.port, args.domain, args.token)


if __name__ == "__main__":
    main()
