"""The control API's trust: the agent's self-signed serving certificate, the operator's
context pinned to it (real TLS over 127.0.0.1), and which certificate the agent serves."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from modelswap_api.tls import pinned_context
from modelswap_sidecar.agent.errors import SettingsError, StartupError
from modelswap_sidecar.agent.ports.control_tls import control_certificate
from modelswap_sidecar.agent.settings.document import settings_from_document
from modelswap_sidecar.control.certificate import ServingCertificate, self_signed
from tests.support.agent_documents import settings_document

HOSTS = ["127.0.0.1", "node-a"]


@pytest.fixture(scope="module")
def certificate() -> ServingCertificate:
    return self_signed(HOSTS)


@contextlib.asynccontextmanager
async def serving(certificate: ServingCertificate) -> AsyncIterator[int]:
    """An aiohttp server on 127.0.0.1 serving `certificate`; yields its port."""

    async def hello(request: web.Request) -> web.Response:
        del request
        return web.Response(text="hello")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=certificate.server_context())
    await site.start()
    try:
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()


async def handshake(port: int, context: ssl.SSLContext, server_hostname: str) -> None:
    """A TLS handshake to 127.0.0.1:`port` as a client of `server_hostname`."""
    _reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname=server_hostname
    )
    writer.close()
    await writer.wait_closed()


@pytest.mark.asyncio
async def test_a_pinned_client_reaches_the_server_by_ip_and_by_node_name(
    certificate: ServingCertificate,
) -> None:
    pinned = pinned_context(certificate.certificate_pem)
    async with serving(certificate) as port:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"https://127.0.0.1:{port}/", ssl=pinned) as response,
        ):
            assert response.status == 200 and await response.text() == "hello"
        await handshake(port, pinned, "node-a")  # the DNS SAN
        # X509_STRICT (Python 3.13's default for create_default_context) takes it too.
        strict = pinned_context(certificate.certificate_pem)
        strict.verify_flags |= ssl.VERIFY_X509_STRICT
        await handshake(port, strict, "127.0.0.1")


@pytest.mark.asyncio
async def test_a_context_pinned_to_another_certificate_is_refused(
    certificate: ServingCertificate,
) -> None:
    other = pinned_context(self_signed(HOSTS).certificate_pem)  # same names, another key
    async with serving(certificate) as port:
        with pytest.raises(ssl.SSLCertVerificationError) as refused:
            await handshake(port, other, "127.0.0.1")
        assert refused.value.verify_code == 18  # X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT
        async with aiohttp.ClientSession() as session:  # nor do the system CAs trust it
            with pytest.raises(aiohttp.ClientConnectorCertificateError) as error:
                await session.get(f"https://127.0.0.1:{port}/")
            assert isinstance(error.value.certificate_error, ssl.SSLCertVerificationError)


@pytest.mark.asyncio
async def test_a_name_the_certificate_does_not_carry_is_refused(
    certificate: ServingCertificate,
) -> None:
    pinned = pinned_context(certificate.certificate_pem)
    async with serving(certificate) as port:
        for wrong in ("node-b", "127.0.0.2", "localhost"):
            with pytest.raises(ssl.SSLCertVerificationError, match=r"match|mismatch"):
                await handshake(port, pinned, wrong)


@pytest.mark.asyncio
async def test_pinning_a_ca_issued_leaf_alone_trusts_it_and_not_its_issuer() -> None:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)

    def issued(subject: str, key: Any, *, ca: bool, san: str) -> x509.Certificate:
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "ca")]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(san)]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )

    leaf = issued("node-a", leaf_key, ca=False, san="node-a")
    other_leaf = issued("node-b", ec.generate_private_key(ec.SECP256R1()), ca=False, san="node-a")
    pem = leaf.public_bytes(serialization.Encoding.PEM).decode()
    configured = ServingCertificate(
        certificate_pem=pem,
        key_pem=leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    app = web.Application()
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=configured.server_context())
    await site.start()
    try:
        port = int(runner.addresses[0][1])
        await handshake(port, pinned_context(pem), "node-a")
        # Another leaf of the same CA, pinned, does not open this server.
        other = pinned_context(other_leaf.public_bytes(serialization.Encoding.PEM).decode())
        with pytest.raises(ssl.SSLCertVerificationError):
            await handshake(port, other, "node-a")
    finally:
        await runner.cleanup()


def test_the_generated_certificate_is_p256_names_every_host_and_lasts_a_year(
    certificate: ServingCertificate,
) -> None:
    cert = x509.load_pem_x509_certificate(certificate.certificate_pem.encode())
    key = cert.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert san.get_values_for_type(x509.DNSName) == ["node-a"]
    valid = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert datetime.timedelta(days=365) <= valid <= datetime.timedelta(days=366)
    assert cert.subject == cert.issuer
    assert "key_pem" not in repr(certificate) and "PRIVATE" not in repr(certificate)
    with pytest.raises(ValueError, match="PEM"):
        pinned_context("not a certificate")


# -- which certificate the agent serves ---------------------------------------------------------


def settings_doc(tmp_path: Path, **more: Any) -> dict[str, Any]:
    control = {"host": "0.0.0.0", "tokenFile": str(tmp_path / "token")}
    return settings_document(tmp_path, control=control, **more)


KUBE = {"kubeconfig": "/nonexistent/kubeconfig", "advertiseHost": "10.0.3.7"}


def test_cluster_mode_makes_a_certificate_for_the_advertised_host_and_the_node(
    tmp_path: Path,
) -> None:
    made = control_certificate(settings_from_document(settings_doc(tmp_path, kube=KUBE)))
    assert made is not None
    cert = x509.load_pem_x509_certificate(made.certificate_pem.encode())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.3.7")]
    assert san.get_values_for_type(x509.DNSName) == ["node-a"]
    made.server_context()  # the pair loads


def test_plain_http_in_local_mode_without_a_cluster_and_when_off(tmp_path: Path) -> None:
    assert control_certificate(settings_from_document(settings_doc(tmp_path))) is None
    local = settings_doc(tmp_path, localMode=True)
    assert control_certificate(settings_from_document(local)) is None
    off = settings_doc(tmp_path, kube=KUBE)
    off["control"] = {**off["control"], "tls": "off"}
    assert control_certificate(settings_from_document(off)) is None


def test_a_configured_certificate_is_served_and_published_as_is(tmp_path: Path) -> None:
    given = self_signed(["agent.example"])
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_text(given.certificate_pem)
    key.write_bytes(given.key_pem)
    doc = settings_doc(tmp_path)  # no cluster: the configured files still give HTTPS
    doc["control"] = {**doc["control"], "tlsCertFile": str(cert), "tlsKeyFile": str(key)}
    served = control_certificate(settings_from_document(doc))
    assert served is not None and served.certificate_pem == given.certificate_pem

    key.write_bytes(self_signed(["agent.example"]).key_pem)  # not this certificate's key
    with pytest.raises(StartupError, match=r"^control\.tlsCertFile: .*do not load"):
        control_certificate(settings_from_document(doc))
    cert.write_text("-----BEGIN CERTIFICATE-----\n" + "A" * 9000 + "\n")
    with pytest.raises(StartupError, match=r"^control\.tlsCertFile: .*at most 8192"):
        control_certificate(settings_from_document(doc))


@pytest.mark.parametrize(
    ("control", "message"),
    [
        ({"tls": "on"}, r"^control\.tls: 'on' is not one of auto, off"),
        ({"tlsCertFile": "/c"}, r"^control\.tlsKeyFile is required"),
        ({"tlsKeyFile": "/k"}, r"^control\.tlsCertFile is required"),
        ({"tls": "off", "tlsCertFile": "/c", "tlsKeyFile": "/k"}, r"control\.tls is off"),
    ],
)
def test_bad_tls_settings_name_the_key(
    tmp_path: Path, control: dict[str, Any], message: str
) -> None:
    doc = settings_doc(tmp_path)
    doc["control"] = {**doc["control"], **control}
    with pytest.raises(SettingsError, match=message):
        settings_from_document(doc)
