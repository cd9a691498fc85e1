"""The daemon's configuration: one validated tree read from YAML, with environment overrides.

``load_config(path)`` reads the YAML file, applies ``REPLICAD_<SECTION>__<KEY>`` (or ``REPLICAD_<KEY>`` for
top-level keys) environment variables, validates everything and raises :class:`ConfigError` carrying
*every* problem found — pydantic field errors, unknown/invalid MergeTree settings, undefined macros,
unparsable table DDL, port clashes — so an operator fixes the file in one pass.
"""

from __future__ import annotations

import importlib
import ipaddress
import os
import re
import zoneinfo
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator

from replicad import settings as settings_table
from replicad.config_sections import ClusterShard, DistributedDDLConfig, StorageConfig, _Section

ENV_PREFIX = "REPLICAD_"
BUILTIN_MACROS = frozenset({"replica", "database", "table", "uuid"})
_MACRO_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_HOST_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+)(?::(\d{1,5}))?$")


class ConfigError(Exception):
    """The configuration is invalid; ``problems`` lists every problem, one line each."""

    def __init__(self, problems: list[str], source: str = "") -> None:
        self.problems = problems
        self.source = source
        head = f"invalid configuration {source}".rstrip()
        super().__init__(head + ":\n" + "\n".join(f"  - {p}" for p in problems))


class ZooKeeperConfig(_Section):
    hosts: str = "127.0.0.1:2181"
    session_timeout_s: float = Field(default=30.0, gt=0, le=600)

    @field_validator("hosts")
    @classmethod
    def _check_hosts(cls, v: str) -> str:
        split_hosts(v)  # raises ValueError with a precise message
        return v

    @property
    def host_list(self) -> list[tuple[str, int]]:
        return split_hosts(self.hosts)[0]

    @property
    def chroot(self) -> str:
        return split_hosts(self.hosts)[1]


class InterserverConfig(_Section):
    listen_host: str = "127.0.0.1"  # ClickHouse's default: a non-loopback bind needs user/password
    port: int = Field(default=9009, ge=1, le=65535)
    host: str = "127.0.0.1"
    user: str | None = None
    password: str | None = None
    tls_cert_file: Path | None = None  # both set: the listener speaks HTTPS, peers are told scheme https
    tls_key_file: Path | None = None
    tls_ca_file: Path | None = None  # CA bundle peers' certificates are checked against (default: system)
    #: open connections at most (one more is answered 503 and closed)
    max_connections: int = Field(default=1024, ge=1, le=65536)
    #: parts sent at once in all (429 beyond; replicated_max_parallel_sends may lower it); 0 = no limit
    max_parallel_sends: int = Field(default=64, ge=0)
    #: a peer that takes no bytes of an answer for this long is cut off (ClickHouse's http_send_timeout)
    send_timeout_s: float = Field(default=30.0, gt=0, le=86400)
    #: a fetched part may be this large at most (its declared and streamed sizes are checked against it)
    max_fetch_part_bytes: int = Field(default=1 << 40, gt=0)

    @field_validator("user", "password", "tls_cert_file", "tls_key_file", "tls_ca_file", mode="before")
    @classmethod
    def _empty_is_none(cls, v: object) -> object:
        return None if v == "" else v

    @field_validator("user")
    @classmethod
    def _check_user(cls, v: str | None) -> str | None:
        if v is not None and (":" in v or not v.isprintable()):
            raise ValueError("must not contain ':' or control characters (it travels in HTTP Basic auth)")
        return v


_SHA256_HEX = re.compile(r"^[0-9a-fA-F]{64}$")


class UserConfig(_Section):
    """An API user, as ClickHouse's users.xml: the password's SHA-256 (hex) and a ``readonly`` level."""

    name: str = Field(min_length=1, max_length=256)
    password_sha256_hex: str
    readonly: Literal[0, 1, 2] = 0  # 0 everything; 1 reads only; 2 reads and settings

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        if ":" in v or not v.isprintable() or v.strip() != v:
            raise ValueError("must be printable, without ':' or spaces at the ends")
        return v

    @field_validator("password_sha256_hex")
    @classmethod
    def _check_hash(cls, v: str) -> str:
        if not _SHA256_HEX.match(v):
            raise ValueError("must be 64 hex digits: the SHA-256 of the password "
                             "(echo -n 'password' | sha256sum)")
        return v.lower()


class ApiConfig(_Section):
    listen_host: str = "127.0.0.1"
    port: int = Field(default=8123, ge=1, le=65535)
    max_body_bytes: int = Field(default=10 * 1024**3, gt=0)
    #: a request body that sends nothing for this long is refused (408, code 209; ClickHouse's
    #: http_receive_timeout)
    receive_timeout_s: float = Field(default=30.0, gt=0, le=86400)
    #: one line of a line-based input format (TSV, JSONEachRow, a header) at most (400, code 117)
    max_line_bytes: int = Field(default=64 << 20, ge=1024)
    #: inserts at once, each with a parser thread of its own (not the shared executor); more are refused
    #: with 503 (code 202, retriable), as ClickHouse's max_concurrent_queries
    max_concurrent_inserts: int = Field(default=100, ge=1, le=4096)
    drain_timeout_s: float = Field(default=30.0, ge=0)
    #: a request that needs the tables while the daemon is still loading them waits this long for them
    startup_wait_s: float = Field(default=120.0, ge=0)
    #: /replicas_status answers 503 for a table this far behind (ClickHouse's
    #: max_replica_delay_for_distributed_queries)
    max_replica_delay_s: float = Field(default=300.0, gt=0)
    users: tuple[UserConfig, ...] = ()  # none: loopback bind only, and "default" may do everything
    tls_cert_file: Path | None = None  # both set: the API speaks HTTPS
    tls_key_file: Path | None = None

    @field_validator("tls_cert_file", "tls_key_file", mode="before")
    @classmethod
    def _empty_is_none(cls, v: object) -> object:
        return None if v == "" else v

    @field_validator("users")
    @classmethod
    def _unique_names(cls, v: tuple[UserConfig, ...]) -> tuple[UserConfig, ...]:
        names = [u.name for u in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"user names must be unique: {', '.join(dup)} given twice")
        return v


class Config(_Section):
    replica: str = Field(min_length=1)
    data_path: Path = Path("/var/lib/replicad")
    timezone: str = "UTC"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    macros: dict[str, str] = Field(default_factory=dict)
    zookeeper: ZooKeeperConfig = Field(default_factory=ZooKeeperConfig)
    interserver: InterserverConfig = Field(default_factory=InterserverConfig)
    api: ApiConfig = Field(default_factory=ApiConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    settings: dict[str, int | float | str] = Field(default_factory=dict)
    tables: list[str] = Field(default_factory=list)
    #: clusters for ``… ON CLUSTER c`` (shaped like ClickHouse's ``remote_servers``)
    clusters: dict[str, list[ClusterShard]] = Field(default_factory=dict)
    distributed_ddl: DistributedDDLConfig | None = None

    @field_validator("replica")
    @classmethod
    def _check_replica(cls, v: str) -> str:
        if "/" in v or v.strip() != v or _MACRO_RE.search(v):
            raise ValueError("must be a plain name (no '/', spaces at the ends or macros)")
        return v

    @field_validator("timezone")
    @classmethod
    def _check_timezone(cls, v: str) -> str:
        try:
            zoneinfo.ZoneInfo(v)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {v!r}") from None
        return v

    @field_validator("macros", mode="before")
    @classmethod
    def _macros_as_text(cls, v: object) -> object:
        # YAML turns `shard: 01` into 1; macros are text, so keep what the user most likely meant.
        if isinstance(v, Mapping):
            return {str(k): (str(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x)
                    for k, x in v.items()}
        return v

    # ---- derived -------------------------------------------------------------------------------------

    def setting(self, name: str) -> int | float | str:
        """A setting's effective value (config value, else ClickHouse's default)."""
        if name in self.settings:
            return self.settings[name]
        return settings_table.SETTINGS[name].default

    def effective_settings(self) -> dict[str, int | float | str]:
        out = settings_table.defaults()
        out.update(self.settings)
        return out

    def expand_macros(self, text: str, *, database: str | None = None, table: str | None = None) -> str:
        """Substitute ``{name}`` macros: config macros plus ``{replica}``, ``{database}``, ``{table}``."""
        values = dict(self.macros)
        values.setdefault("replica", self.replica)
        if database is not None:
            values.setdefault("database", database)
        if table is not None:
            values.setdefault("table", table)

        def sub(m: re.Match[str]) -> str:
            try:
                return values[m.group(1)]
            except KeyError:
                raise ValueError(f"macro {{{m.group(1)}}} is not defined") from None

        return _MACRO_RE.sub(sub, text)

    @property
    def metadata_path(self) -> Path:
        return self.data_path / "metadata"

    @property
    def tables_path(self) -> Path:
        return self.data_path / "data"

    @property
    def tmp_path(self) -> Path:
        return self.data_path / "tmp"


def split_hosts(hosts: str) -> tuple[list[tuple[str, int]], str]:
    """``"h1:2181,h2:2182/chroot"`` -> ([("h1", 2181), ("h2", 2182)], "/chroot")."""
    text = hosts.strip()
    chroot = ""
    slash = text.find("/")
    if slash >= 0:
        text, chroot = text[:slash], text[slash:]
        if chroot == "/":
            chroot = ""
        elif chroot.endswith("/") or "//" in chroot or any(c in chroot for c in " \t,"):
            raise ValueError(f"invalid chroot {chroot!r}")
    out: list[tuple[str, int]] = []
    for item in text.split(","):
        item = item.strip()
        m = _HOST_RE.match(item)
        if not m:
            raise ValueError(f"invalid host {item!r}: expected host[:port]")
        port = int(m.group(2) or 2181)
        if not 1 <= port <= 65535:
            raise ValueError(f"invalid port in {item!r}")
        out.append((m.group(1).strip("[]"), port))
    return out, chroot


# ---- loading ---------------------------------------------------------------------------------------------


def load_config(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> Config:
    """Read, override and validate; raise :class:`ConfigError` listing every problem."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError([f"cannot read config file: {e.strerror or e}"], source) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError([f"YAML syntax: {e}".replace("\n", " ")], source) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(["the top level must be a mapping of keys to values"], source)
    return build_config(raw, environ if environ is not None else os.environ, source)


def build_config(raw: dict[str, Any], environ: Mapping[str, str], source: str = "") -> Config:
    data, problems = apply_env_overrides(raw, environ)
    cfg: Config | None = None
    try:
        cfg = Config.model_validate({k: v for k, v in data.items() if k != "settings"})
    except ValidationError as e:
        problems.extend(_format_pydantic(e))
    settings_raw = data.get("settings") or {}
    coerced: dict[str, int | float | str] = {}
    if not isinstance(settings_raw, Mapping):
        problems.append("settings: must be a mapping of setting names to values")
    else:
        valid, setting_problems = settings_table.validate({str(k): v for k, v in settings_raw.items()})
        problems.extend(f"settings.{p}" for p in setting_problems)
        coerced = {str(k): valid[str(k)] for k in settings_raw if str(k) in valid}
    problems.extend(_check_tables(data))
    problems.extend(_check_listeners(data))
    problems.extend(_check_exposure(data))
    data_path = data.get("data_path") or Config.model_fields["data_path"].default
    if isinstance(data_path, (str, Path)):
        problems.extend(_check_data_path(Path(data_path)))
    if cfg is not None:
        problems.extend(cfg.storage.problems())
    if problems:
        raise ConfigError(problems, source)
    assert cfg is not None
    return cfg.model_copy(update={"settings": coerced})


def apply_env_overrides(raw: dict[str, Any], environ: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """Merge ``REPLICAD_<SECTION>__<KEY>=value`` into a copy of ``raw``.

    Values stay text (pydantic converts them), except that ``[...]``/``{...}`` values are parsed as YAML
    so lists (``REPLICAD_TABLES``) and maps can be given too.
    """
    data: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    problems: list[str] = []
    known = set(Config.model_fields)
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX):
            continue
        keys = [k.lower() for k in name[len(ENV_PREFIX):].split("__")]
        if keys[0] not in known:
            continue  # other REPLICAD_* variables (test harnesses, wrappers) are not ours
        value: Any = environ[name]
        if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError:
                problems.append(f"environment {name}: not valid YAML")
                continue
        if len(keys) == 1:
            data[keys[0]] = value
        elif len(keys) == 2 and all(keys):
            section = data.get(keys[0])
            if section is None:
                section = {}
            if not isinstance(section, dict):
                problems.append(f"environment {name}: {keys[0]} is not a section")
                continue
            section = dict(section)
            section[keys[1]] = value
            data[keys[0]] = section
        else:
            problems.append(f"environment {name}: expected REPLICAD_<SECTION>__<KEY>")
    return data, problems


def _format_pydantic(e: ValidationError) -> list[str]:
    out = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "missing":
            msg = "required"
        elif "input" in err and err["type"] not in ("value_error",):
            msg = f"{msg} (got {err['input']!r})"
        msg = msg.removeprefix("Value error, ")
        out.append(f"{loc}: {msg}")
    return out


def _check_tables(data: Mapping[str, Any]) -> list[str]:
    tables = data.get("tables") or []
    if not isinstance(tables, list):
        return []  # pydantic already reported it
    macros = data.get("macros") or {}
    defined = set(macros) if isinstance(macros, Mapping) else set()
    problems = []
    storage = data.get("storage") or {}
    raw_policies = storage.get("policies") if isinstance(storage, Mapping) else None
    policies = set(raw_policies) if isinstance(raw_policies, Mapping) else set()
    parse = _ddl_parser()
    for i, ddl in enumerate(tables):
        if not isinstance(ddl, str):
            continue
        for name in sorted(set(_MACRO_RE.findall(ddl)) - defined - BUILTIN_MACROS):
            problems.append(f"tables[{i}]: macro {{{name}}} is not defined in macros")
        if not re.match(r"\s*CREATE\s+TABLE\b", ddl, re.IGNORECASE):
            problems.append(f"tables[{i}]: expected a CREATE TABLE statement")
            continue
        if parse is not None:
            try:
                table = parse(ddl)
            except Exception as e:  # the DDL parser reports syntax problems with its own exceptions
                problems.append(f"tables[{i}]: {e}")
                continue
            if getattr(table, "zk_path", "") is None:
                problems.append(f"tables[{i}]: engine {getattr(table, 'engine', '?')} is not replicated: "
                                "replicad serves ReplicatedMergeTree tables only")
            policy = str((getattr(table, "settings", None) or {}).get("storage_policy", "default")).strip("'")
            if policy != "default" and policy not in policies:
                problems.append(f"tables[{i}]: storage_policy {policy!r} is not in storage.policies")
    return problems


def _ddl_parser() -> Any:
    try:
        ddl = importlib.import_module("replicad.sql.ddl")
    except ImportError:  # the SQL module is optional for config validation
        return None
    return getattr(ddl, "parse_create_table", None)


def _check_listeners(data: Mapping[str, Any]) -> list[str]:
    """The API and interserver listeners must not collide (checked on the raw values, so it is reported
    together with field errors elsewhere)."""

    def listener(section: str, model: type[_Section]) -> tuple[str, int] | None:
        raw = data.get(section) or {}
        if not isinstance(raw, Mapping):
            return None
        host = raw.get("listen_host", model.model_fields["listen_host"].default)
        try:
            port = int(raw.get("port", model.model_fields["port"].default))
        except (TypeError, ValueError):
            return None
        return str(host), port

    a, s = listener("api", ApiConfig), listener("interserver", InterserverConfig)
    if a is None or s is None or a[1] != s[1]:
        return []
    wildcard = {"0.0.0.0", "::", ""}
    if a[0] == s[0] or {a[0], s[0]} & wildcard:
        return [f"api.port and interserver.port are both {a[1]} on overlapping addresses"]
    return []


def config_warnings(cfg: Config) -> list[str]:
    """Things that are allowed but almost certainly wrong outside a one-host test (check-config prints them,
    the daemon logs them at start)."""
    out = []
    zk_remote = [h for h, _p in cfg.zookeeper.host_list if not is_loopback(h)]
    if is_loopback(cfg.interserver.host) and zk_remote:
        out.append(f"interserver.host is {cfg.interserver.host} while ZooKeeper is on {zk_remote[0]}: "
                   "replicas on other hosts would fetch parts from their own loopback; set it to an address "
                   "they reach")
    if not is_loopback(cfg.api.listen_host) and not cfg.api.tls_cert_file:
        out.append(f"api.listen_host is {cfg.api.listen_host} without TLS: passwords travel in clear text "
                   "(api.tls_cert_file / tls_key_file)")
    if not is_loopback(cfg.interserver.listen_host) and not cfg.interserver.tls_cert_file:
        out.append(f"interserver.listen_host is {cfg.interserver.listen_host} without TLS: the interserver "
                   "password and the parts travel in clear text")
    return out


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` only accepts connections from this machine (names other than localhost
    count as exposed: what they resolve to can change)."""
    name = host.strip().strip("[]").lower()
    if name in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def exposure_problems(cfg: Config) -> list[str]:
    """What makes a validated config unsafe to run (see :func:`_check_exposure`)."""
    return _check_exposure(cfg.model_dump())


def _check_exposure(data: Mapping[str, Any]) -> list[str]:
    """An exposed listener without credentials, half a TLS pair, unreadable TLS files.  Works on the raw
    values, so it is reported together with field errors elsewhere."""

    def section(name: str) -> Mapping[str, Any]:
        raw = data.get(name)
        return raw if isinstance(raw, Mapping) else {}

    def host(raw: Mapping[str, Any], model: type[_Section]) -> str:
        return str(raw.get("listen_host", model.model_fields["listen_host"].default))

    problems: list[str] = []
    api, inter = section("api"), section("interserver")
    api_host, inter_host = host(api, ApiConfig), host(inter, InterserverConfig)
    if not api.get("users") and not is_loopback(api_host):
        problems.append(f"api.listen_host: {api_host} is not a loopback address, so api.users must list at "
                        "least one user (without users only a loopback bind is allowed)")
    if not is_loopback(inter_host) and not (inter.get("user") and inter.get("password")):
        problems.append(f"interserver.listen_host: {inter_host} is not a loopback address, so "
                        "interserver.user and interserver.password must both be set")
    if inter.get("password") and not inter.get("user"):
        problems.append("interserver.password: set without interserver.user")
    for name, raw in (("api", api), ("interserver", inter)):
        cert, key = raw.get("tls_cert_file") or None, raw.get("tls_key_file") or None
        if (cert is None) != (key is None):
            problems.append(f"{name}: tls_cert_file and tls_key_file must be given together")
        ca = raw.get("tls_ca_file") or None
        for field_name, path in (("tls_cert_file", cert), ("tls_key_file", key), ("tls_ca_file", ca)):
            if isinstance(path, (str, Path)) and not (os.path.isfile(path) and os.access(path, os.R_OK)):
                problems.append(f"{name}.{field_name}: {path} is not a readable file")
    return problems


def _check_data_path(path: Path) -> list[str]:
    p = path.absolute()
    if p.exists():
        if not p.is_dir():
            return [f"data_path: {p} exists and is not a directory"]
        if not os.access(p, os.W_OK | os.X_OK):
            return [f"data_path: {p} is not writable"]
        return []
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        return [f"data_path: {p} does not exist and cannot be created ({parent} is not writable)"]
    return []


RESTART_REQUIRED = ("replica", "data_path", "timezone", "macros", "zookeeper", "interserver", "clusters",
                    "distributed_ddl", "storage")


def restart_required(old: Config, new: Config) -> list[str]:
    """Names of changed keys a SIGHUP cannot apply (the daemon must be restarted for them)."""
    changed = [k for k in RESTART_REQUIRED if getattr(old, k) != getattr(new, k)]
    if (old.api.listen_host, old.api.port) != (new.api.listen_host, new.api.port):
        changed.append("api.listen_host/api.port")
    if (old.api.tls_cert_file, old.api.tls_key_file) != (new.api.tls_cert_file, new.api.tls_key_file):
        changed.append("api.tls_cert_file/api.tls_key_file")
    return changed
