"""The DataPartsExchange server on a loopback port: ClickHouse 18.16's answers, status codes and auth.

The part served is the golden 18.16 part of tests/fixtures/ch18_part_basic; its v0 body must be
byte-identical to what 18.16 itself answered for the same part.
"""

from __future__ import annotations

import asyncio
import base64
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
import pytest_asyncio
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.server.interserver import Endpoint, InterserverServer, PartToSend, read_request
from replicad.storage import part_transfer
from replicad.storage.checksums import Checksums
from replicad.storage.part_receive import receive_part
from replicad.storage.part_transfer import iter_part_body_sync

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ch18_part_basic"
PART_DIR = FIXTURES / "202611_1_1_0"
REPLICA = "/clickhouse/tables/t_repl/replicas/r1"


def part() -> PartToSend:
    return PartToSend(PART_DIR, Checksums.parse((PART_DIR / "checksums.txt").read_bytes()))


@pytest_asyncio.fixture
async def server() -> AsyncIterator[InterserverServer]:
    s = InterserverServer("127.0.0.1", 0)
    await s.start()
    s.register(REPLICA, Endpoint(lambda name: part() if name == "202611_0_0_0" else None))
    try:
        yield s
    finally:
        await s.stop(grace_s=0.1)


def target(**params: str) -> str:
    base = {"endpoint": f"DataPartsExchange:{REPLICA}", "part": "202611_0_0_0", "compress": "false"}
    base.update(params)
    return "/?" + urlencode({k: v for k, v in base.items() if v is not None})


def raw_request(port: int, request_target: str, headers: str = "", half_close: bool = True) -> bytes:
    """A request as 18.16's fetcher sends it (and it half-closes the socket right after)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        head = f"POST {request_target} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Connection: Close\r\n\r\n"
        c.sendall(head.encode())
        if half_close:
            c.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := c.recv(65536):
            out += chunk
    return out


def split_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if headers.get("transfer-encoding") == "chunked":
        out, rest = b"", body
        while True:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            out, rest = out + rest[:size], rest[size + 2 :]
        body = out
    return status, headers, body


async def fetch(
    port: int, request_target: str, headers: str = "", half_close: bool = True
) -> tuple[int, dict[str, str], bytes]:
    raw = await asyncio.to_thread(raw_request, port, request_target, headers, half_close)
    return split_response(raw)


async def test_v0_body_is_byte_identical_to_18_16(server: InterserverServer) -> None:
    status, headers, body = await fetch(server.port, target())
    assert status == 200
    assert "set-cookie" not in headers  # 18.16 never sets one, and without the parameter neither do we
    assert body == (FIXTURES / "dpe_v0_response_202611_0_0_0.bin").read_bytes()


async def test_protocol_negotiation_cookie(server: InterserverServer, tmp_path: Path) -> None:
    status, headers, body = await fetch(server.port, target(client_protocol_version="10"), half_close=False)
    assert status == 200
    assert headers["set-cookie"].startswith("server_protocol_version=3")
    reader = asyncio.StreamReader()
    reader.feed_data(body)
    reader.feed_eof()
    received = await receive_part(reader, tmp_path / "p", 3)
    assert received.part_type == "Wide"
    assert (tmp_path / "p" / "name.bin").read_bytes() == (PART_DIR / "name.bin").read_bytes()


@pytest.mark.parametrize(
    ("params", "status", "text"),
    [
        ({"compress": None}, 500, "Not found: compress"),
        ({"part": "../etc"}, 400, "Unexpected part name"),
        ({"part": "202611_5_5_0"}, 404, "No part 202611_5_5_0"),
        ({"endpoint": "DataPartsExchange:/nope"}, 404, "No interserver IO endpoint"),
        ({"compress": "true"}, 400, "compress=true"),
        ({"client_protocol_version": "x"}, 400, "client_protocol_version"),
    ],
)
async def test_errors(server: InterserverServer, params: dict[str, str], status: int, text: str) -> None:
    got, _headers, body = await fetch(server.port, target(**params))
    assert got == status
    assert text in body.decode()


async def test_too_many_sends(server: InterserverServer) -> None:
    ep = server.endpoints[f"DataPartsExchange:{REPLICA}"]
    ep.max_parallel_sends = 1
    ep.current_sends = 1
    status, headers, body = await fetch(server.port, target())
    assert (status, headers["retry-after"], body) == (429, "10", b"")
    ep.current_sends = 0
    assert (await fetch(server.port, target()))[0] == 200


async def test_basic_auth() -> None:
    s = InterserverServer("127.0.0.1", 0, user="u", password="p w")
    await s.start()
    s.register(REPLICA, Endpoint(lambda _name: part()))
    try:

        def auth(user: str, password: str) -> str:
            return "Authorization: Basic " + base64.b64encode(f"{user}:{password}".encode()).decode() + "\r\n"

        status, _h, body = await fetch(s.port, target())
        assert (status, body) == (
            401,
            b"Server requires HTTP Basic authentification, but client doesn't provide it\n",
        )
        status, _h, body = await fetch(s.port, target(), auth("u", "bad"))
        assert (status, body) == (401, b"Incorrect user or password in HTTP Basic authentification\n")
        assert (await fetch(s.port, target(), auth("u", "p w")))[0] == 200
    finally:
        await s.stop(grace_s=0.1)


async def test_client_credentials_refused_without_server_auth(server: InterserverServer) -> None:
    status, _h, body = await fetch(server.port, target(), "Authorization: Basic dTpw\r\n")
    assert (status, body) == (
        401,
        b"Client requires HTTP Basic authentification, but server doesn't provide it\n",
    )


async def test_ping(server: InterserverServer) -> None:
    raw = await asyncio.to_thread(raw_request, server.port, "/ping")
    assert split_response(raw)[:1] == (200,) and raw.endswith(b"Ok.\n")


# ------------------------------------------------------------------- small parts: one Content-Length write


def read_responses(port: int, requests: list[tuple[str, str]]) -> list[tuple[int, dict[str, str], bytes]]:
    """Several requests on one connection, each answer read by its framing (Content-Length or chunked).

    Fails when the server closes the connection early or sends anything after the last answer."""
    out = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        buf = bytearray()

        def need(n: int) -> None:
            while len(buf) < n:
                chunk = c.recv(65536)
                if not chunk:
                    raise EOFError(f"connection closed with {len(buf)} of {n} bytes")
                buf.extend(chunk)

        def line() -> bytes:
            while b"\r\n" not in buf:
                need(len(buf) + 1)
            i = buf.index(b"\r\n")
            text = bytes(buf[:i])
            del buf[: i + 2]
            return text

        for request_target, extra in requests:
            c.sendall(f"POST {request_target} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())
            status = int(line().split(b" ")[1])
            headers = {}
            while header := line():
                k, _, v = header.decode("latin-1").partition(":")
                headers[k.strip().lower()] = v.strip()
            if "content-length" in headers:
                n = int(headers["content-length"])
                need(n)
                body = bytes(buf[:n])
                del buf[:n]
            else:
                assert headers["transfer-encoding"] == "chunked"
                body = b""
                while size := int(line(), 16):
                    need(size + 2)
                    body += bytes(buf[:size])
                    assert buf[size : size + 2] == b"\r\n"
                    del buf[: size + 2]
                assert line() == b""
            out.append((status, headers, body))
        c.shutdown(socket.SHUT_WR)
        assert c.recv(1) == b""  # nothing after the last answer, and the server closes
    return out


@pytest.mark.parametrize("version", [None, "3"])
async def test_small_part_is_one_content_length_body(
    server: InterserverServer, monkeypatch: pytest.MonkeyPatch, version: str | None
) -> None:
    params = {} if version is None else {"client_protocol_version": version}
    expected = b"".join(iter_part_body_sync(PART_DIR, part().checksums, int(version or 0)))
    [(status, headers, body)] = await asyncio.to_thread(
        read_responses, server.port, [(target(**params), "Connection: close\r\n")]
    )
    assert status == 200 and "transfer-encoding" not in headers
    assert int(headers["content-length"]) == len(body)
    assert body == expected
    if version is None:
        assert "set-cookie" not in headers
        assert body == (FIXTURES / "dpe_v0_response_202611_0_0_0.bin").read_bytes()
    else:
        assert headers["set-cookie"] == "server_protocol_version=3; Path=/"

    # the same part over the threshold: streamed chunked, the same bytes once de-chunked
    monkeypatch.setattr(part_transfer, "SMALL_PART_BYTES", part().checksums.total_size - 1)
    [(status, chunked_headers, chunked)] = await asyncio.to_thread(
        read_responses, server.port, [(target(**params), "Connection: close\r\n")]
    )
    assert status == 200 and chunked_headers["transfer-encoding"] == "chunked"
    assert "content-length" not in chunked_headers
    assert chunked == body
    assert chunked_headers.get("set-cookie") == headers.get("set-cookie")
    assert server.sent_parts == 2


async def test_broken_small_part_gets_500_and_the_connection_goes_on(
    server: InterserverServer, tmp_path: Path
) -> None:
    broken_dir = tmp_path / "202611_1_1_0"
    shutil.copytree(PART_DIR, broken_dir)
    data = bytearray((broken_dir / "name.bin").read_bytes())
    data[7] ^= 0x10
    (broken_dir / "name.bin").write_bytes(data)
    reported: list[str] = []
    good, broken = part(), PartToSend(broken_dir, part().checksums)
    parts = {"202611_0_0_0": good, "202611_1_1_0": broken}
    server.register(REPLICA, Endpoint(parts.get, on_broken_part=reported.append))
    expected = (FIXTURES / "dpe_v0_response_202611_0_0_0.bin").read_bytes()
    answers = await asyncio.to_thread(
        read_responses,
        server.port,
        [
            (target(), ""),
            (target(), ""),  # two small parts in a row on one kept-alive connection
            (target(part="202611_1_1_0"), ""),
            (target(), "Connection: close\r\n"),
        ],
    )
    assert [(s, b == expected) for s, _h, b in answers] == [(200, True)] * 2 + [(500, False), (200, True)]
    assert [h["connection"] for _s, h, _b in answers] == ["Keep-Alive"] * 3 + ["Close"]
    _status, headers, text = answers[2]
    assert text.decode() == (
        "Cannot send part 202611_1_1_0: Checksum mismatch for file name.bin in part 202611_1_1_0\n"
    )
    assert int(headers["content-length"]) == len(text)
    assert reported == ["202611_1_1_0"]
    assert (server.sent_parts, server.requests) == (3, 4)


async def test_small_part_send_cancelled_while_it_was_read(server: InterserverServer) -> None:
    ep = server.endpoints[f"DataPartsExchange:{REPLICA}"]

    def lookup(name: str) -> PartToSend:
        ep.blocked = True  # SYSTEM STOP REPLICATED SENDS while the body is being built
        return part()

    ep.lookup = lookup
    status, _headers, body = await fetch(server.port, target())
    assert (status, body) == (500, b"Transferring part to replica was cancelled\n")
    assert server.sent_parts == 0


@settings(max_examples=200, deadline=None)
@given(
    endpoint=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40),
    part_name=st.text(max_size=30),
    method=st.sampled_from(["GET", "POST"]),
    body=st.binary(max_size=50),
)
def test_request_parsing_round_trip(endpoint: str, part_name: str, method: str, body: bytes) -> None:
    query = urlencode({"endpoint": endpoint, "part": part_name, "compress": "false"})
    raw = (
        f"{method} /?{query} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\nX-A:  b \r\n\r\n".encode()
        + body
    )

    async def parse() -> tuple[str, dict[str, str], dict[str, str], bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(raw + b"TAIL")
        reader.feed_eof()
        req = await read_request(reader)
        return req.method, req.query, req.headers, await reader.read()

    got_method, query_out, headers, rest = asyncio.run(parse())
    assert got_method == method
    assert query_out == {"endpoint": endpoint, "part": part_name, "compress": "false"}
    assert headers["x-a"] == "b"
    assert rest == b"TAIL"  # exactly the announced body was consumed
