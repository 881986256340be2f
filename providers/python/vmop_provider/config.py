"""Lookup in a ProviderConfig's settings (`spec.config`) and secrets (the credentials Secret).

A missing required key is a `permanent` error naming the key, never a value: the host
surfaces it in the ProviderConfig's conditions, and nothing changes until the config does.
`repr` of a `Config` shows the secrets' keys only.
"""

from .errors import permanent


class Config:
    """The `provider-config` of one call. An empty value counts as absent. `cluster` is this
    cluster's identity (`provider-config.cluster`), empty when the host sends none."""

    def __init__(self, config, parameters=()):
        self.settings = {k: v for k, v in config.settings if v != ""}
        self.secrets = {k: v for k, v in config.secrets if v != ""}
        self.cluster = config.cluster
        # `spec.parameters` override the setting of the same name (an empty value unsets it).
        for key, value in parameters:
            if value == "":
                self.settings.pop(key, None)
            else:
                self.settings[key] = value

    def setting(self, key, default=None):
        return self.settings.get(key, default)

    def require(self, key):
        if key not in self.settings:
            raise permanent(f"the ProviderConfig's spec.config has no `{key}`")
        return self.settings[key]

    def require_cluster(self):
        """The cluster, or a `permanent` error when the call names none: `list` answers one
        cluster's machines, never every cluster's."""
        if not self.cluster:
            raise permanent("the call names no cluster (provider-config.cluster is empty), so "
                            "there is no cluster whose machines to list")
        return self.cluster

    def page_size(self, key, low, high):
        """Setting `key` as a page size in `low..=high`, default `high`; anything else is a
        `permanent` error naming the setting."""
        value = self.settings.get(key)
        if value is None:
            return high
        try:
            size = int(value.strip())
        except ValueError:
            size = None
        if size is None or not low <= size <= high:
            raise permanent(f"setting `{key}` is `{value}`, not a page size of {low}..={high}")
        return size

    def secret(self, key, default=None):
        return self.secrets.get(key, default)

    def require_secret(self, key):
        if key not in self.secrets:
            raise permanent(f"the credentials Secret has no key `{key}`")
        return self.secrets[key]

    def __repr__(self):
        return (f"Config(settings={self.settings!r}, secrets={sorted(self.secrets)!r}, "
                f"cluster={self.cluster!r})")
