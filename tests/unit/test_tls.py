"""Optional TLS: the API and the interserver listener speak HTTPS with the configured certificate, and
refuse plain HTTP; the interserver publishes scheme https for its peers."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import socket
import ssl
from pathlib import Path

import aiohttp
import pytest

from replicad.config import build_config
from replicad.server.api import ApiServer, ApiState
from replicad.server.interserver import Endpoint, InterserverServer, PartToSend
from replicad.server.metrics import Metrics
from replicad.server.tls import client_context
from replicad.storage.checksums import Checksums
from tests.support.tls import self_signed

PART_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "ch18_part_basic" / "202611_1_1_0"
REPLICA = "/clickhouse/tables/t/replicas/r1"


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def plain_http(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        out = b""
        try:
            while chunk := c.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
    return out


async def test_api_over_tls(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    users = [{"name": "w", "password_sha256_hex": hashlib.sha256(b"pw").hexdigest()}]
    cfg = build_config({"replica": "r1", "data_path": str(tmp_path / "data"),
                        "api": {"port": 1, "users": users, "tls_cert_file": str(cert),
                                "tls_key_file": str(key)}}, {})
    server = ApiServer(ApiState(config=cfg, metrics=Metrics(), state="running"), host="127.0.0.1", port=0)
    await server.start()
    try:
        ctx = client_context(cert)
        async with aiohttp.ClientSession() as s:
            async with s.get(f"https://127.0.0.1:{server.port}/ping", ssl=ctx) as r:
                assert r.status == 200 and await r.text() == "Ok.\n"
            async with s.get(f"https://localhost:{server.port}/?query=SELECT+1", ssl=ctx) as r:
                assert r.status == 401
            async with s.get(f"https://127.0.0.1:{server.port}/?query=SELECT+1", ssl=ctx,
                             headers=basic("w", "pw")) as r:
                assert r.status == 200 and await r.text() == "1\n"
            # a client that does not trust the certificate gets no answer
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                async with s.get(f"https://127.0.0.1:{server.port}/ping", ssl=ssl.create_default_context()):
                    pass
        assert b"Ok." not in await asyncio.to_thread(plain_http, server.port)
    finally:
        await server.stop()


async def test_interserver_over_tls_with_credentials(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    server = InterserverServer("127.0.0.1", 0, user="u", password="p", tls_files=(cert, key))
    assert server.scheme == "https"
    await server.start()
    checksums = Checksums.parse((PART_DIR / "checksums.txt").read_bytes())
    server.register(REPLICA, Endpoint(lambda _n: PartToSend(PART_DIR, checksums)))
    params = {"endpoint": f"DataPartsExchange:{REPLICA}", "part": "202611_1_1_0", "compress": "false"}
    url = f"https://127.0.0.1:{server.port}/"
    try:
        ctx = client_context(cert)
        async with aiohttp.ClientSession() as s:
            async with s.post(url, params=params, ssl=ctx) as r:
                assert r.status == 401
            async with s.post(url, params=params, ssl=ctx, headers=basic("u", "wrong")) as r:
                assert r.status == 401
            async with s.post(url, params=params, ssl=ctx, headers=basic("u", "p")) as r:
                assert r.status == 200 and len(await r.read()) > 100
        assert b"200 OK" not in await asyncio.to_thread(plain_http, server.port)
    finally:
        await server.stop(grace_s=0.1)
    assert InterserverServer("127.0.0.1", 0).scheme == "http"
