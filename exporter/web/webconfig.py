"""The ``--web.config.file`` (exporter-toolkit format): TLS, basic auth, extra headers.

The file is read and checked once at start, certificates and keys included,
so a mistake stops the exporter with a one-line reason instead of surfacing
at the first scrape. Relative paths are relative to the file's directory, as
in the toolkit. Options Python's TLS stack cannot honour are ignored with a
warning, never silently; options that restrict access are never ignored.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import yaml

from exporter.config.files import FileRefused, read_regular
from exporter.config.target import mask
from exporter.errors import UsageError

log = logging.getLogger(__name__)

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# client_auth_type → what the server asks of the client. Python cannot ask for a
# certificate without verifying it: RequestClientCert does not ask (it admits the
# same clients, as it never refuses one), RequireAnyClientCert verifies (stricter).
CLIENT_AUTH_TYPES = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_NONE,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_SAN_CAPABLE = ("RequireAnyClientCert", "RequireAndVerifyClientCert")
# The only headers the toolkit lets a config add, with the values it accepts (None: any).
ALLOWED_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}
REALM = "pg_exporter"
# The web config and each PEM file it names (a CA bundle is ~200 KB): read no more.
MAX_FILE_BYTES = 4 * 1024 * 1024
BCRYPT_MAX_PASSWORD = 72  # bcrypt reads only this many bytes; longer inputs are cut, as in Go
# The highest bcrypt cost accepted. Each step doubles a check: cost 10 takes ~60 ms on
# one core, 14 ~1.2 s, 31 about a day. A check holds one of the few checking threads
# (exporter/web/auth.py), so a high cost lets a couple of wrong guesses lock everyone
# out and keeps the process from stopping; 14 is already slower than a scrape wants.
BCRYPT_MAX_COST = 14
_HTPASSWD = "htpasswd -nBC 10 '' | tr -d ':'"
_BCRYPT_HASH = re.compile(r"\$2[abxy]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")
_TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")
_TLS_KEYS = ("cert", "key", "client_ca", "cert_file", "key_file", "client_ca_file",
             "client_auth_type", "client_allowed_sans", "min_version", "max_version",
             "cipher_suites", "prefer_server_cipher_suites", "curve_preferences")  # fmt: skip
_IGNORED = ("tls_server_config.cipher_suites", "tls_server_config.curve_preferences", "rate_limit")
_CERT = ("-----BEGIN CERTIFICATE-----", "certificate")  # (what the file must hold, its name)
_KEY = ("PRIVATE KEY-----", "private key")


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Server certificate (a file, or inline PEM), client-certificate policy, versions."""

    cert_file: str | None = None
    key_file: str | None = None
    cert_pem: str | None = None
    key_pem: str | None = field(default=None, repr=False)
    client_auth: str = "NoClientCert"
    client_ca_file: str | None = None
    client_ca_pem: str | None = None
    client_allowed_sans: tuple[str, ...] = ()
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3
    prefer_server_ciphers: bool = True


@dataclass(frozen=True, slots=True)
class WebConfig:
    """What the web config file asks for; the default is plain HTTP without auth."""

    tls: TlsConfig | None = None
    users: Mapping[str, bytes] = field(default_factory=lambda: MappingProxyType({}), repr=False)
    headers: tuple[tuple[str, str], ...] = ()


def load_web_config(path: str) -> WebConfig:
    """Read and check the file; UsageError names the file and the field at fault."""
    doc = _Doc(path)
    top = doc.section(doc.parse(), "", _TOP_KEYS)
    tls = doc.section(top.get("tls_server_config"), "tls_server_config", _TLS_KEYS)
    http = doc.section(top.get("http_server_config"), "http_server_config", ("http2", "headers"))
    for where in _IGNORED:
        section, _, key = where.rpartition(".")
        if (tls if section else top).get(key):
            log.warning("web config %s: %s is not supported and is ignored", path, where)
    if doc.flag(http, "http2", "http_server_config"):
        log.warning("web config %s: http_server_config.http2 is ignored (HTTP/1.1)", path)
    config = WebConfig(
        tls=_tls(doc, tls),
        users=_users(doc, doc.section(top.get("basic_auth_users"), "basic_auth_users")),
        headers=_headers(doc, doc.section(http.get("headers"), "http_server_config.headers")),
    )
    if config.tls is not None:
        try:
            ssl_context(config.tls)
        except UsageError as exc:
            raise doc.error("tls_server_config", str(exc)) from None
    return config


class _Doc:
    """One web config file being read: its YAML, and errors that name it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.directory = os.path.dirname(os.path.abspath(path))

    def error(self, where: str, reason: str) -> UsageError:
        """A one-line error naming the file and the field; a URL or hash in it masked."""
        text = mask(f"{where + ': ' if where else ''}{reason}")
        return UsageError(f"web config {self.path}: {text}")

    def parse(self) -> Any:
        """The document with every scalar kept as text, as Go's typed parser sees it."""
        try:
            return yaml.load(read_regular(self.path, MAX_FILE_BYTES), Loader=yaml.BaseLoader)
        except FileRefused as exc:
            raise self.error("", f"cannot read: {exc}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f" (line {mark.line + 1})" if mark is not None else ""
            reason = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise self.error("", f"not valid YAML: {reason}{line}") from None

    def section(self, value: Any, where: str, keys: tuple[str, ...] = ()) -> dict[str, Any]:
        """A mapping (absent or empty: {}); with ``keys``, other keys are refused, as Go does."""
        if value is None or value == "":
            return {}
        if not isinstance(value, dict):
            raise self.error(where, "must be a mapping")
        for key in value if keys else ():
            if key not in keys:
                raise self.error(f"{where}.{key}".lstrip("."), "unknown key")
        return value

    def text(self, mapping: dict[str, Any], key: str, where: str) -> str | None:
        """A scalar, or None when absent or empty."""
        value = mapping.get(key)
        if isinstance(value, dict | list):
            raise self.error(f"{where}.{key}", "must be a single value")
        return value or None

    def flag(self, mapping: dict[str, Any], key: str, where: str) -> bool | None:
        """A YAML 1.1 boolean, or None when absent."""
        value = (self.text(mapping, key, where) or "").lower()
        if value and value not in ("true", "false", "yes", "no", "on", "off"):
            raise self.error(f"{where}.{key}", f"must be true or false, not {value!r}")
        return value in ("true", "yes", "on") if value else None

    def pem_file(self, mapping: dict[str, Any], key: str, kind: tuple[str, str]) -> str | None:
        """A readable file holding a PEM ``kind``, relative to the config's directory."""
        name = self.text(mapping, key, "tls_server_config")
        if name is None:
            return None
        path, where = os.path.join(self.directory, name), f"tls_server_config.{key}"
        try:
            content = read_regular(path, MAX_FILE_BYTES)
        except FileRefused as exc:
            raise self.error(where, f"cannot read {path}: {exc}") from None
        if kind[0] not in content:
            raise self.error(where, f"{path} holds no PEM {kind[1]}")
        return path


def _tls(doc: _Doc, section: dict[str, Any]) -> TlsConfig | None:
    """tls_server_config; None when it configures nothing (plain HTTP, as in the toolkit)."""
    where = "tls_server_config"
    sans = section.get("client_allowed_sans") or []
    if not isinstance(sans, list) or not all(isinstance(name, str) for name in sans):
        raise doc.error(f"{where}.client_allowed_sans", "must be a list of strings")
    tls = TlsConfig(
        cert_file=doc.pem_file(section, "cert_file", _CERT),
        key_file=doc.pem_file(section, "key_file", _KEY),
        cert_pem=doc.text(section, "cert", where),
        key_pem=doc.text(section, "key", where),
        client_auth=_client_auth(doc, doc.text(section, "client_auth_type", where)),
        client_ca_file=doc.pem_file(section, "client_ca_file", _CERT),
        client_ca_pem=doc.text(section, "client_ca", where),
        client_allowed_sans=tuple(sans),
        min_version=_version(doc, section, "min_version", ssl.TLSVersion.TLSv1_2),
        max_version=_version(doc, section, "max_version", ssl.TLSVersion.TLSv1_3),
        prefer_server_ciphers=doc.flag(section, "prefer_server_cipher_suites", where) is not False,
    )
    return None if tls == TlsConfig() else _checked(doc, tls)


def _checked(doc: _Doc, tls: TlsConfig) -> TlsConfig:
    """Refuse the combinations the toolkit refuses."""
    where = "tls_server_config"
    if not (tls.cert_file or tls.cert_pem):
        raise doc.error(where, "missing one of cert or cert_file")
    if not (tls.key_file or tls.key_pem):
        raise doc.error(where, "missing one of key or key_file")
    if tls.min_version > tls.max_version:
        raise doc.error(f"{where}.min_version", "is above max_version")
    if (tls.client_ca_file or tls.client_ca_pem) and tls.client_auth == "NoClientCert":
        raise doc.error(where, "client CA certificates are given but client_auth_type is unset")
    if tls.client_allowed_sans and tls.client_auth not in _SAN_CAPABLE:
        raise doc.error(f"{where}.client_allowed_sans", f"needs client_auth_type {_SAN_CAPABLE}")
    if tls.client_auth == "RequireAnyClientCert":
        log.warning(
            "web config %s: RequireAnyClientCert also verifies client certificates here "
            "(against client_ca_file, else the system CAs)",
            doc.path,
        )
    return tls


def _client_auth(doc: _Doc, value: str | None) -> str:
    if value == "RequireClientCert":  # the toolkit's older spelling
        return "RequireAnyClientCert"
    if value is not None and value not in CLIENT_AUTH_TYPES:
        reason = f"{value!r} is not one of {', '.join(CLIENT_AUTH_TYPES)}"
        raise doc.error("tls_server_config.client_auth_type", reason)
    return value or "NoClientCert"


def _version(
    doc: _Doc, section: dict[str, Any], key: str, default: ssl.TLSVersion
) -> ssl.TLSVersion:
    value = doc.text(section, key, "tls_server_config")
    if value is not None and value not in TLS_VERSIONS:
        reason = f"{value!r} is not one of {', '.join(TLS_VERSIONS)}"
        raise doc.error(f"tls_server_config.{key}", reason)
    return TLS_VERSIONS[value] if value else default


def _users(doc: _Doc, section: dict[str, Any]) -> Mapping[str, bytes]:
    """basic_auth_users: user → bcrypt hash. Never echo a value: it may be a password."""
    for user, hashed in section.items():
        if not (isinstance(hashed, str) and _BCRYPT_HASH.fullmatch(hashed)):
            reason = f"is not a bcrypt hash (make one with: {_HTPASSWD})"
            raise doc.error(f"basic_auth_users.{user}", reason)
        if int(hashed[4:6]) > BCRYPT_MAX_COST:
            reason = (
                f"the bcrypt cost is {int(hashed[4:6])}, above the {BCRYPT_MAX_COST} this "
                f"exporter accepts: each login would take minutes or more and hold a checking "
                f"thread; make a hash of cost 10 to {BCRYPT_MAX_COST} ({_HTPASSWD})"
            )
            raise doc.error(f"basic_auth_users.{user}", reason)
    return MappingProxyType({user: hashed.encode() for user, hashed in section.items()})


def _headers(doc: _Doc, section: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """http_server_config.headers: only the toolkit's few, a blank value meaning unset."""
    by_lower = {name.lower(): name for name in ALLOWED_HEADERS}
    headers = []
    for name, value in section.items():
        where, proper = f"http_server_config.headers.{name}", by_lower.get(name.lower(), "")
        allowed = ALLOWED_HEADERS.get(proper)
        if not proper:
            raise doc.error(where, f"cannot be configured (only {', '.join(ALLOWED_HEADERS)})")
        if not isinstance(value, str) or "\n" in value or "\r" in value:
            raise doc.error(where, "must be a one-line string")
        if value and allowed and value.lower() not in allowed:
            raise doc.error(where, f"must be one of {', '.join(allowed)}, not {value!r}")
        if value:
            headers.append((proper, value))
    return tuple(headers)


def ssl_context(tls: TlsConfig) -> ssl.SSLContext:
    """A server-side context for ``TCPSite``; UsageError when a file cannot be used."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version, context.maximum_version = tls.min_version, tls.max_version
    if tls.prefer_server_ciphers:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    load_certificates(context, tls)
    context.verify_mode = CLIENT_AUTH_TYPES[tls.client_auth]
    try:
        if context.verify_mode != ssl.CERT_NONE and (tls.client_ca_file or tls.client_ca_pem):
            context.load_verify_locations(cafile=tls.client_ca_file, cadata=tls.client_ca_pem)
        elif context.verify_mode != ssl.CERT_NONE:  # no CA given: the system's, as in Go
            context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    except ssl.SSLError as exc:
        raise UsageError(f"cannot use the client CA certificates: {exc}") from None
    return context


def load_certificates(context: ssl.SSLContext, tls: TlsConfig) -> None:
    """(Re)load the server certificate and key; later handshakes use the new pair."""
    try:
        with tempfile.TemporaryDirectory() as private:  # mode 0700: inline PEM needs a file
            context.load_cert_chain(
                tls.cert_file or _write(private, "cert.pem", tls.cert_pem),
                tls.key_file or _write(private, "key.pem", tls.key_pem),
            )
    except (ssl.SSLError, OSError) as exc:
        raise UsageError(f"cannot use the certificate and key: {exc}") from None


def _write(directory: str, name: str, content: str | None) -> str:
    path = os.path.join(directory, name)
    with open(path, "w", encoding="utf-8") as file:
        file.write(content or "")
    return path
