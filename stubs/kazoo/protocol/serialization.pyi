# Minimal stubs: only what replicad uses.
import struct

int_struct: struct.Struct
