"""A small HTTP/3 client over aioquic for the tests: several requests on one QUIC
connection, each answered as (status, headers as a lower-case dict, body)."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from dataclasses import dataclass, field

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, H3Event, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import ConnectionTerminated, QuicEvent, StreamReset


@dataclass
class Answer:
    status: int = 0
    headers: dict = field(default_factory=dict)
    body: bytes = b""
    # The stream was reset by the server (no complete answer).
    reset: bool = False


class _Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.waiting: dict[int, tuple[Answer, asyncio.Future]] = {}
        self.closed = asyncio.get_event_loop().create_future()

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, StreamReset) and event.stream_id in self.waiting:
            ans, fut = self.waiting.pop(event.stream_id)
            ans.reset = True
            if not fut.done():
                fut.set_result(ans)
        if isinstance(event, ConnectionTerminated):
            if not self.closed.done():
                self.closed.set_result(event)
            for ans, fut in self.waiting.values():
                ans.reset = True
                if not fut.done():
                    fut.set_result(ans)
            self.waiting.clear()
        for e in self.h3.handle_event(event):
            self._h3_event(e)

    def _h3_event(self, event: H3Event) -> None:
        got = self.waiting.get(getattr(event, "stream_id", -1))
        if got is None:
            return
        ans, fut = got
        if isinstance(event, HeadersReceived):
            for k, v in event.headers:
                if k == b":status":
                    if ans.status == 0:
                        ans.status = int(v)
                else:
                    name = k.decode()
                    value = v.decode()
                    ans.headers[name] = ans.headers[name] + ", " + value if name in ans.headers else value
        elif isinstance(event, DataReceived):
            ans.body += event.data
        if getattr(event, "stream_ended", False):
            self.waiting.pop(event.stream_id, None)
            if not fut.done():
                fut.set_result(ans)

    async def request(self, method: str, authority: str, path: str, headers: dict | None, body: bytes | None) -> Answer:
        sid = self._quic.get_next_available_stream_id()
        fields = [(b":method", method.encode()), (b":scheme", b"https"), (b":authority", authority.encode()), (b":path", path.encode())]
        fields += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        fut = asyncio.get_event_loop().create_future()
        self.waiting[sid] = (Answer(), fut)
        self.h3.send_headers(sid, fields, end_stream=not body)
        if body:
            self.h3.send_data(sid, body, end_stream=True)
        self.transmit()
        return await fut


async def _run(host, port, reqs, sni, timeout, info, tickets, ciphers, cert):
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, verify_mode=ssl.CERT_NONE, server_name=sni or host)
    cfg.idle_timeout = timeout
    if ciphers is not None:
        cfg.cipher_suites = ciphers
    if cert is not None:
        cfg.load_cert_chain(*cert)
    early = False
    if tickets:
        # Resumed with the last ticket: the requests go in 0-RTT data when the ticket
        # allows early data.
        cfg.session_ticket = tickets[-1]
        early = True
    handler = tickets.append if tickets is not None else None
    async with connect(host, port, configuration=cfg, create_protocol=_Client, wait_connected=not early,
                       session_ticket_handler=handler) as client:
        q = client._quic
        if info is not None:
            # What the server said in its transport parameters and handshake, before any
            # stream could change the credit.
            peer = q.tls._peer_certificate
            info.update(
                retries=q._retry_count,
                max_streams_bidi=q._remote_max_streams_bidi,
                stream_window=q._remote_max_stream_data_bidi_remote,
                max_data=q._remote_max_data,
                alpn=q.tls.alpn_negotiated,
                cert_cn=peer.subject.rfc4514_string() if peer is not None else None,
                cert_requested=q.tls._certificate_request is not None,
            )
        authority = f"{sni or host}:{port}"
        return await asyncio.wait_for(
            asyncio.gather(*(client.request(m, authority, p, h, b) for m, p, h, b in reqs)), timeout
        )


def fetch_many(port: int, reqs: list[tuple[str, str, dict | None, bytes | None]], host: str = "127.0.0.1", sni: str | None = None, timeout: float = 20.0, info: dict | None = None, tickets: list | None = None, ciphers: list | None = None, cert: tuple | None = None) -> list[Answer]:
    """Send every (method, path, headers, body) at once on one connection; `info`, when
    given, is filled with what the handshake told (see `_run`). `tickets`, when given,
    collects the session tickets the server sends; when it holds one, the connection
    resumes with it and sends its requests as 0-RTT data. `ciphers` (aioquic's
    `CipherSuite`s) are the suites offered, `cert` a client certificate (certificate
    file, key file) sent when the server asks for one."""
    return asyncio.run(_run(host, port, reqs, sni, timeout, info, tickets, ciphers, cert))


def fetch(port: int, path: str, method: str = "GET", headers: dict | None = None, body: bytes | None = None, **kw) -> Answer:
    return fetch_many(port, [(method, path, headers, body)], **kw)[0]


class Moving:
    """One HTTP/3 connection driven by hand over a plain UDP socket, which the client can
    swap for a new one: from the server's side, the client moved to a new port (a NAT
    rebinding, or with a new connection ID, a migration)."""

    def __init__(self, port: int, host: str = "127.0.0.1", sni: str = "localhost"):
        cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, verify_mode=ssl.CERT_NONE, server_name=sni)
        self.authority = f"{sni}:{port}".encode()
        self.quic = QuicConnection(configuration=cfg)
        self.h3 = H3Connection(self.quic)
        self.sock = self._bind()
        # Every local port the connection has sent from.
        self.ports = [self.sock.getsockname()[1]]
        self.ended: ConnectionTerminated | None = None
        self.answers: dict[int, Answer] = {}
        self.done: set[int] = set()
        self.quic.connect((host, port), now=time.monotonic())

    @staticmethod
    def _bind() -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        return s

    def move(self, new_id: bool) -> None:
        """Go on from a new local port; with `new_id`, to the next connection ID the server
        issued too."""
        old, self.sock = self.sock, self._bind()
        old.close()
        self.ports.append(self.sock.getsockname()[1])
        if new_id:
            self.quic.change_connection_id()

    def _turn(self, until: float) -> None:
        """Send what is due, then take one datagram or timer, whichever comes first."""
        for data, addr in self.quic.datagrams_to_send(now=time.monotonic()):
            self.sock.sendto(data, addr)
        timer = self.quic.get_timer()
        wake = until if timer is None else min(until, timer)
        self.sock.settimeout(max(wake - time.monotonic(), 0.001))
        try:
            data, addr = self.sock.recvfrom(65536)
            self.quic.receive_datagram(data, addr, now=time.monotonic())
        except socket.timeout:
            if timer is not None and time.monotonic() >= timer:
                self.quic.handle_timer(now=time.monotonic())
        while (event := self.quic.next_event()) is not None:
            if isinstance(event, ConnectionTerminated):
                self.ended = event
            for e in self.h3.handle_event(event):
                ans = self.answers.get(getattr(e, "stream_id", -1))
                if ans is None:
                    continue
                if isinstance(e, HeadersReceived):
                    ans.status = int(dict(e.headers).get(b":status", b"0"))
                elif isinstance(e, DataReceived):
                    ans.body += e.data
                if getattr(e, "stream_ended", False):
                    self.done.add(e.stream_id)

    def get(self, path: str, timeout: float = 5.0) -> Answer | None:
        """GET `path` on this connection; None when no whole answer came within `timeout`
        (or the connection ended)."""
        sid = self.quic.get_next_available_stream_id()
        self.answers[sid] = Answer()
        fields = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", self.authority), (b":path", path.encode())]
        self.h3.send_headers(sid, fields, end_stream=True)
        until = time.monotonic() + timeout
        while sid not in self.done and self.ended is None and time.monotonic() < until:
            self._turn(until)
        return self.answers[sid] if sid in self.done else None

    def close(self) -> None:
        self.quic.close()
        for data, addr in self.quic.datagrams_to_send(now=time.monotonic()):
            self.sock.sendto(data, addr)
        self.sock.close()
