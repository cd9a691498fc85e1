"""The DataPartsExchange server on a loopback port: ClickHouse 18.16's answers, status codes and auth.

The part served is the golden 18.16 part of tests/fixtures/ch18_part_basic; its v0 body must be
byte-identical to what 18.16 itself answered for the same part.
"""

from __future__ import annotations

import asyncio
import base64
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
import pytest_asyncio
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.model.checksums import Checksums
from replicad.server.interserver import Endpoint, InterserverServer, PartToSend, read_request
from replicad.storage.part_transfer import receive_part

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
