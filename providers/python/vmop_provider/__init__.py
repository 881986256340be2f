"""What a vmop provider written in Python needs besides its cloud's API calls.

- `http.request`: blocking HTTP over wasi:http (world `plugin-http`, wit/http-guest/);
- `Config`: settings and secrets lookup, a missing key a `permanent` error naming it;
- `errors`: the contract's error classes to `raise`, and `error_for_status`;
- `vm_status`: a `vm-status` within the contract's bounds (`bounds`: the host's numbers);
- `listed`, `page`: a `list` answer within the same bounds (`listing`);
- `tags`: vmop's marks on a machine (`own`, `with_labels`, `TAG_UID`, `TAG_CLUSTER`, ...);
- `rfc3339_ms`: a cloud's timestamp as `created-at-ms`;
- `sigv4`: AWS Signature Version 4, for `credentials: passthrough` only (the host signs by
  default; `sigv4.hints` names the scope for it);
- `log`: lines in the operator's log.

Build a provider with world `plugin-http`:

    componentize-py -d wit/http-guest -w plugin-http componentize app \\
        -p providers/python -p <your provider's dir> -o provider.wasm
"""

from wit_world.imports.vmop_provider_types import Phase, PluginInfo

from . import log, tags
from .config import Config
from .errors import (
    error_for_status,
    invalid_spec,
    permanent,
    rate_limited,
    transient,
    unauthorized,
)
from .http import Response, request
from .listing import listed, page
from .status import vm_status
from .timestamps import rfc3339_ms

#: The contract this helper speaks (`info().wit-version`).
WIT_VERSION = "0.3.0"

__all__ = [
    "Config",
    "Phase",
    "PluginInfo",
    "Response",
    "WIT_VERSION",
    "error_for_status",
    "invalid_spec",
    "listed",
    "log",
    "page",
    "permanent",
    "rate_limited",
    "request",
    "rfc3339_ms",
    "tags",
    "transient",
    "unauthorized",
    "vm_status",
]
