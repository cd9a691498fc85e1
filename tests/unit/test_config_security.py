"""Config refusals that keep a daemon from starting exposed: an API bound beyond loopback without users,
an interserver listener beyond loopback without credentials, broken users and TLS settings."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from replicad.config import ConfigError, build_config, exposure_problems, is_loopback

H = hashlib.sha256(b"pw").hexdigest()
CREDS = {"user": "repl", "password": "s3cret"}


def cfg(tmp_path: Path, **sections: Any) -> dict[str, Any]:
    return {"replica": "r1", "data_path": str(tmp_path / "data"), **sections}


def problems(tmp_path: Path, environ: dict[str, str] | None = None, **sections: Any) -> list[str]:
    with pytest.raises(ConfigError) as e:
        build_config(cfg(tmp_path, **sections), environ or {})
    return e.value.problems


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.0.0.1", "192.168.1.5", "my-host",
                                  "localhost.evil.example"])
def test_exposed_hosts(host: str) -> None:
    assert not is_loopback(host)


def test_defaults_are_loopback_and_valid(tmp_path: Path) -> None:
    c = build_config(cfg(tmp_path), {})
    assert c.api.listen_host == "127.0.0.1" and c.interserver.listen_host == "127.0.0.1"
    assert c.api.users == () and exposure_problems(c) == []


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "node1.example"])
def test_exposed_api_without_users_is_refused(tmp_path: Path, host: str) -> None:
    p = problems(tmp_path, api={"listen_host": host})
    assert any(x.startswith("api.listen_host:") and "api.users" in x for x in p), p


def test_exposed_api_with_users_starts(tmp_path: Path) -> None:
    c = build_config(cfg(tmp_path, api={"listen_host": "0.0.0.0",
                                        "users": [{"name": "w", "password_sha256_hex": H.upper()}]}), {})
    assert c.api.users[0].password_sha256_hex == H and c.api.users[0].readonly == 0


@pytest.mark.parametrize("creds", [{}, {"user": "repl"}, {"password": "x"}, {"user": "", "password": ""}])
def test_exposed_interserver_without_credentials_is_refused(tmp_path: Path, creds: dict[str, str]) -> None:
    p = problems(tmp_path, interserver={"listen_host": "0.0.0.0", **creds})
    assert any(x.startswith("interserver.listen_host:") for x in p), p


def test_exposed_interserver_with_credentials_starts(tmp_path: Path) -> None:
    c = build_config(cfg(tmp_path, interserver={"listen_host": "0.0.0.0", **CREDS}), {})
    assert c.interserver.user == "repl"


def test_every_exposure_problem_is_listed_with_the_others(tmp_path: Path) -> None:
    p = problems(tmp_path, api={"listen_host": "0.0.0.0", "port": 70000},
                 interserver={"listen_host": "0.0.0.0"}, timezone="Mars/Base")
    text = "\n".join(p)
    assert "api.port" in text and "timezone" in text
    assert "api.listen_host" in text and "interserver.listen_host" in text


def test_environment_can_expose_only_with_users(tmp_path: Path) -> None:
    env = {"REPLICAD_API__LISTEN_HOST": "0.0.0.0"}
    assert any("api.users" in x for x in problems(tmp_path, env))
    env["REPLICAD_API__USERS"] = f"[{{name: w, password_sha256_hex: '{H}', readonly: 1}}]"
    c = build_config(cfg(tmp_path), env)
    assert c.api.users[0].name == "w" and c.api.users[0].readonly == 1


@pytest.mark.parametrize("user, message", [
    ({"name": "w", "password_sha256_hex": "abc"}, "64 hex digits"),
    ({"name": "w", "password_sha256_hex": "pw"}, "64 hex digits"),
    ({"name": "w:x", "password_sha256_hex": H}, "':'"),
    ({"name": "", "password_sha256_hex": H}, "name"),
    ({"name": "w", "password_sha256_hex": H, "readonly": 3}, "readonly"),
    ({"name": "w", "password": "plain"}, "unknown key"),
    ({"name": "w"}, "required"),
])
def test_bad_users_are_refused(tmp_path: Path, user: dict[str, Any], message: str) -> None:
    p = problems(tmp_path, api={"users": [user]})
    assert any("api.users" in x and message in x for x in p), p


def test_duplicate_user_names_are_refused(tmp_path: Path) -> None:
    u = {"name": "w", "password_sha256_hex": H}
    assert any("unique" in x for x in problems(tmp_path, api={"users": [u, u]}))


def test_tls_files_come_in_pairs_and_must_be_readable(tmp_path: Path) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    p = problems(tmp_path, api={"tls_cert_file": str(cert)},
                 interserver={"tls_cert_file": str(cert), "tls_key_file": str(tmp_path / "missing.pem")})
    text = "\n".join(p)
    assert "api: tls_cert_file and tls_key_file must be given together" in text
    assert "interserver.tls_key_file" in text and "missing.pem" in text


def dockerfile_env() -> dict[str, str]:
    """The REPLICAD_* defaults the image sets with ENV."""
    text = (Path(__file__).resolve().parents[2] / "Dockerfile").read_text()
    env: dict[str, str] = {}
    for m in re.finditer(r"^ENV\s+((?:.*\\\n)*.*)$", text, re.M):
        for item in m.group(1).replace("\\\n", " ").split():
            k, _, v = item.partition("=")
            env[k] = v
    return {k: v for k, v in env.items() if k.startswith("REPLICAD_")}


def test_container_defaults_refuse_to_run_open_and_carry_no_identity(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    assert "COPY config/docker/replicad.yaml /etc/replicad/replicad.yaml" in (repo / "Dockerfile").read_text()
    image = yaml.safe_load((repo / "config" / "docker" / "replicad.yaml").read_text())
    assert "replica" not in image and not image.get("tables")  # no baked-in identity or demo table
    image["data_path"] = str(tmp_path / "data")
    env = dockerfile_env()
    assert env["REPLICAD_API__LISTEN_HOST"] == "0.0.0.0"  # a container is reached from outside
    with pytest.raises(ConfigError) as e:
        build_config(image, env)
    text = "\n".join(e.value.problems)
    assert "api.users" in text and "interserver.user and interserver.password" in text
    assert "replica" in text  # the name must be given
    env.update(REPLICAD_API__USERS=f"[{{name: writer, password_sha256_hex: '{H}'}}]",
               REPLICAD_INTERSERVER__USER="replica", REPLICAD_INTERSERVER__PASSWORD="secret",
               REPLICAD_REPLICA="r7")
    c = build_config(image, env)
    assert c.api.users[0].name == "writer" and c.interserver.user == "replica" and c.replica == "r7"


def test_check_config_warns_about_a_loopback_interserver_host_with_a_remote_zookeeper(tmp_path: Path) -> None:
    from replicad.config import config_warnings

    base = {"replica": "r1", "data_path": str(tmp_path)}
    assert config_warnings(build_config(base, {})) == []  # everything on loopback: a test or a demo
    remote = build_config({**base, "zookeeper": {"hosts": "10.0.0.5:2181"}}, {})
    assert any("interserver.host is 127.0.0.1" in w for w in config_warnings(remote))
    fixed = build_config({**base, "zookeeper": {"hosts": "10.0.0.5:2181"},
                          "interserver": {"host": "10.0.0.7"}}, {})
    assert config_warnings(fixed) == []


def test_stale_spool_files_are_removed_at_start(tmp_path: Path) -> None:
    from replicad.daemon import remove_stale_spool_files

    spool = tmp_path / "tmp"
    spool.mkdir()
    (spool / "replicad-insert-abc.parquet").write_bytes(b"x")
    (spool / "someone-else").write_bytes(b"keep")
    assert remove_stale_spool_files(spool) == 1
    assert [p.name for p in spool.iterdir()] == ["someone-else"]
    assert remove_stale_spool_files(tmp_path / "missing") == 0
