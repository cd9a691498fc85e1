"""Config sections that stand on their own: clusters and distributed DDL (``ON CLUSTER``), and the storage
configuration (S3 disks and policies, shaped like ClickHouse's ``storage_configuration``); and the base of
every section (frozen, unknown keys refused)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClusterShard(_Section):
    """One shard of a cluster, as ClickHouse's ``remote_servers``: its replicas as ``host:port`` (the port
    ClickHouse servers list there, their native ``tcp_port``)."""

    replicas: list[str] = Field(min_length=1)
    internal_replication: bool = True

    @field_validator("replicas")
    @classmethod
    def _check_replicas(cls, v: list[str]) -> list[str]:
        for r in v:
            host, sep, port = r.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"replica {r!r} must be host:port")
        return v


class DistributedDDLConfig(_Section):
    """ClickHouse's ``<distributed_ddl>``, and who this daemon is in the clusters: ``port`` as they list it,
    ``host`` one spelling of it (other spellings resolving to this machine match too, as in 18.16)."""

    host: str = Field(min_length=1)
    port: int = Field(gt=0, lt=65536)
    path: str = "/clickhouse/task_queue/ddl"
    task_max_lifetime: int = Field(default=604800, gt=0)
    cleanup_delay_period: int = Field(default=60, ge=0)
    max_tasks_in_queue: int = Field(default=1000, ge=1)
    #: how long ON CLUSTER waits for the hosts (``distributed_ddl_task_timeout``, also a URL setting)
    task_timeout: int = 180


class DiskConfig(_Section):
    """One disk of ``storage.disks`` (ClickHouse's storage_configuration); only ``type: s3`` for now."""

    type: Literal["s3"]
    endpoint: str
    access_key_id: str = Field(min_length=1)
    secret_access_key: str = Field(min_length=1)
    region: str = "us-east-1"
    max_attempts: int = Field(default=5, ge=1, le=100)  # retries of each S3 request (botocore standard mode)
    multipart_threshold: int = Field(default=32 * 1024 * 1024, ge=5 * 1024 * 1024)
    multipart_chunksize: int = Field(default=16 * 1024 * 1024, ge=5 * 1024 * 1024)

    @field_validator("endpoint")
    @classmethod
    def _check_endpoint(cls, v: str) -> str:
        from replicad.s3.endpoint import S3Endpoint  # the endpoint grammar, without importing boto3

        S3Endpoint.parse(v)
        return v


class VolumeConfig(_Section):
    disk: str = Field(min_length=1)


class PolicyConfig(_Section):
    volumes: dict[str, VolumeConfig]

    @field_validator("volumes")
    @classmethod
    def _one_volume(cls, v: dict[str, VolumeConfig]) -> dict[str, VolumeConfig]:
        if len(v) != 1:
            raise ValueError("exactly one volume per policy is supported (moves between volumes are not)")
        return v

    @property
    def disk(self) -> str:
        return next(iter(self.volumes.values())).disk


class StorageConfig(_Section):
    disks: dict[str, DiskConfig] = Field(default_factory=dict)
    policies: dict[str, PolicyConfig] = Field(default_factory=dict)

    @field_validator("policies")
    @classmethod
    def _no_default(cls, v: dict[str, PolicyConfig]) -> dict[str, PolicyConfig]:
        if "default" in v:
            raise ValueError("policy 'default' is the local data_path and cannot be redefined")
        return v

    def problems(self) -> list[str]:
        """Cross-references: every policy's disk is defined."""
        out: list[str] = []
        for name, policy in sorted(self.policies.items()):
            for vol, volume in sorted(policy.volumes.items()):
                if volume.disk not in self.disks:
                    out.append(f"storage.policies.{name}.volumes.{vol}.disk: no disk {volume.disk!r} in "
                               "storage.disks")
        return out

    def policy_disks(self) -> dict[str, str]:
        """policy name -> disk name."""
        return {name: p.disk for name, p in self.policies.items()}
