"""A small S3 client over boto3: whole-file uploads (multipart above a threshold, by s3transfer), ranged
downloads, HEAD, listing and batched deletes, with botocore's retries.  Every call runs in a worker thread
(boto3 blocks); errors come out as :class:`S3Error` / :class:`NoSuchKeyError`."""

from __future__ import annotations

import asyncio
import email.utils
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from replicad.errors import ReplicadError
from replicad.s3.endpoint import S3Endpoint

DELETE_BATCH = 1000  # DeleteObjects takes at most 1000 keys (moto does not enforce it; S3 does)
MIN_PART_SIZE = 5 * 1024 * 1024
_READ_CHUNK = 4 * 1024 * 1024


class S3Error(ReplicadError):
    code = 499  # S3_ERROR
    retriable = True


class NoSuchKeyError(S3Error):
    retriable = False


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    mtime: float = 0.0  # LastModified, seconds since the epoch


#: a listing: the objects, and the S3 server's time when it began (None when the server did not say)
Listing = tuple[list[ObjectInfo], float | None]


def _translate(e: Exception, what: str) -> S3Error:
    # botocore is imported by the first client (see S3Client.__init__): a daemon without an S3 disk has none,
    # and never maps botocore's exceptions module (~0.3 MiB resident) for the isinstance below
    import botocore.exceptions

    if isinstance(e, botocore.exceptions.ClientError):
        code = str(e.response.get("Error", {}).get("Code", ""))
        if code in ("NoSuchKey", "404", "NotFound"):
            return NoSuchKeyError(f"{what}: no such key")
        return S3Error(f"{what}: {code or 'error'}: {e}")
    return S3Error(f"{what}: {e}")


class S3Client:
    """One bucket of one endpoint; keys given to the methods are full object keys."""

    def __init__(
        self,
        endpoint: S3Endpoint,
        access_key_id: str,
        secret_access_key: str,
        *,
        region: str = "us-east-1",
        max_attempts: int = 5,
        multipart_threshold: int = 32 * 1024 * 1024,
        multipart_chunksize: int = 16 * 1024 * 1024,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 30.0,
    ) -> None:
        # here, not at the top: boto3 and botocore's config cost a daemon ~9 MiB of resident memory, and
        # only a daemon with an S3 disk makes a client
        import boto3
        import botocore.config
        from boto3.s3.transfer import TransferConfig
        from botocore.exceptions import BotoCoreError, ClientError

        self._boto_error: type[Exception] = BotoCoreError
        self._client_error: type[Exception] = ClientError
        self._errors = (BotoCoreError, ClientError)

        self.endpoint = endpoint
        self.bucket = endpoint.bucket
        config = botocore.config.Config(
            retries={"max_attempts": max_attempts, "mode": "standard"},
            s3={"addressing_style": "path"},
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            max_pool_connections=16,
        )
        self._s3: Any = boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint.url,
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
            region_name=region,
            config=config,
        )
        self._transfer = TransferConfig(
            multipart_threshold=max(multipart_threshold, MIN_PART_SIZE),
            multipart_chunksize=max(multipart_chunksize, MIN_PART_SIZE),
            max_concurrency=4,
            use_threads=True,
        )
        #: counters for /status and tests
        self.bytes_uploaded = 0
        self.bytes_downloaded = 0

    # ------------------------------------------------------------------------------------ blocking calls

    def put_file_sync(self, key: str, path: str | os.PathLike[str]) -> int:
        size = os.path.getsize(path)
        try:
            self._s3.upload_file(os.fspath(path), self.bucket, key, Config=self._transfer)
        except self._errors as e:
            raise _translate(e, f"upload of {key}") from e
        except Exception as e:  # s3transfer wraps failures in its own exception types
            raise S3Error(f"upload of {key}: {e}") from e
        self.bytes_uploaded += size
        return size

    def put_bytes_sync(self, key: str, data: bytes) -> None:
        try:
            self._s3.put_object(Bucket=self.bucket, Key=key, Body=data)
        except self._errors as e:
            raise _translate(e, f"put of {key}") from e
        self.bytes_uploaded += len(data)

    def get_bytes_sync(self, key: str) -> bytes:
        try:
            body = self._s3.get_object(Bucket=self.bucket, Key=key)["Body"]
            data: bytes = body.read()
        except self._errors as e:
            raise _translate(e, f"get of {key}") from e
        self.bytes_downloaded += len(data)
        return data

    def download_into_sync(self, key: str, f: Any) -> int:
        """Append the object's bytes to the open binary file ``f``; returns the byte count."""
        try:
            body = self._s3.get_object(Bucket=self.bucket, Key=key)["Body"]
            n = 0
            while chunk := body.read(_READ_CHUNK):
                f.write(chunk)
                n += len(chunk)
        except self._errors as e:
            raise _translate(e, f"get of {key}") from e
        self.bytes_downloaded += n
        return n

    def head_sync(self, key: str) -> int | None:
        """The object's size, None if there is none."""
        try:
            answer = self._s3.head_object(Bucket=self.bucket, Key=key)
        except self._client_error as e:
            err = _translate(e, f"head of {key}")
            if isinstance(err, NoSuchKeyError):
                return None
            raise err from e
        except self._boto_error as e:
            raise _translate(e, f"head of {key}") from e
        return int(answer["ContentLength"])

    def list_sync(self, prefix: str) -> list[ObjectInfo]:
        return self.list_with_clock_sync(prefix)[0]

    def list_with_clock_sync(self, prefix: str) -> Listing:
        """The objects under ``prefix``, and the S3 server's own time when the listing began (its first
        answer's ``Date`` header, 1 s resolution; None when absent): object ages are judged on the clock that
        stamped ``LastModified``, never on this machine's, which may be off."""
        out: list[ObjectInfo] = []
        server_now: float | None = None
        try:
            pages = self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
            for page in pages:
                if server_now is None:
                    server_now = _server_time(page)
                out += [ObjectInfo(o["Key"], int(o["Size"]), o["LastModified"].timestamp())
                        for o in page.get("Contents", ())]
        except self._errors as e:
            raise _translate(e, f"list of {prefix!r}") from e
        return out, server_now

    def delete_sync(self, keys: Iterable[str]) -> int:
        """Delete objects in batches of at most 1000; a missing key is not an error.  Returns the count."""
        todo = sorted(set(keys))
        for i in range(0, len(todo), DELETE_BATCH):
            batch = todo[i:i + DELETE_BATCH]
            try:
                answer = self._s3.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
                )
            except self._errors as e:
                raise _translate(e, "delete") from e
            errors = answer.get("Errors") or []
            if errors:
                raise S3Error(f"delete: {len(errors)} keys failed, first {errors[0]}")
        return len(todo)

    def create_bucket_sync(self) -> None:
        try:
            self._s3.create_bucket(Bucket=self.bucket)
        except self._client_error as e:
            code = str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))
            if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise _translate(e, f"create bucket {self.bucket}") from e

    # ------------------------------------------------------------------------------------ async wrappers

    async def put_file(self, key: str, path: str | os.PathLike[str]) -> int:
        return await asyncio.to_thread(self.put_file_sync, key, path)

    async def get_bytes(self, key: str) -> bytes:
        return await asyncio.to_thread(self.get_bytes_sync, key)

    async def head(self, key: str) -> int | None:
        return await asyncio.to_thread(self.head_sync, key)

    async def list(self, prefix: str) -> list[ObjectInfo]:
        return await asyncio.to_thread(self.list_sync, prefix)

    async def list_with_clock(self, prefix: str) -> Listing:
        return await asyncio.to_thread(self.list_with_clock_sync, prefix)

    async def delete(self, keys: Iterable[str]) -> int:
        return await asyncio.to_thread(self.delete_sync, list(keys))


def _server_time(answer: Any) -> float | None:
    """The ``Date`` header of a boto3 answer as seconds since the epoch, None when missing or malformed."""
    try:
        date = answer["ResponseMetadata"]["HTTPHeaders"]["date"]
        return float(email.utils.parsedate_to_datetime(str(date)).timestamp())
    except (KeyError, TypeError, ValueError, IndexError):
        return None
