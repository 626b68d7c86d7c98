"""The operator's side of the control API's trust: a client context pinned to the serving
certificate a node's agent publishes in its SwapNode (`status.certificate`).

    context = pinned_context(swapnode["status"]["certificate"])
    httpx.AsyncClient(base_url=swapnode["status"]["endpoint"], verify=context)

Only that node's agent may write its SwapNode (a ValidatingAdmissionPolicy), so the API
server vouches for the certificate and no CA is needed. Standard library only.
"""

from __future__ import annotations

import ssl


def pinned_context(certificate_pem: str) -> ssl.SSLContext:
    """A TLS ≥ 1.2 client context that trusts exactly `certificate_pem` (no system CAs)
    and checks the server's name against the certificate's SANs: connect with the
    endpoint's host as the server name (the agent's advertised host, which its certificate
    names).

    `VERIFY_X509_PARTIAL_CHAIN` makes the pinned certificate a trust anchor even when it
    is not self-signed (a configured certificate issued by some CA, published alone), so
    the pin is the certificate itself and never its issuer. ValueError (ssl.SSLError)
    when the text holds no usable certificate.
    """
    if "-----BEGIN CERTIFICATE-----" not in certificate_pem:
        raise ValueError("not a PEM certificate")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED, check_hostname
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    context.load_verify_locations(cadata=certificate_pem)
    return context
