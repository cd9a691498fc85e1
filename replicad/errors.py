"""One root error type.  ``code`` is ClickHouse's error code (sent as X-ClickHouse-Exception-Code)."""

from __future__ import annotations


class ReplicadError(Exception):
    code: int = 1000
    http_status: int = 500
    retriable: bool = False

    def __init__(self, message: str, *, code: int | None = None, retriable: bool | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        if retriable is not None:
            self.retriable = retriable


class BadInputError(ReplicadError):
    """Malformed rows, wrong types, out-of-range values.  The message names the column and row."""

    code = 27  # CANNOT_PARSE_INPUT_ASSERTION_FAILED
    http_status = 400


class SyntaxError_(ReplicadError):
    code = 62  # SYNTAX_ERROR
    http_status = 400


class UnknownTableError(ReplicadError):
    code = 60  # UNKNOWN_TABLE
    http_status = 404


class UnknownSettingError(ReplicadError):
    code = 115  # UNKNOWN_SETTING
    http_status = 400


class BodyTooLargeError(ReplicadError):
    code = 307  # TOO_MANY_BYTES
    http_status = 413


class TooManyPartsError(ReplicadError):
    code = 252  # TOO_MANY_PARTS
    http_status = 429
    retriable = True


class NotEnoughSpaceError(ReplicadError):
    """The disk is full, or would be (a fetch that does not fit): retry when there is room."""

    code = 243  # NOT_ENOUGH_SPACE
    http_status = 507

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=True)


class TooManyRowsOrBytesError(ReplicadError):
    """A query would hold more rows or bytes than its limits allow (max_rows_to_sort / max_bytes_to_sort)."""

    code = 396  # TOO_MANY_ROWS_OR_BYTES
    http_status = 400


class ReadOnlyError(ReplicadError):
    code = 242  # TABLE_IS_READ_ONLY
    http_status = 503
    retriable = True


class CorruptedDataError(ReplicadError):
    """Checksum mismatch, truncated file, bad compressed block."""

    code = 40  # CHECKSUM_DOESNT_MATCH


class BadPartNameError(ReplicadError):
    code = 233  # BAD_DATA_PART_NAME
    http_status = 400


class InsecurePathError(ReplicadError):
    code = 572  # INSECURE_PATH
    http_status = 400


class MetadataMismatchError(ReplicadError):
    code = 342  # METADATA_MISMATCH


class KeeperError(ReplicadError):
    """A ZooKeeper operation failed; ``retriable`` for connection loss / session expiry."""

    code = 999  # KEEPER_EXCEPTION


class UnknownInsertStatusError(ReplicadError):
    """The commit's ZooKeeper answer was lost: the insert may or may not have happened."""

    code = 319  # UNKNOWN_STATUS_OF_INSERT
    retriable = True


class QuorumError(ReplicadError):
    code = 286  # UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE / TOO_FEW_LIVE_REPLICAS family
    http_status = 503  # the replica set cannot satisfy the quorum now: retry later (not a server fault)
    retriable = True


# --- ZooKeeper errors (translated from the client library in replicad/keeper/client.py) ---------------
# ``zk_code`` is ZooKeeper's own error code (KeeperException.Code); ``code`` stays ClickHouse's.


class KeeperNoNodeError(KeeperError):
    zk_code = -101  # ZNONODE


class KeeperNodeExistsError(KeeperError):
    zk_code = -110  # ZNODEEXISTS


class KeeperBadVersionError(KeeperError):
    zk_code = -103  # ZBADVERSION


class KeeperNotEmptyError(KeeperError):
    zk_code = -111  # ZNOTEMPTY


class KeeperConnectionLossError(KeeperError):
    """The connection dropped: a write in flight may or may not have been applied."""

    zk_code = -4  # ZCONNECTIONLOSS
    retriable = True


class KeeperSessionExpiredError(KeeperError):
    """The session is gone (expired or the client was closed); ephemeral nodes are lost."""

    zk_code = -112  # ZSESSIONEXPIRED
    retriable = True


class KeeperOperationTimeoutError(KeeperError):
    """No answer in time: a write may or may not have been applied."""

    zk_code = -7  # ZOPERATIONTIMEOUT
    retriable = True


class KeeperMultiError(KeeperError):
    """One operation of a multi failed and the whole transaction was rolled back.

    ``index`` is the position of the failing op, ``cause`` the translated error of that op
    (e.g. a KeeperNodeExistsError), ``zk_code`` its ZooKeeper code.
    """

    def __init__(self, message: str, *, index: int, cause: KeeperError) -> None:
        super().__init__(message, retriable=cause.retriable)
        self.index = index
        self.cause = cause
        self.zk_code: int = getattr(cause, "zk_code", 0)


class ZnodeFormatError(ReplicadError):
    """A ZooKeeper node's text (log entry, mutation, quorum, host …) cannot be parsed or written."""

    code = 6  # CANNOT_PARSE_TEXT


class UnsupportedPartFormatError(CorruptedDataError):
    """A part layout or codec replicad does not read (a codec such as FPC or GCD, Sparse Nullable ...)."""

    code = 48  # NOT_IMPLEMENTED


class NoReplicaHasPartError(ReplicadError):
    code = 234  # NO_REPLICA_HAS_PART
    retriable = True


class FetchError(ReplicadError):
    """A part's source answered with an error status (429 too busy, 401, 500 …) or the connection failed."""

    code = 1000
    retriable = True
