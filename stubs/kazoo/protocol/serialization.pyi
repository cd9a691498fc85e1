# Minimal stubs: only what replicad uses.
import struct
from typing import Any, NamedTuple

int_struct: struct.Struct

class Transaction(NamedTuple):
    operations: Any
    def serialize(self) -> bytes: ...
