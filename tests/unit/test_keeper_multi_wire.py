"""replicad.keeper.multi_wire packs a multi byte for byte as kazoo's TransactionRequest does."""

from __future__ import annotations

import struct

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.paths import _prefix_root
from kazoo.protocol.serialization import Create as KCreate
from kazoo.protocol.serialization import Transaction
from kazoo.security import OPEN_ACL_UNSAFE

from replicad.keeper.multi_wire import PackedTransaction, chroot_prefix, pack_multi
from replicad.keeper.ops import Check, Create, Delete, Op, Set

OPS: list[Op] = [
    Create("/clickhouse/tables/01/t/blocks/202401_123_456", b"202401_5_5_0"),
    Create("/clickhouse/tables/01/t/replicas/a/parts/202401_5_5_0", b""),
    Create("/clickhouse/tables/01/t/log/log-", b"format version: 4\n\xc3\xa9" * 40, sequence=True),
    Create("/clickhouse/tables/01/t/block_numbers/202401/block-", b"", ephemeral=True, sequence=True),
    Create("/clickhouse/tables/01/t/temp/x", b"e", ephemeral=True),
    Set("/clickhouse/tables/01/t/replicas/a/log_pointer", b"17", 3),
    Set("/clickhouse/tables/01/t/columns", b"", -1),
    Delete("/clickhouse/tables/01/t/block_numbers/202401/block-0000000005"),
    Delete("/clickhouse/tables/01/t/quorum/status", 7),
    Check("/clickhouse/tables/01/t/columns", 2),
    Create("/odd//double/slash", b"x"),
    Create("/a/.hidden", b"x"),
    Create("/ünïcode/päth", b"x"),
    Create("/", b"x"),
]


def kazoo_bytes(chroot: str | None, ops: list[Op]) -> bytes:
    zk = KazooClient(hosts="127.0.0.1:1" + (chroot or ""))  # never started
    tx = zk.transaction()
    for op in ops:
        if isinstance(op, Create):
            if op.sequence and op.path.endswith("/"):  # kazoo drops the '/': the request as ZooKeeper gets it
                path = _prefix_root(zk.chroot, op.path, trailing=True)
                tx._add(KCreate(path, op.data, OPEN_ACL_UNSAFE, (1 if op.ephemeral else 0) | 2), None)
            else:
                tx.create(op.path, op.data, ephemeral=op.ephemeral, sequence=op.sequence)
        elif isinstance(op, Set):
            tx.set_data(op.path, op.data, op.version)
        elif isinstance(op, Delete):
            tx.delete(op.path, op.version)
        else:
            assert isinstance(op, Check)
            tx.check(op.path, op.version)
    return bytes(Transaction(tx.operations).serialize())


@pytest.mark.parametrize("chroot", [None, "/replicad", "/a/b", "/replicad/"])
def test_packed_multi_is_kazoos_bytes(chroot: str | None) -> None:
    zk = KazooClient(hosts="127.0.0.1:1" + (chroot or ""))
    prefix = chroot_prefix(zk.chroot)
    for op in OPS:
        assert pack_multi([op], prefix) == kazoo_bytes(chroot, [op]), op
    assert pack_multi(OPS, prefix) == kazoo_bytes(chroot, OPS)


def test_sequential_child_of_a_directory_keeps_its_slash() -> None:
    op = Create("/t/mutations/", b"m", sequence=True)
    packed = pack_multi([op], chroot_prefix("/r"))
    assert struct.pack("!i", 15) + b"/r/t/mutations/" + struct.pack("!i", 1) + b"m" in packed
    assert packed == kazoo_bytes("/r", [op])


def test_packed_transaction_is_a_kazoo_multi() -> None:
    req = PackedTransaction(pack_multi(OPS[:2], ""))
    assert req.type == Transaction.type == 14
    assert req.serialize() == pack_multi(OPS[:2], "")
