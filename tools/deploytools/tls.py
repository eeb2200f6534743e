"""Certificates of the network binds (docs/security.md, "TLS"): what is wrong with one, in one sentence.

A certificate the operator gives (``inference_server_tls_cert_file`` and its key and CA, the gateway's
``gateway_tls_*``) is checked on the controller before anything on a host changes: a PEM certificate
and key, the key the certificate's, valid now, issued by the CA that clients verify it with, and naming
the server name they ask for. The deploy's own certificates (roles/tls_cert) are renewed when they
expire within the renewal window (:func:`expires_within`) and carry the names of :func:`certificate_names`.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from deploytools.probe_url import bind_address, is_wildcard


def _certificates(pem: str) -> list[x509.Certificate]:
    """Every certificate of a PEM text (a bundle), [] when there is none or it is no PEM."""
    try:
        return x509.load_pem_x509_certificates(pem.encode())
    except ValueError:
        return []


def _names(cert: x509.Certificate) -> list[str]:
    """The DNS names and IP addresses the certificate is for (its subjectAltName)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return san.get_values_for_type(x509.DNSName) + [str(a) for a in san.get_values_for_type(x509.IPAddress)]


def _covers(names: list[str], name: str) -> bool:
    """Whether ``name`` (a host name or an address) is among ``names`` (a wildcard covers one label)."""
    try:
        return str(ipaddress.ip_address(name.strip("[]"))) in names
    except ValueError:
        pass
    name = name.lower().rstrip(".")
    for entry in (n.lower().rstrip(".") for n in names):
        if entry == name or (entry.startswith("*.") and name.partition(".")[2] == entry[2:] and "." in name):
            return True
    return False


def problem(
    cert_pem: Any, key_pem: Any, ca_pem: Any, server_name: Any, what: str, now: datetime.datetime | None = None
) -> str:
    """Why the certificate ``cert_pem`` (with ``key_pem``, checked against the CA bundle ``ca_pem``) cannot serve
    ``server_name``, in one sentence naming ``what`` (the variables it came from); '' when nothing is wrong.

    ``what`` is a mapping of ``cert``, ``key`` and ``ca`` to the variable (or file) each came from.
    """
    names = dict(what) if isinstance(what, dict) else {"cert": what, "key": what, "ca": what}
    certs = _certificates(str(cert_pem or ""))
    if not certs:
        return f"{names['cert']} holds no PEM certificate: give the server's certificate (its chain after it)."
    cert = certs[0]
    try:
        key = serialization.load_pem_private_key(str(key_pem or "").encode(), password=None)
    except (ValueError, TypeError):
        return f"{names['key']} holds no unencrypted PEM private key: give the key of {names['cert']}."
    if _public(key) != _public(cert):
        return (
            f"{names['key']} is not the key of the certificate in {names['cert']}: give the pair that belongs together."
        )
    now = now or datetime.datetime.now(datetime.timezone.utc)
    if now < cert.not_valid_before_utc:
        return (
            f"The certificate in {names['cert']} is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC: "
            "give one valid now (or correct this controller's clock)."
        )
    if now > cert.not_valid_after_utc:
        return (
            f"The certificate in {names['cert']} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC: "
            "give a renewed one."
        )
    cas = _certificates(str(ca_pem or ""))
    if not cas:
        return f"{names['ca']} holds no PEM certificate: give the CA that clients verify the server's certificate with."
    if not _chains_to(cert, certs[1:], cas):
        return (
            f"The certificate in {names['cert']} was not issued by the CA in {names['ca']} (issuer "
            f"{cert.issuer.rfc4514_string()}): clients verifying it with that CA would refuse it; give the CA that "
            "issued it."
        )
    if not _covers(_names(cert), str(server_name)):
        return (
            f"The certificate in {names['cert']} is not for {server_name} (its subjectAltName names "
            f"{', '.join(_names(cert)) or 'nothing'}): clients asking for that name would refuse it; give one that "
            "names it, or set the server name to one it names."
        )
    return ""


def _public(holder: Any) -> bytes:
    """The public key of a certificate or a private key, DER-encoded (to compare the two)."""
    public = holder.public_key()
    return public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _chains_to(cert: x509.Certificate, chain: list[x509.Certificate], cas: list[x509.Certificate]) -> bool:
    """Whether ``cert`` was issued by one of ``cas``, directly or through the intermediates of ``chain``."""
    for _ in range(len(chain) + 1):
        if any(_issued_by(cert, ca) for ca in cas):
            return True
        issuer = next((c for c in chain if _issued_by(cert, c)), None)
        if issuer is None:
            return False
        cert = issuer
    return False


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    """Whether ``ca`` signed ``cert``."""
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def expires_within(cert_pem: Any, days: Any, now: datetime.datetime | None = None) -> bool:
    """Whether the first certificate of ``cert_pem`` expires within ``days`` days (or is none: renew it)."""
    certs = _certificates(str(cert_pem or ""))
    if not certs:
        return True
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return certs[0].not_valid_after_utc - now < datetime.timedelta(days=float(days))


# The names every certificate the deploy issues carries, for the deploy's own calls on the host.
LOOPBACK_NAMES = ("127.0.0.1", "::1", "localhost")


def certificate_names(
    server_name: Any,
    hostname: Any,
    address: Any = "",
    bind: Any = "",
    addresses: Iterable[Any] = (),
    extra: Iterable[Any] = (),
) -> list[str]:
    """The names (DNS names and IP addresses) a certificate the deploy issues for a network bind carries, in
    this order: the name clients verify (``server_name``), the inventory name (``hostname``), its
    ``ansible_host`` (``address``), the bind itself unless it is a wildcard, the host's other ``addresses``,
    loopback, and the operator's ``extra`` names; each as :func:`bind_address` writes it (no brackets
    around an IPv6 address), empty ones and repeats left out. One rule for the API front, the gateway and
    node_exporter (filter ``tls_names``).

    >>> certificate_names("gpu1.lan", "gpu1", "10.0.4.17", "[::]", ["10.0.4.17", "fd00::7"], ["api.lan"])
    ['gpu1.lan', 'gpu1', '10.0.4.17', 'fd00::7', '127.0.0.1', '::1', 'localhost', 'api.lan']
    >>> certificate_names("gw", "gw", bind="[fd00::1]")
    ['gw', 'fd00::1', '127.0.0.1', '::1', 'localhost']
    """
    names = [server_name, hostname, address]
    if not is_wildcard(bind):
        names.append(bind)
    names += [*addresses, *LOOPBACK_NAMES, *extra]
    found: list[str] = []
    for name in names:
        text = bind_address(name)
        if text and text not in found:
            found.append(text)
    return found
