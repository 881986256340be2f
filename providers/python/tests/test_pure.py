"""The helper package's pure modules (`tags`, `timestamps`) on a plain CPython, as the Rust
SDK's `tags` and `time` tests check the same rules:

    python3 -m unittest discover -s providers/python/tests
"""

import importlib.util
import pathlib
import unittest
from types import SimpleNamespace

_PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "vmop_provider"


def _load(name):
    # Not through the package: its __init__ needs the WIT bindings.
    spec = importlib.util.spec_from_file_location(name, _PACKAGE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tags = _load("tags")
timestamps = _load("timestamps")


def spec(labels=()):
    return SimpleNamespace(namespace="team-a", name="web", uid="u-1", labels=list(labels))


class Tags(unittest.TestCase):
    def test_own_tags_carry_the_cluster_when_named(self):
        self.assertEqual(tags.own(spec(), ""), [(tags.TAG_NAMESPACE, "team-a"), (tags.TAG_NAME, "web"),
                                               (tags.TAG_UID, "u-1")])
        self.assertEqual(tags.own(spec(), "c-1")[-1], (tags.TAG_CLUSTER, "c-1"))

    def test_labels_never_set_a_mark(self):
        labels = [("app", "web"), (tags.TAG_CLUSTER, "forged"), (tags.TAG_UID, "x"), ("Name", "n"),
                  ("app", "twice")]
        marks = tags.with_labels(spec(labels), "", reserved=("Name",))
        self.assertEqual(marks[3:], [("app", "web")])
        self.assertNotIn(tags.TAG_CLUSTER, dict(marks))


class Timestamps(unittest.TestCase):
    def test_reads_what_ec2_and_moto_write(self):
        self.assertEqual(timestamps.rfc3339_ms("1970-01-01T00:00:00Z"), 0)
        self.assertEqual(timestamps.rfc3339_ms("2026-11-29T21:00:00.000Z"), 1_795_986_000_000)
        self.assertEqual(timestamps.rfc3339_ms("2026-11-29T22:30:00.123+01:30"), 1_795_986_000_123)

    def test_refuses_the_rest(self):
        for value in (None, "", "2026-11-29T21:00:00", "yesterday", "1969-12-31T23:59:59Z"):
            self.assertIsNone(timestamps.rfc3339_ms(value), value)


if __name__ == "__main__":
    unittest.main()
