"""Answers within the contract's bounds (wit/provider.wit, "Bounds"), so a provider cannot
fail a call as a contract violation by passing on what its cloud said.

`vm_status` keeps at most `MAX_ADDRESSES` addresses of at most `MAX_ADDRESS` bytes (dropping
longer ones: a cut address would be wrong) and cuts the message to `MAX_MESSAGE` bytes; an id
outside 1..=`MAX_ID` bytes is a `permanent` error, as in the Rust SDK, because no cut id names
the machine (and so is an owner over `MAX_OWNER` bytes: a cut uid would let another VM take
the machine). The numbers are in `bounds`.
"""

from wit_world.imports.vmop_provider_types import Phase, VmStatus

from .bounds import MAX_ADDRESS, MAX_ADDRESSES, MAX_ID, MAX_OWNER
from .errors import bounded, permanent


def vm_status(id, phase: Phase, addresses=(), message=None, owner=None) -> VmStatus:
    """`owner` is the uid of the VM whose ownership mark the machine carries (the
    `vmop.dev/uid` tag); an empty one names no VM and becomes `None`."""
    size = len(id.encode("utf-8"))
    if not 1 <= size <= MAX_ID:
        raise permanent(f"the cloud answered a machine id of {size} bytes (the contract allows 1..={MAX_ID})")
    owner = owner or None
    if owner is not None and len(owner.encode("utf-8")) > MAX_OWNER:
        raise permanent(f"the cloud answered an owner of {len(owner.encode('utf-8'))} bytes (the contract allows 1..={MAX_OWNER})")
    kept = [a for a in addresses if a and len(a.encode("utf-8")) <= MAX_ADDRESS][:MAX_ADDRESSES]
    return VmStatus(id, phase, kept, None if message is None else bounded(message), owner)
