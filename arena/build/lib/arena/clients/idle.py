"""The c10k idle-connection holder, run as its own process pinned to the client CPU:

    python -m arena.clients.idle --host H --port P --path /index.html --connections 10000
                                 [--transport tls|h2 --cafile CERT]

It opens N keep-alive connections (a bounded number at a time), makes one request on each and
reads the whole reply, prints one JSON line `{"event": "ready", ...}`, then holds every
connection open until its stdin is closed (or --hold-seconds pass), and prints
`{"event": "done", "still_open": ...}`: how many the server had not closed meanwhile.

Over TLS (`--transport tls`) each connection offers ALPN http/1.1 and verifies the server's
certificate against --cafile. With `--transport h2` it offers only h2 and makes its one request
as an HTTP/2 stream: the client preface, an empty SETTINGS frame, one HEADERS frame, then
frames are read (SETTINGS and PING acknowledged) until the stream ends. That much HTTP/2 is
written out here rather than taken from a library: it is all the holder needs, and a full
HTTP/2 state machine per connection would cost the client memory ten thousand times over."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from arena.procs import raise_nofile_limit

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
# HPACK's static table entries 8 to 14 are `:status` with these values (RFC 7541, appendix A).
STATIC_STATUS = {8: 200, 9: 204, 10: 206, 11: 304, 12: 400, 13: 404, 14: 500}
# HPACK's Huffman codes of the ten digits (RFC 7541, appendix B), as (bits, length): all a
# `:status` value can hold.
HUFFMAN_DIGITS = {(0x0, 5): "0", (0x1, 5): "1", (0x2, 5): "2", (0x19, 6): "3", (0x1a, 6): "4",
                  (0x1b, 6): "5", (0x1c, 6): "6", (0x1d, 6): "7", (0x1e, 6): "8", (0x1f, 6): "9"}


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def _string(value: bytes) -> bytes:
    """An HPACK string literal, not Huffman-coded (7-bit prefixed length)."""
    if len(value) < 127:
        return bytes([len(value)]) + value
    rest, out = len(value) - 127, bytearray([127])
    while rest >= 128:
        out.append(rest % 128 + 128)
        rest //= 128
    out.append(rest)
    return bytes(out) + value


def request_headers(authority: str, path: str) -> bytes:
    """GET https://authority/path as an HPACK block: `:method GET` and `:scheme https` from the
    static table (indexes 2 and 7), `:path` and `:authority` as literals without indexing on
    the static table's names (indexes 4 and 1)."""
    return b"\x82\x87" + b"\x04" + _string(path.encode()) + b"\x01" + _string(authority.encode())


def _integer(data: bytes, pos: int, prefix: int) -> tuple[int, int]:
    """An HPACK integer with a `prefix`-bit prefix at data[pos]: (value, next position)."""
    limit = (1 << prefix) - 1
    value = data[pos] & limit
    pos += 1
    if value < limit:
        return value, pos
    shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value += (byte & 0x7f) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _huffman_digits(data: bytes) -> str:
    bits = "".join(f"{b:08b}" for b in data)
    out, code = [], ""
    for bit in bits:
        code += bit
        digit = HUFFMAN_DIGITS.get((int(code, 2), len(code)))
        if digit is not None:
            out.append(digit)
            code = ""
        elif len(code) > 6 and set(code) != {"1"}:
            raise ValueError("not a Huffman-coded number")
    # The padding: up to 7 bits, the most significant bits of EOS, all ones (RFC 7541 5.2).
    if code and (set(code) != {"1"} or len(code) > 7):
        raise ValueError("bad Huffman padding")
    return "".join(out)


def response_status(block: bytes) -> int:
    """The `:status` of a response header block: the first field (RFC 9113 8.3: pseudo-header
    fields come first), indexed or a literal on a static `:status` name."""
    pos = 0
    while pos < len(block) and block[pos] & 0xe0 == 0x20:  # dynamic table size updates
        _, pos = _integer(block, pos, 5)
    first = block[pos]
    if first & 0x80:                                     # indexed field
        index, _ = _integer(block, pos, 7)
        if index in STATIC_STATUS:
            return STATIC_STATUS[index]
        raise ValueError(f"first header field is index {index}, not a :status")
    index, pos = _integer(block, pos, 6 if first & 0x40 else 4)
    if index not in STATIC_STATUS:
        raise ValueError("first header field is not a :status")
    huffman = bool(block[pos] & 0x80)
    length, pos = _integer(block, pos, 7)
    raw = block[pos:pos + length]
    return int(_huffman_digits(raw) if huffman else raw.decode("ascii"))


def _unpad(flags: int, payload: bytes, kind: int) -> bytes:
    if flags & PADDED:
        payload = payload[1:len(payload) - payload[0]]
    if kind == HEADERS and flags & PRIORITY:
        payload = payload[5:]
    return payload


async def h2_exchange(reader, writer, authority: str, path: str) -> tuple[int, int]:
    """GET `path` as stream 1 of a new HTTP/2 connection: (status, body bytes)."""
    writer.write(PREFACE + frame(SETTINGS, 0, 0)
                 + frame(HEADERS, END_STREAM | END_HEADERS, 1, request_headers(authority, path)))
    await writer.drain()
    status, body = None, 0
    while True:
        head = await reader.readexactly(9)
        length, kind, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
        stream = int.from_bytes(head[5:9], "big") & 0x7fffffff
        payload = await reader.readexactly(length)
        if kind == SETTINGS and not flags & ACK:
            writer.write(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            writer.write(frame(PING, ACK, 0, payload))
        elif kind == GOAWAY:
            raise OSError("GOAWAY before the reply")
        elif kind == RST_STREAM and stream == 1:
            raise OSError("the stream was reset")
        elif kind == HEADERS and stream == 1:
            if status is None:
                status = response_status(_unpad(flags, payload, kind))
            if flags & END_STREAM:
                break
        elif kind == DATA and stream == 1:
            body += len(_unpad(flags, payload, kind))
            if flags & END_STREAM:
                break
    await writer.drain()
    if status is None:
        raise OSError("the stream ended without a header")
    return status, body


def client_context(transport: str, cafile: str | None):
    if transport == "http":
        return None
    from arena.tls import ALPN, client_context as context
    return context(Path(cafile) if cafile else None, [ALPN[transport]])


async def _open(host: str, port: int, path: str, transport: str, context, timeout: float):
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host, port, ssl=context, server_hostname=host if context else None), timeout)
    try:
        if transport == "h2":
            chosen = writer.get_extra_info("ssl_object").selected_alpn_protocol()
            if chosen != "h2":
                raise OSError(f"ALPN chose {chosen or 'no protocol'}, not h2")
            status, _ = await asyncio.wait_for(h2_exchange(reader, writer, f"{host}:{port}", path), timeout)
        else:
            request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
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


def fetch_once(host: str, port: int, path: str, transport: str, cafile: str | None,
               timeout: float = 5.0) -> bool:
    """One request on a brand-new connection: True if it was answered 2xx/3xx."""
    async def once() -> None:
        _, writer = await _open(host, port, path, transport, client_context(transport, cafile), timeout)
        writer.close()

    try:
        asyncio.run(once())
        return True
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
        return False


async def hold(host: str, port: int, path: str, count: int, parallel: int, open_seconds: float,
               hold_seconds: float, transport: str = "http", cafile: str | None = None) -> None:
    gate = asyncio.Semaphore(parallel)
    context = client_context(transport, cafile)

    async def one():
        async with gate:
            return await _open(host, port, path, transport, context, timeout=min(10.0, open_seconds))

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
    # A server's close shows as end of file (cleartext) or a closed transport (TLS, where the
    # end of the stream closes it; an HTTP/2 server's GOAWAY may sit unread in the buffer).
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
    p.add_argument("--transport", choices=["http", "tls", "h2"], default="http")
    p.add_argument("--cafile", help="the certificate to verify a TLS server against")
    args = p.parse_args(argv)
    raise_nofile_limit()
    asyncio.run(hold(args.host, args.port, args.path, args.connections, args.parallel,
                     args.open_seconds, args.hold_seconds, args.transport, args.cafile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
