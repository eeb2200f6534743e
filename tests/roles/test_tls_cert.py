"""Role tls_cert (issue 51, item 2; docs/security.md, "TLS"): the certificate of a network bind, on the
controller. The deploy's CA is made once and issues a certificate for the names asked, again when the
names change or it ends within the renewal window, not otherwise; the operator's certificate is checked
first and refused in one sentence naming its variable; the key never shows in the output, even at -vvv.
The role runs for real (ansible-playbook on localhost, community.crypto of the pinned ansible package)."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

from cryptography import x509
from role_files import run_role_tasks, task_results
from tls_certs import CA

NAMES = ["gpu1", "10.0.4.17", "127.0.0.1", "::1", "localhost"]


def run(
    tmp_path: Path, check_mode: bool = False, expect_failure: bool = False, **variables: Any
) -> list[tuple[str, dict[str, Any]]]:
    """tls_cert's main on localhost with ``variables`` (a CA folder of the test's), its task results."""
    defaults = {"tls_cert_for": "gpu1-front", "tls_cert_server_name": "gpu1", "tls_cert_names": NAMES,
                "tls_cert_ca_dir": str(tmp_path / "ca")}  # fmt: skip
    proc = run_role_tasks(tmp_path, {**defaults, **variables}, ["main.yml"], check_mode, "tls_cert", True)
    assert proc.returncode in (0, 2), proc.stdout[-3000:] + proc.stderr[-3000:]
    results = task_results(proc)
    assert proc.returncode == 0 or expect_failure, [r.get("msg") for _, r in results if r.get("failed")]
    assert "PRIVATE KEY" not in proc.stdout + proc.stderr
    return [(name.removeprefix("tls_cert : "), result) for name, result in results]


def changed(results: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The names of the tasks that changed something."""
    return [name for name, result in results if result.get("changed")]


def san(path: Path) -> list[str]:
    """The subjectAltName of the certificate at ``path``."""
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return names.get_values_for_type(x509.DNSName) + [str(a) for a in names.get_values_for_type(x509.IPAddress)]


def test_the_deploys_ca_issues_once_and_again_only_when_names_change_or_the_end_nears(tmp_path):
    ca_dir, crt = tmp_path / "ca", tmp_path / "ca" / "issued" / "gpu1-front.crt"
    first = run(tmp_path)
    assert stat.S_IMODE((ca_dir / "ca.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((ca_dir / "issued" / "gpu1-front.key").stat().st_mode) == 0o600
    assert sorted(san(crt)) == sorted(NAMES)
    # The controller's files are no change of the host's: a refused or no-op deploy stays at changed=0.
    assert changed(first) == []
    ca_key, issued = (ca_dir / "ca.key").read_bytes(), crt.read_bytes()
    # The same names, far from the end: nothing is issued.
    run(tmp_path)
    assert crt.read_bytes() == issued
    # Another name: issued again by the same CA (its key is kept).
    again = run(tmp_path, tls_cert_names=[*NAMES, "gpu1.example"])
    assert crt.read_bytes() != issued and "gpu1.example" in san(crt)
    assert changed(again) == []
    assert (ca_dir / "ca.key").read_bytes() == ca_key
    # Within the renewal window (a window longer than the validity): issued again.
    renewed = crt.read_bytes()
    run(tmp_path, tls_cert_names=[*NAMES, "gpu1.example"], tls_cert_renew_days=400)
    assert crt.read_bytes() != renewed


def test_an_operators_certificate_is_checked_and_refused_in_one_sentence(tmp_path):
    ca = CA()
    good = ca.issue("gpu1").write(tmp_path / "good")
    files = {
        "tls_cert_file": str(good["cert"]),
        "tls_cert_key_file": str(good["key"]),
        "tls_cert_ca_file": str(good["ca"]),
    }
    ok = run(tmp_path, **files)
    assert not (tmp_path / "ca").exists(), "the deploy's CA is not made for an operator's certificate"
    assert all(not result.get("failed") for _, result in ok)
    expired = ca.issue("gpu1", days=1, starts_in_days=-3).write(tmp_path / "expired")
    names = {"cert": "inference_server_tls_cert_file", "key": "inference_server_tls_key_file",
             "ca": "inference_server_tls_ca_file"}  # fmt: skip
    given = dict(files, tls_cert_file=str(expired["cert"]), tls_cert_key_file=str(expired["key"]))
    refused = run(tmp_path, expect_failure=True, tls_cert_variables=names, **given)
    said = [result.get("msg", "") for _, result in refused if result.get("failed")]
    assert len(said) == 1 and said[0].startswith(
        f"The certificate in inference_server_tls_cert_file ({expired['cert']}) expired on "
    ), said
    missing = run(tmp_path, expect_failure=True, **dict(files, tls_cert_ca_file=str(tmp_path / "nowhere.pem")))
    said = [result.get("msg", "") for _, result in missing if result.get("failed")]
    assert said == [
        f"tls_cert_ca_file is {tmp_path / 'nowhere.pem'}, which does not exist on the controller: give the path of "
        "the file there."
    ], json.dumps(said)


def test_the_bundle_a_client_verifies_with_holds_each_ca_once_as_pem(tmp_path):
    """roles/gateway's smg and roles/monitoring's Prometheus get the deploy's CA and those an inventory gave,
    as one file of PEM certificates (OpenSSL, which curl and Prometheus' Go read it alike, takes no stray
    text after the last one)."""
    operator = tmp_path / "operator-ca.pem"
    operator.write_text(CA("operator").pem)
    variables = {
        "tls_cert_bundle_ca_files": ["", str(operator), str(operator)],
        "tls_cert_ca_dir": str(tmp_path / "ca"),
    }
    proc = run_role_tasks(tmp_path, variables, ["bundle.yml"], False, "tls_cert", True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    facts = [r["ansible_facts"] for _, r in task_results(proc) if "tls_cert_bundle_pem" in r.get("ansible_facts", {})]
    bundle = facts[0]["tls_cert_bundle_pem"]
    certs = x509.load_pem_x509_certificates(bundle.encode())
    assert [c.subject.rfc4514_string() for c in certs][1] == "CN=operator" and len(certs) == 2
    assert bundle.endswith("-----END CERTIFICATE-----\n") and bundle.count("END CERTIFICATE") == 2
    assert (tmp_path / "ca" / "ca.crt").read_text().strip() in bundle
