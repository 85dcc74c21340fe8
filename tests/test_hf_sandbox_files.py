"""The emulated sandbox server's file API (`tests/hf_emulator/sandbox_server.py`) under concurrent requests,
in-process: no docker, no TLS. The SDK writes a file over `PARALLEL_THRESHOLD` as ranged PUTs on up to 16
connections at once, each one creating the file's missing parents; every such request here goes through the
server's own `Handler.file_write`, in both of its roots (a dedicated job's whole filesystem, a pool sandbox's home).
"""

from __future__ import annotations

import errno
import io
import os
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from hf_emulator import sandbox_server as server
from huggingface_hub._sandbox import SandboxFiles

WORKERS = SandboxFiles.PARALLEL_MAX_WORKERS
CHUNK = 64 * 1024  # the SDK's ranges are 1 MiB; the race is in the path walk, not in the bytes


def put_range(space: SimpleNamespace, path: str, offset: int, data: bytes, total: int) -> int:
    """One ranged `PUT /files/write`, as `SandboxFiles._put_range` sends it, through the server's handler."""
    handler = server.Handler.__new__(server.Handler)
    handler.headers = {"Content-Length": str(len(data))}
    handler.rfile = io.BytesIO(data)
    handler.body_read = False
    handler.send_json = lambda status, obj: status
    q = {"path": [path], "offset": [str(offset)]}
    if offset + len(data) >= total:
        q["truncate_to"] = [str(total)]
    return handler.file_write(space, path, q)


def parallel_write(space: SimpleNamespace, path: str, data: bytes) -> list[BaseException]:
    """Every range of `data` at once, released together, in SDK order; the errors the requests raised."""
    ranges = [(off, data[off : off + CHUNK]) for off in range(0, len(data), CHUNK)]
    gate, errors = threading.Barrier(len(ranges)), []

    def push(offset: int, chunk: bytes) -> None:
        gate.wait()
        try:
            put_range(space, path, offset, chunk, len(data))
        except BaseException as e:  # reported below, with the rest
            errors.append(e)

    threads = [threading.Thread(target=push, args=r) for r in ranges]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


@pytest.fixture(params=["dedicated", "pool"])
def root(request, tmp_path: Path) -> tuple[SimpleNamespace, str, Path]:
    """(the space the handler writes in, the API path of the root's dir for this test, that dir on disk)."""
    if request.param == "dedicated":
        return SimpleNamespace(files=server.Files(None)), str(tmp_path), tmp_path
    home = tmp_path / "home"
    home.mkdir()
    return SimpleNamespace(files=server.Files(str(home), os.getuid())), "/", home


def test_parallel_ranged_writes_into_fresh_nested_dirs_never_collide(root) -> None:
    """The flake in `test_files_ranged_roundtrip_and_ops` (409 "File exists"): two ranges both find a parent missing
    and both mkdir it. Released together, 16 ranges into a fresh 6-deep dir lost that race in ~40% of rounds."""
    space, base, on_disk = root
    for n in range(30):
        rel = f"r{n}/a/b/c/d/e/big.bin"
        data = os.urandom(WORKERS * CHUNK + 123)  # 17 ranges, the last one short and carrying truncate_to
        errors = parallel_write(space, os.path.join(base, rel), data)
        assert not errors, f"round {n}: {errors[:3]!r}"
        assert (on_disk / rel).read_bytes() == data, f"round {n}"
        smaller = os.urandom(WORKERS // 2 * CHUNK + 7)  # a ranged overwrite: no range truncates another's bytes
        assert not parallel_write(space, os.path.join(base, rel), smaller)
        assert (on_disk / rel).read_bytes() == smaller, f"round {n}"


def test_ranged_write_in_any_order_keeps_every_range(root) -> None:
    """The ranges of one write land in any order: the first (offset 0) arriving last must not truncate what the
    others wrote, and the last one's `truncate_to` must not cut a range written after it."""
    space, base, on_disk = root
    path = os.path.join(base, "order/f.bin")
    (on_disk / "order").mkdir()
    (on_disk / "order/f.bin").write_bytes(b"x" * (5 * CHUNK))  # an older, longer file
    data = os.urandom(3 * CHUNK + 5)
    for offset in sorted(range(0, len(data), CHUNK), reverse=True):
        assert put_range(space, path, offset, data[offset : offset + CHUNK], len(data)) == 200
    assert (on_disk / "order/f.bin").read_bytes() == data


def test_a_parent_made_by_another_request_is_opened_a_planted_symlink_refused(root, monkeypatch) -> None:
    """The race, forced: between the walk's failed open and its mkdir, another request makes the directory (it is
    then used), or, in a pool home, the sandbox's own code plants a symlink there (still refused, nothing written
    through it)."""
    space, base, on_disk = root
    real_mkdir = os.mkdir
    outside = on_disk.parent / "outside"
    outside.mkdir(exist_ok=True)
    planted: list[str] = []

    def first_another_request(path, mode=0o777, *, dir_fd=None):
        if planted[0] == "dir":
            real_mkdir(path, 0o755, dir_fd=dir_fd)
        else:
            os.symlink(str(outside), path, dir_fd=dir_fd)
        return real_mkdir(path, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "mkdir", first_another_request)
    planted.append("dir")
    assert put_range(space, os.path.join(base, "won/by/other/f.txt"), 0, b"data", 4) == 200
    assert (on_disk / "won/by/other/f.txt").read_bytes() == b"data"
    if base != "/":
        return  # a dedicated job follows symlinks like any root process in its container: nothing to refuse
    planted[0] = "symlink"
    with pytest.raises(OSError) as refused:
        put_range(space, "/planted/f.txt", 0, b"data", 4)
    assert refused.value.errno in (errno.ELOOP, errno.ENOTDIR)
    assert list(outside.iterdir()) == []
    monkeypatch.undo()
    # the walk without the race refuses it the same way
    with pytest.raises(OSError) as again:
        put_range(space, "/planted/f.txt", 0, b"data", 4)
    assert again.value.errno in (errno.ELOOP, errno.ENOTDIR)
