"""C extensions.  ``_cityhash102``: CityHash v1.0.2 128-bit hashes and ClickHouse's chained file hash.
``_strings``: String column streams (VarUInt length + bytes) to and from Arrow binary buffers (also straight
from the rows of a permutation, for the part writer).
``_kmerge``: the k-way merge of a merge round's sorted runs, and gathering their rows in merged order.
``_wholepart``: the column streams of a part held whole in memory (an insert block's) serialized, cut
into blocks, compressed, hashed and marked in one call; ``_checksums``: checksums.txt's v3 body;
``_files``: a part's files made in one call.
``_bitcodecs``, ``_siphash``: DoubleDelta/Gorilla decoding, SipHash.  Text inserts: ``_tsvsplit`` (TSV blocks
into binary columns), ``_jsonsplit`` (JSONEachRow blocks into binary columns of value texts), ``_arraytext``
(one-level array literals into element texts), ``_textints`` (plain decimal integer texts, and
YYYY-MM-DD[ hh:mm:ss] dates)."""
