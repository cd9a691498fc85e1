"""SIGHUP and users: new users apply at once, but a reload that would leave an exposed API without users
(the bind address only changes on restart) is refused as a whole."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

from replicad.config import build_config
from replicad.daemon import Daemon
from replicad.sd_notify import Notifier

H1, H2 = hashlib.sha256(b"one").hexdigest(), hashlib.sha256(b"two").hexdigest()


def raw(tmp_path: Path, host: str, users: list[dict[str, Any]], **api: Any) -> dict[str, Any]:
    return {"replica": "r1", "data_path": str(tmp_path / "data"),
            "api": {"listen_host": host, "port": 18123, "users": users, **api}}


async def test_reload_keeps_an_exposed_api_protected(tmp_path: Path) -> None:
    first = raw(tmp_path, "0.0.0.0", [{"name": "w", "password_sha256_hex": H1}])
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(first))
    d = Daemon(build_config(first, {}), config_path=path, notifier=Notifier({}))
    # users change: applied at once
    path.write_text(yaml.safe_dump(raw(tmp_path, "0.0.0.0", [{"name": "w", "password_sha256_hex": H2}])))
    assert await d.reload() is True
    assert d.api_state.config.api.users[0].password_sha256_hex == H2
    # the file now binds loopback without users (valid on its own), but the running bind stays 0.0.0.0
    path.write_text(yaml.safe_dump(raw(tmp_path, "127.0.0.1", [], max_body_bytes=5)))
    assert await d.reload() is False
    assert d.api_state.config.api.users[0].password_sha256_hex == H2
    assert d.api_state.config.api.listen_host == "0.0.0.0"
    assert d.api_state.config.api.max_body_bytes != 5  # refused as a whole


async def test_reload_does_not_switch_tls_files(tmp_path: Path) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    first = raw(tmp_path, "127.0.0.1", [])
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(first))
    d = Daemon(build_config(first, {}), config_path=path, notifier=Notifier({}))
    path.write_text(yaml.safe_dump(raw(tmp_path, "127.0.0.1", [], tls_cert_file=str(cert),
                                       tls_key_file=str(cert))))
    assert await d.reload() is True
    assert d.api_state.config.api.tls_cert_file is None  # needs a restart
