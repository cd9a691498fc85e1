from collections.abc import Mapping
from typing import Any

def v3_body(files: Mapping[str, Any], /) -> bytes: ...
