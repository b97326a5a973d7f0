"""The c10k idle-connection holder, run as its own process pinned to the client CPU:

    python -m arena.clients.idle --host H --port P --path /index.html --connections 10000

It opens N keep-alive connections (a bounded number at a time), makes one request on each and
reads the whole reply, prints one JSON line `{"event": "ready", ...}`, then holds every
connection open until its stdin is closed (or --hold-seconds pass), and prints
`{"event": "done", "still_open": ...}`: how many the server had not closed meanwhile."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from arena.procs import raise_nofile_limit


async def _open(host: str, port: int, request: bytes, timeout: float):
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        writer.write(request)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        await asyncio.wait_for(reader.readexactly(length), timeout)
        if not 200 <= status < 400:
            raise OSError(f"status {status}")
    except BaseException:
        writer.close()
        raise
    return reader, writer


async def hold(host: str, port: int, path: str, count: int, parallel: int, open_seconds: float,
               hold_seconds: float) -> None:
    request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
    gate = asyncio.Semaphore(parallel)

    async def one():
        async with gate:
            return await _open(host, port, request, timeout=min(10.0, open_seconds))

    tasks = [asyncio.ensure_future(one()) for _ in range(count)]
    done, pending = await asyncio.wait(tasks, timeout=open_seconds)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    conns, errors = [], {}
    for task in done:
        if task.exception() is None:
            conns.append(task.result())
        else:
            name = type(task.exception()).__name__ + (f": {task.exception()}" if str(task.exception()) else "")
            errors[name] = errors.get(name, 0) + 1
    if pending:
        errors["not served in time"] = len(pending)
    print(json.dumps({"event": "ready", "served": len(conns), "failed": count - len(conns),
                      "errors": errors}), flush=True)

    loop = asyncio.get_running_loop()
    # Hold until the parent closes our stdin, or the deadline that keeps us bounded.
    try:
        await asyncio.wait_for(loop.run_in_executor(None, sys.stdin.buffer.read), hold_seconds)
    except asyncio.TimeoutError:
        pass
    still_open = sum(1 for reader, writer in conns if not reader.at_eof() and not writer.is_closing())
    print(json.dumps({"event": "done", "still_open": still_open}), flush=True)
    for _, writer in conns:
        writer.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m arena.clients.idle")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--path", default="/index.html")
    p.add_argument("--connections", type=int, required=True)
    p.add_argument("--parallel", type=int, default=200, help="connections being opened at once")
    p.add_argument("--open-seconds", type=float, default=60)
    p.add_argument("--hold-seconds", type=float, default=300)
    args = p.parse_args(argv)
    raise_nofile_limit()
    asyncio.run(hold(args.host, args.port, args.path, args.connections, args.parallel,
                     args.open_seconds, args.hold_seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
