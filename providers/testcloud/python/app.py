"""vmop provider plugin for the testcloud, in Python (componentize-py, world `plugin-http`):
the same contract as the Rust `testcloud` provider, on the helper package `vmop_provider`.

Settings: `endpoint` (required, in `allowedHosts`), `listPageSize` (machines per `list` page,
1..=1000, default 1000). Secret: optional `token`, sent as a bearer token. Machines carry the
VM's uid in tag `vmop.dev/uid` and are found by it, and the call's cluster in
`vmop.dev/cluster`, which `list` pages through (`GET /v1/machines?cluster=&limit=&after=`).
"""

import json
from urllib.parse import quote

from wit_world import exports

from vmop_provider import WIT_VERSION, Config, Phase, PluginInfo, error_for_status, request
from vmop_provider import listed, page, permanent, tags, transient, vm_status
from vmop_provider.bounds import MAX_PAGE_MACHINES

PHASES = {"running": Phase.RUNNING, "stopped": Phase.STOPPED}


def call(config, method, path, body=None, missing_ok=False):
    """The decoded JSON answer; `None` for a 404 when `missing_ok`; errors by status."""
    config = Config(config)
    headers = [("accept", "application/json")]
    if config.secret("token"):
        headers.append(("authorization", f"Bearer {config.secret('token')}"))
    if body is not None:
        headers.append(("content-type", "application/json"))
        body = json.dumps(body).encode()
    response = request(method, config.require("endpoint").rstrip("/") + path, headers, body or b"")
    if response.status == 404 and missing_ok:
        return None
    error = error_for_status(response.status, response.header("retry-after"),
                             f"{method} {path}: HTTP {response.status}: {response.text()[:512]}")
    if error is not None:
        raise error
    try:
        return json.loads(response.body) if response.body else {}
    except ValueError:
        raise transient(f"{method} {path}: the answer is not JSON")


def status(machine):
    return vm_status(machine["id"], PHASES.get(machine.get("state"), Phase.UNKNOWN),
                     machine.get("addresses", []), owner=machine.get("tags", {}).get(tags.TAG_UID))


def machine(id):
    return f"/v1/machines/{quote(id, safe='')}"


class Provider(exports.Provider):
    def info(self):
        # The testcloud answers a machine by id as soon as it is created: consistent-get.
        capabilities = ["user-data", "power", "consistent-get", "list"]
        return PluginInfo("testcloud-py", "0.1.0", WIT_VERSION, capabilities, [])

    def location(self, config):
        return f"testcloud:{Config(config).require('endpoint').rstrip('/')}"

    def find(self, config, uid):
        found = call(config, "GET", f"/v1/machines?uid={quote(uid, safe='')}")["machines"]
        return status(min(found, key=lambda m: m["created"])) if found else None

    def create(self, config, spec):
        existing = self.find(config, spec.uid)
        if existing is not None:
            return existing
        marks = dict(tags.with_labels(spec, Config(config).cluster))
        body = {"uid": spec.uid, "image": spec.image, "cpu": spec.cpu, "memoryMib": spec.memory_mib,
                "userData": spec.user_data, "tags": marks}
        return status(call(config, "POST", "/v1/machines", body))

    def get(self, config, id):
        found = call(config, "GET", machine(id), missing_ok=True)
        return None if found is None else status(found)

    def delete(self, config, id):
        call(config, "DELETE", machine(id), missing_ok=True)

    def start(self, config, id):
        call(config, "POST", machine(id) + "/start")

    def stop(self, config, id):
        call(config, "POST", machine(id) + "/stop")

    def list(self, config, cursor):
        """The machines tagged with the call's cluster, in the cloud's id order."""
        settings = Config(config)
        cluster = quote(settings.require_cluster(), safe="")
        limit = settings.page_size("listPageSize", 1, MAX_PAGE_MACHINES)
        path = f"/v1/machines?cluster={cluster}&limit={limit}"
        if cursor is not None:
            path += f"&after={quote(cursor, safe='')}"
        answer = call(config, "GET", path)
        found = [listed(lambda: status(m), m.get("tags", {}).get(tags.TAG_CLUSTER), m.get("createdAtMs"))
                 for m in answer["machines"]]
        return page(found, answer.get("next"))

    def update(self, config, id, spec):
        raise permanent("update is not supported by this provider")
