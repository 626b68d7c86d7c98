"""Which certificate the control API serves, decided once at start from the settings.

    control.tls: off                      plain HTTP
    control.tlsCertFile + tlsKeyFile      HTTPS with them (auto)
    cluster mode (a `kube` section)       HTTPS with a key and self-signed certificate made
                                          now, naming the advertised host and the node (auto)
    otherwise (local mode, no cluster)    plain HTTP

Whatever is served is published in the SwapNode (`status.certificate`) for the operator to
pin, which is why the SwapNode's bound on it is checked here, before anything listens.
"""

from __future__ import annotations

import logging

from modelswap_sidecar.agent.errors import StartupError
from modelswap_sidecar.agent.ports.cluster_heartbeat import advertised_host
from modelswap_sidecar.agent.settings.values import AgentSettings
from modelswap_sidecar.control.certificate import ServingCertificate, read_files, self_signed
from modelswap_sidecar.control.errors import CertificateError

log = logging.getLogger(__name__)

#: The SwapNode CRD's maxLength on `status.certificate`.
MAX_CERTIFICATE_CHARS = 8192


def control_certificate(settings: AgentSettings) -> ServingCertificate | None:
    """The certificate to serve (and publish), or None for plain HTTP. StartupError naming
    the setting when a configured certificate cannot be used."""
    if settings.control_tls == "off":
        return None
    if settings.tls_cert_file is not None and settings.tls_key_file is not None:
        try:
            certificate = read_files(settings.tls_cert_file, settings.tls_key_file)
            if len(certificate.certificate_pem) > MAX_CERTIFICATE_CHARS:
                raise CertificateError(
                    f"{len(certificate.certificate_pem)} characters; the SwapNode's "
                    f"status.certificate holds at most {MAX_CERTIFICATE_CHARS}"
                )
            certificate.server_context()  # a mismatched or unreadable pair fails here
        except CertificateError as e:
            raise StartupError(f"control.tlsCertFile: {e}") from e
        return certificate
    if settings.kube is None or settings.local_mode:
        return None
    hosts = [advertised_host(settings), settings.node_name]
    log.info("control API: a new self-signed certificate for %s", ", ".join(hosts))
    return self_signed(hosts)
