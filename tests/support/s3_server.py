"""A real S3-compatible server for tests: moto in server mode, as a subprocess on a free loopback port.

``S3Server.start(tmp)`` spawns ``python -m moto.server -H 127.0.0.1 -p PORT`` and waits for it; ``client()``
returns a :class:`replicad.s3.S3Client` for one bucket (created), ``disk()`` a :class:`S3Disk` over it.
Non-last multipart parts must be >= 5 MiB (moto enforces it, as S3 does).
"""

from __future__ import annotations

import sys
import time
import urllib.request
from pathlib import Path
from subprocess import Popen

from replicad.devtools.ports import free_port, port_is_open
from replicad.devtools.process import spawn, terminate
from replicad.s3 import S3Client, S3Endpoint
from replicad.storage.disk_s3 import S3Disk

ACCESS_KEY = "testing"
SECRET_KEY = "testing"


class S3Server:
    def __init__(self, port: int, proc: Popen[bytes]) -> None:
        self.port = port
        self.proc = proc

    @classmethod
    def start(cls, log_dir: Path) -> S3Server:
        port = free_port()
        proc = spawn([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                     log_dir / "moto.log")
        deadline = time.monotonic() + 30
        while not port_is_open(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto server did not start (see {log_dir / 'moto.log'})")
            time.sleep(0.05)
        return cls(port, proc)

    def endpoint(self, bucket: str, prefix: str = "data/") -> str:
        return f"http://127.0.0.1:{self.port}/{bucket}/{prefix}"

    def client(self, bucket: str, prefix: str = "data/") -> S3Client:
        c = S3Client(S3Endpoint.parse(self.endpoint(bucket, prefix)), ACCESS_KEY, SECRET_KEY, max_attempts=3)
        c.create_bucket_sync()
        return c

    def disk(self, data_path: Path, bucket: str, prefix: str = "data/", name: str = "s3main") -> S3Disk:
        return S3Disk(name, self.client(bucket, prefix), data_path / "disks" / name)

    def reset(self) -> None:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/moto-api/reset", method="POST")
        urllib.request.urlopen(req, timeout=10).read()

    def stop(self) -> None:
        terminate(self.proc, timeout=5)
