"""The control API's serving certificate: made at start (self-signed) or read from files.

The API server is the trust anchor (DESIGN.md §3): the agent publishes the certificate in
its SwapNode's status, which only that node's agent may write, and the operator pins it
(`modelswap_api.tls.pinned_context`). No CA is involved, so the agent makes its own:

    certificate = self_signed(["10.0.3.7", "node-a"])   # ECDSA P-256, SANs, one year
    context = certificate.server_context()              # for aiohttp's TCPSite

The private key never touches a disk: `server_context` hands it to OpenSSL through an
anonymous in-memory file (`memfd_create`, read once through `/proc/self/fd`, closed right
after), since `ssl` loads keys only from paths. A restarted agent makes a new key and
certificate and publishes them; the operator re-pins from the SwapNode.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import ssl
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from modelswap_sidecar.control.errors import CertificateError

#: How long a generated certificate is valid. Trust comes from the pin, not from expiry;
#: an agent running longer than this serves an expired certificate until it restarts.
VALID_SECONDS = 365 * 24 * 3600
#: Backdated so a client whose clock runs a little behind still accepts a new certificate.
BACKDATE_SECONDS = 300
#: X.509's upper bound on a common name.
_MAX_COMMON_NAME_CHARS = 64


@dataclass(frozen=True)
class ServingCertificate:
    """A certificate (PEM, what the SwapNode publishes) and its private key (PEM)."""

    certificate_pem: str
    key_pem: bytes = field(repr=False)

    def server_context(self) -> ssl.SSLContext:
        """A TLS ≥ 1.2 server context serving this certificate; CertificateError when the
        certificate and key do not load or do not match."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        with (
            _memory_file("modelswap-control-cert", self.certificate_pem.encode()) as cert_path,
            _memory_file("modelswap-control-key", self.key_pem) as key_path,
        ):
            try:
                context.load_cert_chain(cert_path, key_path)
            except (ssl.SSLError, ValueError) as e:
                raise CertificateError(f"the certificate and key do not load: {e}") from e
        return context


def self_signed(
    hosts: Sequence[str],
    *,
    valid_seconds: float = VALID_SECONDS,
    now: datetime.datetime | None = None,
) -> ServingCertificate:
    """A new ECDSA P-256 key and a self-signed certificate naming every host in `hosts`
    (IP addresses as IP SANs, other names as DNS SANs; the first is the common name).

    The profile is an end-entity one: basicConstraints CA:FALSE, no keyUsage extension,
    extendedKeyUsage serverAuth. A client that trusts exactly this certificate (cadata)
    takes it as its own trust anchor: OpenSSL 3.0 (checked: 3.0.19, with and without
    X509_V_FLAG_X509_STRICT) accepts a self-signed leaf found in its trust store whatever
    its basicConstraints and keyUsage, because CA checks apply only to certificates above
    the leaf and a one-certificate chain has none. Strict mode does refuse keyCertSign
    without basicConstraints CA:TRUE (checked), and OpenSSL 1.1.1 (read in its source, not
    run here) counts a self-issued certificate as self-signed only when its keyUsage, if
    present, allows keyCertSign; leaving keyUsage out (any usage, RFC 5280 §4.2.1.3)
    satisfies both without making the certificate a CA that could sign others.
    """
    names = list(dict.fromkeys(h for h in hosts if h))
    if not names:
        raise CertificateError("a serving certificate needs at least one host name")
    now = now or datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, names[0][:_MAX_COMMON_NAME_CHARS])]
    )
    public_key = key.public_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(seconds=BACKDATE_SECONDS))
        .not_valid_after(now + datetime.timedelta(seconds=valid_seconds))
        .add_extension(x509.SubjectAlternativeName([_san(n) for n in names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(public_key), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    return ServingCertificate(
        certificate_pem=certificate.public_bytes(serialization.Encoding.PEM).decode("ascii"),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def read_files(cert_file: Path, key_file: Path) -> ServingCertificate:
    """A configured certificate (PEM, possibly a chain) and its key; CertificateError
    naming the file that cannot be read."""
    try:
        certificate_pem = cert_file.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as e:
        raise CertificateError(f"{cert_file}: {e}") from e
    if "-----BEGIN CERTIFICATE-----" not in certificate_pem:
        raise CertificateError(f"{cert_file}: no PEM certificate in it")
    try:
        key_pem = key_file.read_bytes()
    except OSError as e:
        raise CertificateError(f"{key_file}: {e}") from e
    return ServingCertificate(certificate_pem=certificate_pem, key_pem=key_pem)


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


@contextlib.contextmanager
def _memory_file(name: str, data: bytes) -> Iterator[str]:
    """A path to `data` that exists only in this process's memory, while the block runs."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)
