"""The contract's output bounds (wit/provider.wit, "# Bounds"), in bytes of UTF-8 unless they
count entries: the numbers of the host's table (`vmop-contract`, contract/src/bounds.rs).
`contract/tests/wit_bounds.rs` fails when one differs, so change them there and here together.
"""

#: `vm-status.id`: 1..=MAX_ID.
MAX_ID = 256
#: `vm-status.owner`: 1..=MAX_OWNER when present.
MAX_OWNER = 256
#: Entries of `vm-status.addresses`.
MAX_ADDRESSES = 16
#: One address.
MAX_ADDRESS = 256
#: `vm-status.message`, every error message and each parameter's description.
MAX_MESSAGE = 1024
#: `rate-limit.retry-after-ms`: one hour.
MAX_RETRY_AFTER_MS = 3_600_000
#: `location(..)`: 1..=MAX_LOCATION.
MAX_LOCATION = 512
#: `plugin-info` name, version and wit-version, each capability and each parameter's name; the
#: two names are never empty.
MAX_INFO_FIELD = 64
#: Entries of `plugin-info.capabilities`.
MAX_CAPABILITIES = 32
#: Entries of `plugin-info.parameters`.
MAX_PARAMETERS = 64
#: Entries of one `list` page.
MAX_PAGE_MACHINES = 1000
#: `page.next`: 1..=MAX_CURSOR when present.
MAX_CURSOR = 4096
#: `listed-machine.cluster`: 1..=MAX_CLUSTER when present.
MAX_CLUSTER = 256
