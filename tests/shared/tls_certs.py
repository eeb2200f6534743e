"""Certificates for the TLS tests, made with ``cryptography`` (the controller's venv has it): a CA and the
certificates it issues, as PEM text; expired, not yet valid or self-signed ones on demand."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

NOW = datetime.datetime.now(datetime.timezone.utc)


@dataclass
class Issued:
    """A certificate and its key (PEM), and the CA's certificate (PEM) that verifies it."""

    cert: str
    key: str
    ca: str

    def write(self, folder: Path) -> dict[str, Path]:
        """The three as cert.pem, key.pem and ca.pem in ``folder``; their paths by name."""
        folder.mkdir(parents=True, exist_ok=True)
        paths = {name: folder / f"{name}.pem" for name in ("cert", "key", "ca")}
        for name, path in paths.items():
            path.write_text(getattr(self, name))
        return paths


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


class CA:
    """A CA that issues certificates for names (DNS names or IP addresses), itself a root or an intermediate."""

    def __init__(self, name: str = "test CA", parent: CA | None = None) -> None:
        """A root CA, or an intermediate that ``parent`` issued."""
        self.key = _key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(parent.cert.subject if parent else subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(NOW - datetime.timedelta(days=1))
            .not_valid_after(NOW + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(parent.key if parent else self.key, hashes.SHA256())
        )
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM).decode()

    def issue(self, *names: str, days: float = 30, starts_in_days: float = -1) -> Issued:
        """A certificate for ``names`` valid from ``starts_in_days`` (negative: ago) for ``days`` days."""
        key = _key()
        alt: list[x509.GeneralName] = []
        for name in names:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                alt.append(x509.DNSName(name))
        start = NOW + datetime.timedelta(days=starts_in_days)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        return Issued(cert.public_bytes(serialization.Encoding.PEM).decode(), _pem_key(key), self.pem)
