"""What is wrong with a certificate (deploytools.tls, the filters tls_problem and tls_expires_within): the
operator's certificate for the API front is checked on the controller before anything changes, in one
sentence naming the variable (issue 51, item 2: "A wrong or expired certificate: one sentence, nothing on the
host changed"); the deploy's own are issued again within their renewal window."""

from __future__ import annotations

import datetime

import pytest
from deploytools.tls import certificate_names, expires_within, problem
from tls_certs import CA

WHAT = {"cert": "inference_server_tls_cert_file (c.pem)", "key": "inference_server_tls_key_file (k.pem)",
        "ca": "inference_server_tls_ca_file (ca.pem)"}  # fmt: skip


def test_a_good_certificate_has_no_problem_by_name_or_address():
    ca = CA()
    good = ca.issue("gpu1.example", "10.0.4.17", "*.fleet.example")
    for name in ("gpu1.example", "10.0.4.17", "w3.fleet.example", "GPU1.example."):
        assert problem(good.cert, good.key, good.ca, name, WHAT) == "", name


def test_a_chain_after_the_certificate_reaches_the_ca():
    """The operator's file may hold the chain: the certificate, then the intermediate that issued it."""
    root = CA("root")
    intermediate = CA("intermediate", parent=root)
    leaf = intermediate.issue("gpu1")
    assert problem(leaf.cert + intermediate.pem, leaf.key, root.pem, "gpu1", WHAT) == ""
    assert "was not issued by the CA" in problem(leaf.cert, leaf.key, root.pem, "gpu1", WHAT)


@pytest.mark.parametrize(
    "case, expected",
    [
        ("no cert", "inference_server_tls_cert_file (c.pem) holds no PEM certificate: give the server's certificate"),
        ("no key", "inference_server_tls_key_file (k.pem) holds no unencrypted PEM private key"),
        ("other key", "inference_server_tls_key_file (k.pem) is not the key of the certificate in"),
        ("expired", "The certificate in inference_server_tls_cert_file (c.pem) expired on "),
        ("not yet", "The certificate in inference_server_tls_cert_file (c.pem) is not valid before "),
        (
            "other CA",
            "The certificate in inference_server_tls_cert_file (c.pem) was not issued by the CA in "
            "inference_server_tls_ca_file (ca.pem)",
        ),  # fmt: skip
        ("no CA", "inference_server_tls_ca_file (ca.pem) holds no PEM certificate"),
        (
            "other name",
            "The certificate in inference_server_tls_cert_file (c.pem) is not for gpu1 (its "
            "subjectAltName names gpu2, 10.0.0.2)",
        ),  # fmt: skip
    ],
)
def test_each_wrong_certificate_is_one_sentence_naming_its_variable(case, expected):
    ca, other = CA(), CA("other")
    good = ca.issue("gpu1")
    cert, key, ca_pem = good.cert, good.key, good.ca
    if case == "no cert":
        cert = "not a certificate"
    elif case == "no key":
        key = ""
    elif case == "other key":
        key = ca.issue("gpu1").key
    elif case == "expired":
        expired = ca.issue("gpu1", days=2, starts_in_days=-5)
        cert, key = expired.cert, expired.key
    elif case == "not yet":
        later = ca.issue("gpu1", starts_in_days=3)
        cert, key = later.cert, later.key
    elif case == "other CA":
        ca_pem = other.pem
    elif case == "no CA":
        ca_pem = ""
    elif case == "other name":
        named = ca.issue("gpu2", "10.0.0.2")
        cert, key = named.cert, named.key
    said = problem(cert, key, ca_pem, "gpu1", WHAT)
    assert said.startswith(expected), said
    assert said.count(". ") == 0 and said.endswith("."), said  # one sentence
    assert "PRIVATE KEY" not in said


def test_a_certificate_is_renewed_within_its_window():
    cert = CA().issue("gpu1", days=40).cert
    assert not expires_within(cert, 30)
    assert expires_within(cert, 45)
    assert expires_within(cert, 30, now=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=15))
    assert expires_within("", 30), "no certificate yet: issue one"


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        # The API front on a wildcard bind: the host's addresses from preflight, an operator's name last.
        (
            ("gpu1.lan", "gpu1", "10.0.4.17"),
            {"bind": "0.0.0.0", "addresses": ["10.0.4.17", "[fd00::7]", ""], "extra": ["api.lan", "gpu1"]},
            ["gpu1.lan", "gpu1", "10.0.4.17", "fd00::7", "127.0.0.1", "::1", "localhost", "api.lan"],
        ),
        # The gateway on a specific IPv6 bind, no ansible_host.
        (("gw", "gw", ""), {"bind": "[fd00::1]"}, ["gw", "fd00::1", "127.0.0.1", "::1", "localhost"]),
        # node_exporter: the inventory name is the server name.
        (("node1", "node1", "192.0.2.5"), {}, ["node1", "192.0.2.5", "127.0.0.1", "::1", "localhost"]),
    ],
    ids=["front", "gateway", "node-exporter"],
)
def test_a_deploys_certificate_carries_its_names_in_one_order(args, kwargs, expected):
    assert certificate_names(*args, **kwargs) == expected
