"""Runs *inside* a sandbox whose network namespace has only loopback: listens on 127.0.0.1:PORT and pipes each
connection to the host's capture unix socket (which serves /capture and nothing else). Stdlib only.

usage: python relay.py PORT SOCKET READY_FILE
"""

import asyncio
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except OSError:
            pass


async def main(port: int, sock: str, ready: str) -> None:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_unix_connection(sock)
        except OSError:
            w.close()
            return
        await asyncio.gather(pipe(r, uw), pipe(ur, w))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    with open(ready, "w") as f:  # noqa: ASYNC230 - one tiny write before serving
        f.write("ready\n")
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], sys.argv[3]))
