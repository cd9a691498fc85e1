"""Command line: ``replicad run|check-config --config PATH`` and ``replicad status [--url URL] [--check]
[--watch [S]]``.

Exit codes: 0 ok; 1 run-time failure (start-up failed, shutdown step failed, status answered an HTTP
error); 2 usage error, or status cannot reach the daemon; 3 ``status --check``: unhealthy; 78 (EX_CONFIG)
invalid configuration — every problem is listed on stderr, and the systemd unit does not restart on 78.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from replicad.config import Config, ConfigError, load_config

EX_CONFIG = 78


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="replicad", description="ClickHouse ReplicatedMergeTree replica daemon")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run the daemon in the foreground (JSON logs on stdout)")
    run.add_argument("--config", required=True, help="YAML config file")
    check = sub.add_parser("check-config", help="validate a config file and exit")
    check.add_argument("--config", required=True, help="YAML config file")
    status = sub.add_parser("status", help="show a running daemon's /status")
    status.add_argument("--url", default=None, help="API address (default http://127.0.0.1:8123)")
    status.add_argument("--config", default=None, help="take the API address from this config file")
    status.add_argument("--json", action="store_true", help="print the raw /status JSON")
    status.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the answer")
    status.add_argument("--check", action="store_true",
                        help="exit 3 when unhealthy (not running, ZooKeeper lost, a table read-only, lost or "
                             "lagging, a task crashed)")
    status.add_argument("--watch", type=float, nargs="?", const=2.0, default=None, metavar="SECONDS",
                        help="redraw every SECONDS (default 2) until interrupted")
    status.add_argument("--user", default=os.environ.get("REPLICAD_USER"),
                        help="API user (default $REPLICAD_USER)")
    status.add_argument("--password", default=None,
                        help="API password (default $REPLICAD_PASSWORD; prefer the variable)")
    return p


def _load(path: str) -> Config | None:
    try:
        return load_config(path)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return None


def cmd_check_config(path: str) -> int:
    cfg = _load(path)
    if cfg is None:
        return EX_CONFIG
    from replicad.config import config_warnings

    print(f"{path}: ok")
    for w in config_warnings(cfg):
        print(f"  warning: {w}")
    print(f"  replica      {cfg.replica}")
    print(f"  data_path    {cfg.data_path.absolute()}")
    print(f"  zookeeper    {cfg.zookeeper.hosts}")
    print(f"  api          {cfg.api.listen_host}:{cfg.api.port}")
    print(f"  interserver  {cfg.interserver.listen_host}:{cfg.interserver.port} (advertised "
          f"{cfg.interserver.host})")
    print(f"  tables       {len(cfg.tables)}")
    if cfg.settings:
        print("  settings     " + ", ".join(f"{k}={v}" for k, v in sorted(cfg.settings.items())))
    return 0


def cmd_run(path: str) -> int:
    from replicad.memory import (
        defer_import,
        import_without_default_tls,
        keep_out,
        limit_malloc_arenas,
        tune_allocators,
    )

    limit_malloc_arenas()  # before any other thread allocates: the memory big inserts used is given back
    tune_allocators()  # before pyarrow loads (reading the config loads it): its allocator reads options once
    keep_out()  # pandas (pyarrow would import it), rich (structlog, imported with the config): never used
    defer_import()  # pyarrow.compute: imported when first used (a daemon that only replicates never does)
    import_without_default_tls()  # aiohttp's unused default client contexts left without the CA bundle
    cfg = _load(path)
    if cfg is None:
        return EX_CONFIG
    from replicad.daemon import (  # heavy imports only when running
        DEFAULT_ENGINE,
        EngineUnavailableError,
        load_engine_factory,
        run_daemon,
    )

    # REPLICAD_ENGINE_FACTORY=module:callable swaps the engine (tests run the shell with a fake one).
    try:
        factory = load_engine_factory(os.environ.get("REPLICAD_ENGINE_FACTORY") or DEFAULT_ENGINE)
    except EngineUnavailableError as e:
        print(f"replicad: {e}", file=sys.stderr)
        return 1
    return run_daemon(cfg, config_path=path, engine_factory=factory)


def cmd_status(url: str | None, config: str | None, raw: bool, timeout_s: float, *, check: bool = False,
               watch: float | None = None, user: str | None = None, password: str | None = None) -> int:
    import base64
    import time

    from replicad.server.status import fetch_status, status_command

    if url is None and config is not None:
        cfg = _load(config)
        if cfg is None:
            return EX_CONFIG
        host = cfg.api.listen_host if cfg.api.listen_host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        url = f"http://{host}:{cfg.api.port}"
    url = url or "http://127.0.0.1:8123"
    password = password if password is not None else os.environ.get("REPLICAD_PASSWORD", "")
    headers = {}
    if user:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    if raw:
        try:
            print(json.dumps(fetch_status(url, timeout_s, headers), indent=2))
        except Exception as e:
            print(f"replicad status: cannot read {url}/status: {e}", file=sys.stderr)
            return 1
        return 0
    while True:
        code, text = status_command(url, timeout_s, check=check, headers=headers)
        if watch is None:
            (sys.stdout if code == 0 else sys.stderr).write(text)
            return code
        sys.stdout.write("\x1b[H\x1b[2J" + time.strftime("%H:%M:%S ") + url + "\n\n" + text)
        sys.stdout.flush()
        try:
            time.sleep(max(0.2, watch))
        except KeyboardInterrupt:
            return code


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "check-config":
        return cmd_check_config(args.config)
    if args.command == "run":
        return cmd_run(args.config)
    return cmd_status(args.url, args.config, args.json, args.timeout, check=args.check, watch=args.watch,
                      user=args.user, password=args.password)


if __name__ == "__main__":
    sys.exit(main())
