"""The web config file (exporter-toolkit format): every field and every refusal."""

from __future__ import annotations

import logging
import os
import ssl
import subprocess
from pathlib import Path

import bcrypt
import pytest

from exporter.errors import UsageError
from exporter.web.webconfig import TlsConfig, WebConfig, load_web_config, ssl_context

PASSWORD = "s3cret pass"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()


def openssl(directory: Path, *args: str) -> None:
    """Run the openssl command line tool in ``directory``."""
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with a self-signed cert.pem/key.pem pair and an unrelated other.key."""
    directory = tmp_path_factory.mktemp("pem")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl(directory, "req", "-x509", *ec, "-keyout", "key.pem", "-out", "cert.pem",
            "-days", "2", "-subj", "/CN=localhost")  # fmt: skip
    openssl(directory, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-out", "other.key")  # fmt: skip
    return directory


def write(directory: Path, text: str) -> str:
    """The web config file ``web.yml`` in ``directory`` holding ``text``."""
    path = directory / "web.yml"
    path.write_text(text)
    return str(path)


def refusal(directory: Path, text: str) -> str:
    """The UsageError message for a config with ``text``."""
    with pytest.raises(UsageError) as caught:
        load_web_config(write(directory, text))
    message = str(caught.value)
    assert message.startswith(f"web config {directory / 'web.yml'}: ")
    assert "\n" not in message
    return message


TLS = "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n"


def test_empty_file_means_plain_http_without_auth(tmp_path: Path) -> None:
    """An empty file (or one of empty sections) configures nothing."""
    assert load_web_config(write(tmp_path, "")) == WebConfig()
    empty = "tls_server_config:\nbasic_auth_users:\nhttp_server_config:\n"
    assert load_web_config(write(tmp_path, empty)) == WebConfig()


def test_full_file_is_read_with_paths_relative_to_it(pem: Path) -> None:
    """Every supported field lands in the frozen objects; relative paths follow the file."""
    config = load_web_config(
        write(
            pem,
            TLS + "  client_auth_type: RequireAndVerifyClientCert\n"
            "  client_ca_file: cert.pem\n"
            "  client_allowed_sans: [scraper.example, 10.0.0.1]\n"
            "  min_version: TLS13\n  max_version: TLS13\n"
            "  prefer_server_cipher_suites: false\n"
            f"basic_auth_users:\n  alice: {HASH}\n  '123': {HASH}\n"
            "http_server_config:\n  http2: false\n  headers:\n"
            "    x-frame-options: DENY\n    Content-Security-Policy: default-src 'self'\n"
            "    X-XSS-Protection: ''\n",
        )
    )
    assert config.tls == TlsConfig(
        cert_file=str(pem / "cert.pem"),
        key_file=str(pem / "key.pem"),
        client_auth="RequireAndVerifyClientCert",
        client_ca_file=str(pem / "cert.pem"),
        client_allowed_sans=("scraper.example", "10.0.0.1"),
        min_version=ssl.TLSVersion.TLSv1_3,
        max_version=ssl.TLSVersion.TLSv1_3,
        prefer_server_ciphers=False,
    )
    assert dict(config.users) == {"alice": HASH.encode(), "123": HASH.encode()}
    assert config.headers == (
        ("X-Frame-Options", "DENY"),
        ("Content-Security-Policy", "default-src 'self'"),
    )


def test_users_and_key_are_kept_out_of_repr(pem: Path) -> None:
    """Hashes and inline keys never reach a log line through repr()."""
    key = (pem / "key.pem").read_text()
    config = WebConfig(tls=TlsConfig(key_pem=key), users={"alice": HASH.encode()})
    assert HASH not in repr(config)
    assert "PRIVATE KEY" not in repr(config)


def test_inline_pem_is_accepted(pem: Path) -> None:
    """cert, key and client_ca may be given inline instead of as files."""

    def block(name: str) -> str:
        return "|\n" + "".join(f"    {line}\n" for line in (pem / name).read_text().splitlines())

    text = (
        f"tls_server_config:\n  cert: {block('cert.pem')}  key: {block('key.pem')}"
        f"  client_ca: {block('cert.pem')}  client_auth_type: VerifyClientCertIfGiven\n"
    )
    config = load_web_config(write(pem, text))
    assert config.tls is not None
    assert config.tls.cert_file is None
    assert config.tls.key_pem == (pem / "key.pem").read_text()
    assert ssl_context(config.tls).verify_mode == ssl.CERT_OPTIONAL


@pytest.mark.parametrize(
    ("client_auth", "mode"),
    [
        ("NoClientCert", ssl.CERT_NONE),
        ("RequestClientCert", ssl.CERT_NONE),
        ("RequireClientCert", ssl.CERT_REQUIRED),
        ("RequireAnyClientCert", ssl.CERT_REQUIRED),
        ("VerifyClientCertIfGiven", ssl.CERT_OPTIONAL),
        ("RequireAndVerifyClientCert", ssl.CERT_REQUIRED),
    ],
)
def test_client_auth_type_sets_verify_mode(pem: Path, client_auth: str, mode: int) -> None:
    """Each client_auth_type (and the old RequireClientCert) maps to a verify mode."""
    config = load_web_config(write(pem, TLS + f"  client_auth_type: {client_auth}\n"))
    assert config.tls is not None
    assert ssl_context(config.tls).verify_mode == mode


def test_context_carries_versions_and_cipher_preference(pem: Path) -> None:
    """min_version/max_version bound the protocol; server cipher preference is on by default."""
    config = load_web_config(write(pem, TLS + "  min_version: TLS12\n  max_version: TLS12\n"))
    assert config.tls is not None
    context = ssl_context(config.tls)
    assert (context.minimum_version, context.maximum_version) == (
        ssl.TLSVersion.TLSv1_2,
        ssl.TLSVersion.TLSv1_2,
    )
    assert context.options & ssl.OP_CIPHER_SERVER_PREFERENCE
    default = load_web_config(write(pem, TLS)).tls
    assert default is not None
    assert (default.min_version, default.max_version) == (
        ssl.TLSVersion.TLSv1_2,
        ssl.TLSVersion.TLSv1_3,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: [1\n", "not valid YAML: "),
        ("- a\n", "must be a mapping"),
        ("tls_config: {}\n", "tls_config: unknown key"),
        ("auth_excluded_paths: [/metrics]\n", "auth_excluded_paths: unknown key"),
        ("tls_server_config: [a]\n", "tls_server_config: must be a mapping"),
        (TLS + "  ciphers: []\n", "tls_server_config.ciphers: unknown key"),
        ("http_server_config:\n  gzip: true\n", "http_server_config.gzip: unknown key"),
        ("tls_server_config:\n  cert_file: cert.pem\n", "missing one of key or key_file"),
        ("tls_server_config:\n  key_file: key.pem\n", "missing one of cert or cert_file"),
        (
            "tls_server_config:\n  client_auth_type: RequireAndVerifyClientCert\n",
            "missing one of cert or cert_file",
        ),
        (TLS + "  cert_file: [a]\n", "tls_server_config.cert_file: must be a single value"),
        (TLS + "  client_auth_type: Always\n", "'Always' is not one of NoClientCert, "),
        (TLS + "  min_version: TLS14\n", "min_version: 'TLS14' is not one of TLS10, TLS11, "),
        (TLS + "  max_version: SSL3\n", "max_version: 'SSL3' is not one of TLS10"),
        (TLS + "  min_version: TLS13\n  max_version: TLS12\n", "min_version: is above max"),
        (TLS + "  client_ca_file: cert.pem\n", "client_auth_type is unset"),
        (
            TLS + "  client_auth_type: VerifyClientCertIfGiven\n  client_allowed_sans: [a]\n",
            "client_allowed_sans: needs client_auth_type",
        ),
        (
            TLS + "  client_auth_type: RequireAnyClientCert\n  client_allowed_sans: a\n",
            "client_allowed_sans: must be a list of strings",
        ),
        (TLS + "  prefer_server_cipher_suites: maybe\n", "must be true or false, not 'maybe'"),
        ("http_server_config:\n  http2: sure\n", "http2: must be true or false"),
    ],
)
def test_invalid_fields_are_refused_with_their_location(
    pem: Path, text: str, expected: str
) -> None:
    """Bad YAML, unknown keys, missing or wrong TLS fields: one line naming file and field."""
    assert expected in refusal(pem, text)


def test_missing_or_unreadable_config_file(tmp_path: Path) -> None:
    """A web config file that cannot be read is a usage error naming it."""
    with pytest.raises(UsageError, match=r"web config .*absent\.yml: cannot read: No such file"):
        load_web_config(str(tmp_path / "absent.yml"))
    (tmp_path / "binary.yml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UsageError, match=r"binary\.yml: cannot read"):
        load_web_config(str(tmp_path / "binary.yml"))


def test_certificate_and_key_files_are_checked(pem: Path) -> None:
    """Missing, non-PEM and mismatched certificate or key files name the field at fault."""
    missing = refusal(pem, TLS.replace("cert.pem", "gone.pem"))
    assert f"tls_server_config.cert_file: cannot read {pem / 'gone.pem'}: No such file" in missing
    not_cert = refusal(pem, TLS.replace("cert.pem", "key.pem"))
    assert "tls_server_config.cert_file: " in not_cert
    assert "holds no PEM certificate" in not_cert
    not_key = refusal(pem, TLS.replace("key.pem", "cert.pem"))
    assert "tls_server_config.key_file: " in not_key
    assert "holds no PEM private key" in not_key
    mismatch = refusal(pem, TLS.replace("key.pem", "other.key"))
    assert "tls_server_config: cannot use the certificate and key: " in mismatch
    not_ca = refusal(
        pem, TLS + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: key.pem\n"
    )
    assert "tls_server_config.client_ca_file: " in not_ca


def test_broken_inline_pem_is_refused(pem: Path) -> None:
    """Inline PEM that OpenSSL cannot use is refused at load, not at the first handshake."""
    text = "tls_server_config:\n  cert: not a certificate\n  key: not a key\n"
    assert "cannot use the certificate and key" in refusal(pem, text)
    ca = TLS + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca: garbage\n"
    assert "cannot use the client CA certificates" in refusal(pem, ca)


@pytest.mark.parametrize(
    "value",
    ["plaintext-password", "$2y$10$short", "$2y$03$" + "a" * 53, "$1$abc$" + "a" * 53, "[a, b]"],
)
def test_non_bcrypt_user_values_are_refused_without_echo(tmp_path: Path, value: str) -> None:
    """Anything but a bcrypt hash (cost 4..31) is refused, and the value is never repeated."""
    message = refusal(tmp_path, f"basic_auth_users:\n  alice: {value!s}\n")
    assert "basic_auth_users.alice: is not a bcrypt hash" in message
    assert value not in message


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("Content-Type: text/plain", "headers.Content-Type: cannot be configured"),
        ("Authorization: Basic x", "headers.Authorization: cannot be configured"),
        ("WWW-Authenticate: x", "headers.WWW-Authenticate: cannot be configured"),
        ("X-Frame-Options: allow", "must be one of deny, sameorigin, not 'allow'"),
        ("X-Content-Type-Options: sniff", "must be one of nosniff"),
        ("X-XSS-Protection: [1]", "X-XSS-Protection: must be a one-line string"),
        ('X-XSS-Protection: "1\\nSet-Cookie: a=b"', "must be a one-line string"),
    ],
)
def test_headers_outside_the_toolkit_list_are_refused(
    tmp_path: Path, header: str, expected: str
) -> None:
    """Only the toolkit's five headers may be set, with its enumerated values."""
    assert expected in refusal(tmp_path, f"http_server_config:\n  headers:\n    {header}\n")


def test_ignored_options_are_warned_about(pem: Path, caplog: pytest.LogCaptureFixture) -> None:
    """cipher_suites, curve_preferences, rate_limit, http2 and RequireAny are not silent."""
    text = (
        TLS + "  cipher_suites: [TLS_AES_128_GCM_SHA256]\n  curve_preferences: [X25519]\n"
        "  client_auth_type: RequireAnyClientCert\n"
        "rate_limit:\n  interval: 1s\n  burst: 20\n"
        "http_server_config:\n  http2: true\n"
    )
    with caplog.at_level(logging.WARNING, logger="exporter.web.webconfig"):
        assert load_web_config(write(pem, text)).tls is not None
    warned = caplog.text
    for option in ("cipher_suites", "curve_preferences", "rate_limit", "http2", "RequireAny"):
        assert option in warned


def test_nothing_is_warned_for_a_plain_file(pem: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A file using only supported options loads quietly (http2: false included)."""
    with caplog.at_level(logging.DEBUG, logger="exporter.web.webconfig"):
        load_web_config(write(pem, TLS + "http_server_config:\n  http2: false\n"))
    assert caplog.records == []


def test_a_fifo_as_web_config_or_pem_file_is_refused_at_once(tmp_path: Path) -> None:
    """A FIFO would wait for a writer forever: refused as not a regular file (issue 25)."""
    os.mkfifo(tmp_path / "web.fifo")
    with pytest.raises(UsageError, match=r"web\.fifo: cannot read: it is a FIFO, not a regular"):
        load_web_config(str(tmp_path / "web.fifo"))
    os.mkfifo(tmp_path / "cert.pem")
    assert "tls_server_config.cert_file: cannot read " in refusal(tmp_path, TLS)
    assert "it is a FIFO, not a regular file" in refusal(tmp_path, TLS)


@pytest.mark.parametrize("cost", [15, 31])
def test_an_unreasonable_bcrypt_cost_is_refused(tmp_path: Path, cost: int) -> None:
    """A $2b$31$ hash would take a day a check: refused at load, naming the user (issue 25)."""
    salt = HASH[7:29]  # any 22 salt characters; the hash need not verify
    hashed = f"$2b${cost}${salt}{HASH[29:]}"
    message = refusal(tmp_path, f"basic_auth_users:\n  alice: {hashed}\n")
    assert f"basic_auth_users.alice: the bcrypt cost is {cost}, above the 14" in message
    assert hashed not in message


def test_bcrypt_cost_14_is_accepted(tmp_path: Path) -> None:
    """The highest cost accepted (a check takes ~1 s): loaded like any other."""
    hashed = f"$2b$14${HASH[7:]}"
    users = load_web_config(write(tmp_path, f"basic_auth_users:\n  alice: {hashed}\n")).users
    assert users["alice"] == hashed.encode()


def test_a_hash_or_url_in_a_refused_value_is_masked(tmp_path: Path) -> None:
    """A hash pasted where a user name belongs, a URL as a header value: never quoted."""
    hashed = "$2y$10$" + "Zq9" * 17 + "ab"
    message = refusal(tmp_path, f'basic_auth_users:\n  "{hashed}": x\n')
    assert "Zq9" not in message
    message = refusal(
        tmp_path,
        'http_server_config:\n  headers:\n    X-Frame-Options: "postgresql://u:Zq9@h/db"\n',
    )
    assert "must be one of deny, sameorigin" in message
    assert "Zq9" not in message
