"""C extensions.  ``_cityhash102``: CityHash v1.0.2 128-bit hashes and ClickHouse's chained file hash.
``_strings``: String column streams (VarUInt length + bytes) to and from Arrow binary buffers."""
