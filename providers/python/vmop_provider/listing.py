"""`list` answers within the contract's bounds (wit/provider.wit, "Bounds"), as the Rust SDK's
`bounds::page` keeps them:

- more than `MAX_PAGE_MACHINES` machines is a `permanent` error (ask the cloud for fewer: a cut
  page would skip the machines between its end and the cursor for good);
- a cursor over `MAX_CURSOR` bytes is a `permanent` error (a cut cursor is another one); an
  empty one is the end of the listing;
- a machine the contract cannot carry (an id or owner `vm_status` refuses, a cluster over
  `MAX_CLUSTER` bytes) is left out of the page with a warning in the log: no call could name
  it, and the host reads a machine missing from a listing as "ask `get`", never as gone.
"""

from componentize_py_types import Err
from wit_world.imports.vmop_provider_types import ListedMachine, Page

from . import log
from .bounds import MAX_CLUSTER, MAX_CURSOR, MAX_PAGE_MACHINES
from .errors import permanent


def listed(status, cluster=None, created_at_ms=None):
    """A machine of a page: `status()` builds its `vm-status` as `get` answers it (with
    `vm_status`), `cluster` is its cluster mark, `created_at_ms` when the cloud made it. `None`
    (logged) when the contract cannot carry it; `page` skips those."""
    try:
        built = status()
    except Err as e:
        log.warn(f"left out of the listing: {e.value.value}")
        return None
    cluster = cluster or None
    if cluster is not None and len(cluster.encode("utf-8")) > MAX_CLUSTER:
        log.warn(f"left out of the listing: machine {built.id} carries a cluster mark of "
                 f"{len(cluster.encode('utf-8'))} bytes (the contract allows 1..={MAX_CLUSTER})")
        return None
    return ListedMachine(built, cluster, created_at_ms)


def page(machines, next=None):
    """A `page` of `machines` (results of `listed`, `None`s skipped) and the cursor `next`."""
    machines = list(machines)
    if len(machines) > MAX_PAGE_MACHINES:
        raise permanent(f"provider bug: a page of {len(machines)} machines (the contract allows "
                        f"{MAX_PAGE_MACHINES})")
    next = next or None
    if next is not None and len(next.encode("utf-8")) > MAX_CURSOR:
        raise permanent(f"provider bug: a page cursor of {len(next.encode('utf-8'))} bytes (the "
                        f"contract allows 1..={MAX_CURSOR})")
    return Page([m for m in machines if m is not None], next)
