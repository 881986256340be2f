"""vmop provider plugin for AWS EC2, in Python (componentize-py, world `plugin-http`).

The same contract as the Rust `ec2` provider, with less: no `update`, `start`, `stop` or
parameters. Settings: `region` (required), `endpoint` (default
`https://ec2.<region>.amazonaws.com`), `stsEndpoint` (for `location`; default `endpoint`,
else `https://sts.<region>.amazonaws.com`), `instanceType` (default: the smallest type of
the table below with enough vCPUs and memory), `listPageSize` (instances per `list` page,
5..=1000, default 1000). Secret: see `aws.py`. `spec.image` is an AMI id.

Idempotency: instances carry the VM's uid in tag `vmop.dev/uid`; `create` returns a live
instance with that tag if there is one (moto ignores `ClientToken`), and sends the uid as
`ClientToken` for real EC2. They also carry the call's cluster in `vmop.dev/cluster`, which
`list` filters `DescribeInstances` by (EC2's `NextToken` is the cursor).
"""

import base64

from wit_world import exports

import aws
from vmop_provider import (
    WIT_VERSION, Config, Phase, PluginInfo, invalid_spec, listed, log, page, permanent, rfc3339_ms,
    tags, transient, vm_status,
)
from vmop_provider.bounds import MAX_PAGE_MACHINES

TAG_UID = tags.TAG_UID
LIVE_STATES = ("pending", "running", "stopping", "stopped")
PHASES = {"pending": Phase.PROVISIONING, "running": Phase.RUNNING, "stopping": Phase.STOPPED,
          "stopped": Phase.STOPPED}
#: (type, vCPUs, MiB), smallest first: the Rust provider's general-purpose table, shortened.
INSTANCE_TYPES = [("t3.nano", 2, 512), ("t3.micro", 2, 1024), ("t3.small", 2, 2048),
                  ("t3.medium", 2, 4096), ("t3.large", 2, 8192), ("t3.xlarge", 4, 16384),
                  ("t3.2xlarge", 8, 32768), ("m5.4xlarge", 16, 65536), ("m5.8xlarge", 32, 131072)]


def ec2(config):
    region = config.require("region")
    return aws.Api(config, "ec2", config.setting("endpoint", f"https://ec2.{region}.amazonaws.com"))


def instances(root):
    """`(id, state, element)` of each `instancesSet/item` of a Describe/RunInstances answer."""
    for element in root.iter():
        if aws.local(element) == "instancesSet":
            for item in element:
                state = next((aws.child_text(s, "name") for s in item if aws.local(s) == "instanceState"), "")
                yield aws.child_text(item, "instanceId") or "", state, item


def tag(item, key):
    """The value of tag `key` of an instance item, if it has one."""
    for tag_set in (e for e in item if aws.local(e) == "tagSet"):
        for entry in tag_set:
            if aws.child_text(entry, "key") == key:
                return aws.child_text(entry, "value")
    return None


def status(instance_id, state, item):
    """The instance as `get` answers it; `owner` is its `vmop.dev/uid` tag."""
    addresses = [aws.child_text(item, n) for n in ("ipAddress", "privateIpAddress", "dnsName", "privateDnsName")]
    return vm_status(instance_id, PHASES.get(state, Phase.UNKNOWN), [a for a in addresses if a],
                     owner=tag(item, TAG_UID))


def live(found):
    """The oldest live instance of `found` (several only after a race), or `None`."""
    alive = sorted((aws.child_text(i, "launchTime") or "", n, s, i) for n, s, i in found if s in LIVE_STATES and n)
    return status(*alive[0][1:]) if alive else None


def missing(error):
    return error.code in ("InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed")


def call(api, action, params=()):
    try:
        return api.call(action, params)
    except aws.CallError as e:
        raise e.error()


def find_by_uid(api, uid):
    params = [("Filter.1.Name", f"tag:{TAG_UID}"), ("Filter.1.Value.1", uid),
              ("Filter.2.Name", "instance-state-name")]
    params += [(f"Filter.2.Value.{i}", s) for i, s in enumerate(LIVE_STATES, 1)]
    return live(instances(call(api, "DescribeInstances", params)))


def instance_type(config, spec):
    explicit = config.setting("instanceType")
    fits = [name for name, cpu, mib in INSTANCE_TYPES if cpu >= spec.cpu and mib >= spec.memory_mib]
    if explicit or fits:
        return explicit or fits[0]
    raise invalid_spec(f"no instance type has {spec.cpu} vCPUs and {spec.memory_mib} MiB; set `instanceType`")


def launch_params(config, spec, token):
    marks = [("Name", spec.name)] + tags.with_labels(spec, config.cluster, reserved=("Name",))
    fixed = 5 if config.cluster else 4
    labels = [(k, v) for k, v in marks[fixed:] if not k.lower().startswith("aws:") and len(k) <= 128]
    marks = (marks[:fixed] + labels)[:50]
    params = [("ImageId", spec.image), ("InstanceType", instance_type(config, spec)), ("MinCount", 1),
              ("MaxCount", 1), ("ClientToken", token), ("TagSpecification.1.ResourceType", "instance")]
    for i, (key, value) in enumerate(marks, 1):
        params += [(f"TagSpecification.1.Tag.{i}.Key", key), (f"TagSpecification.1.Tag.{i}.Value", value)]
    if spec.user_data is not None:
        params.append(("UserData", base64.b64encode(spec.user_data.encode()).decode()))
    return params


def list_params(config, cursor):
    """`DescribeInstances` for one page of the cluster's live instances."""
    params = [("Filter.1.Name", f"tag:{tags.TAG_CLUSTER}"), ("Filter.1.Value.1", config.require_cluster()),
              ("Filter.2.Name", "instance-state-name")]
    params += [(f"Filter.2.Value.{i}", s) for i, s in enumerate(LIVE_STATES, 1)]
    params.append(("MaxResults", config.page_size("listPageSize", 5, MAX_PAGE_MACHINES)))
    if cursor is not None:
        params.append(("NextToken", cursor))
    return params


class Provider(exports.Provider):
    def info(self):
        return PluginInfo("ec2-py", "0.1.0", WIT_VERSION, ["user-data", "list"], [])

    def location(self, config):
        config = Config(config)
        region, api = config.require("region"), ec2(config)
        sts = aws.Api(config, "sts", config.setting("stsEndpoint", config.setting("endpoint", f"https://sts.{region}.amazonaws.com")))
        account = next((e.text for e in call(sts, "GetCallerIdentity").iter() if aws.local(e) == "Account"), None)
        if not account or not account.isdigit():
            raise transient(f"GetCallerIdentity answered account {account!r}")
        return f"aws:{account}:{region}:{api.endpoint}"

    def find(self, config, uid):
        return find_by_uid(ec2(Config(config)), uid)

    def create(self, config, spec):
        config = Config(config, spec.parameters)
        api = ec2(config)
        existing = find_by_uid(api, spec.uid)
        if existing is not None:
            return existing
        if not spec.image.startswith("ami-"):
            raise invalid_spec(f"image `{spec.image}` is not an AMI id")
        images = call(api, "DescribeImages", [("ImageId.1", spec.image)])
        if not any(aws.local(e) == "imageId" and e.text == spec.image for e in images.iter()):
            raise invalid_spec(f"image {spec.image} does not exist or is not visible to this account")
        token = spec.uid
        for _ in range(3):  # EC2 answers a reused token with its (maybe terminated) instance
            found = list(instances(call(api, "RunInstances", launch_params(config, spec, token))))
            if not found:
                raise transient("RunInstances answered without an instance")
            instance_id, state, item = found[0]
            if state in LIVE_STATES:
                log.info(f"launched instance {instance_id} for {spec.namespace}/{spec.name}")
                return status(instance_id, state, item)
            token = f"{spec.uid}/{instance_id}"
        raise transient(f"RunInstances kept answering with terminated instances for uid {spec.uid}")

    def get(self, config, id):
        try:
            root = ec2(Config(config)).call("DescribeInstances", [("InstanceId.1", id)])
        except aws.CallError as e:
            if missing(e):
                return None
            raise e.error()
        return live(i for i in instances(root) if i[0] == id)

    def delete(self, config, id):
        try:
            ec2(Config(config)).call("TerminateInstances", [("InstanceId.1", id)])
        except aws.CallError as e:
            if not missing(e):
                raise e.error()

    def list(self, config, cursor):
        """The cluster's live instances, each as `get` answers it, `launchTime` as the creation
        time."""
        config = Config(config)
        root = call(ec2(config), "DescribeInstances", list_params(config, cursor))
        found = [listed(lambda: status(n, s, i), tag(i, tags.TAG_CLUSTER), rfc3339_ms(aws.child_text(i, "launchTime")))
                 for n, s, i in instances(root) if n and s in LIVE_STATES]
        return page(found, aws.child_text(root, "nextToken"))

    def update(self, config, id, spec):
        raise permanent("update is not supported by this provider")

    def start(self, config, id):
        raise permanent("start is not supported by this provider")

    def stop(self, config, id):
        raise permanent("stop is not supported by this provider")
