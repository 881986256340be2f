"""vmop's marks on a machine, as tags or labels (the Rust SDK's `tags`): the VM's namespace,
name and uid (`find` searches by the uid), and the cluster that made it (`list` searches by
it). The names are the same in every provider and every language.

Only the standard library: `python3 -m unittest discover -s providers/python/tests` tests it.
"""

#: The VM's `metadata.uid`: what `find` searches by, and the machine's `owner`.
TAG_UID = "vmop.dev/uid"
#: The VM's namespace.
TAG_NAMESPACE = "vmop.dev/namespace"
#: The VM's name.
TAG_NAME = "vmop.dev/name"
#: The cluster that made the machine (`provider-config.cluster`): what `list` searches by.
TAG_CLUSTER = "vmop.dev/cluster"

_OWN = (TAG_UID, TAG_NAMESPACE, TAG_NAME, TAG_CLUSTER)


def own(spec, cluster):
    """vmop's tags for `spec` made by `cluster`: namespace, name, uid, and the cluster unless it
    is empty (a call that names no cluster marks none)."""
    tags = [(TAG_NAMESPACE, spec.namespace), (TAG_NAME, spec.name), (TAG_UID, spec.uid)]
    if cluster:
        tags.append((TAG_CLUSTER, cluster))
    return tags


def is_own(key):
    """Whether `key` is one of vmop's tags, which no label or setting may set."""
    return key in _OWN


def with_labels(spec, cluster, reserved=()):
    """`own(spec, cluster)`, then the VM's labels whose keys are neither vmop's, nor in
    `reserved` (e.g. ec2's `Name`), nor already used."""
    tags = own(spec, cluster)
    used = {key for key, _ in tags} | set(reserved)
    for key, value in spec.labels:
        if key not in used and not is_own(key):
            tags.append((key, value))
            used.add(key)
    return tags
