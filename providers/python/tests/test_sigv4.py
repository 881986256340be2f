"""`vmop_provider.sigv4` against the AWS SigV4 test suite's vectors, the same ones the Rust
SDK's `sigv4` tests use. Runs on a plain CPython (the module needs only the standard library):

    python3 -m unittest discover -s providers/python/tests
"""

import importlib.util
import pathlib
import unittest

_PATH = pathlib.Path(__file__).resolve().parent.parent / "vmop_provider" / "sigv4.py"
_SPEC = importlib.util.spec_from_file_location("sigv4", _PATH)
sigv4 = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(sigv4)  # not through the package: its __init__ needs the WIT bindings

#: 2015-08-30T12:36:00Z, the time of the AWS SigV4 test suite.
SUITE_TIME = 1_440_938_160
SUITE = dict(region="us-east-1", service="service", key_id="AKIDEXAMPLE",
             secret="wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", now=SUITE_TIME)


def authorization(signed_headers, signature):
    return ("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
            f"SignedHeaders={signed_headers}, Signature={signature}")


def suite_sign(method, url):
    return dict(sigv4.sign(method, url, [], b"", **SUITE))["authorization"]


class Suite(unittest.TestCase):
    def test_get_vanilla(self):
        self.assertEqual(
            suite_sign("GET", "https://example.amazonaws.com/"),
            authorization("host;x-amz-date",
                          "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"))

    def test_post_vanilla(self):
        self.assertEqual(
            suite_sign("POST", "https://example.amazonaws.com/"),
            authorization("host;x-amz-date",
                          "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"))

    def test_get_vanilla_query_order_key_case(self):
        self.assertEqual(
            suite_sign("GET", "https://example.amazonaws.com/?Param2=value2&Param1=value1"),
            authorization("host;x-amz-date",
                          "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"))

    def test_documented_signing_key(self):
        # The key-derivation example of the AWS General Reference (IAM, 2012-02-15).
        key = sigv4.signing_key("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20120215",
                                "us-east-1", "iam")
        self.assertEqual(key.hex(),
                         "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d")

    def test_session_token_is_signed_and_sent(self):
        added = sigv4.sign("POST", "http://127.0.0.1:5000/",
                           [("Content-Type", "application/x-www-form-urlencoded")], b"A=1",
                           **{**SUITE, "service": "ec2", "token": "token-value"})
        self.assertEqual([name for name, _ in added],
                         ["x-amz-date", "x-amz-security-token", "authorization"])
        auth = added[-1][1]
        self.assertIn("SignedHeaders=content-type;host;x-amz-date;x-amz-security-token,", auth)
        self.assertNotIn("wJalr", auth)

    def test_encodes_the_aws_way(self):
        self.assertEqual(sigv4.encode("a b/c~d_e.f-g*"), "a%20b%2Fc~d_e.f-g%2A")
        self.assertEqual(sigv4._canonical_query("b=2&a=%41&a=1"), "a=1&a=A&b=2")


if __name__ == "__main__":
    unittest.main()
