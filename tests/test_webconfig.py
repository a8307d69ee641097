"""The web config file (exporter-toolkit format): every field, every refusal, and auth checks."""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import bcrypt
import pytest
from aiohttp.test_utils import make_mocked_request

from exporter.errors import UsageError
from exporter.webauth import Credentials, basic_credentials, peer_has_allowed_san
from exporter.webconfig import TlsConfig, WebConfig, load_web_config, ssl_context

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
    with caplog.at_level(logging.WARNING, logger="exporter.webconfig"):
        assert load_web_config(write(pem, text)).tls is not None
    warned = caplog.text
    for option in ("cipher_suites", "curve_preferences", "rate_limit", "http2", "RequireAny"):
        assert option in warned


def test_nothing_is_warned_for_a_plain_file(pem: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A file using only supported options loads quietly (http2: false included)."""
    with caplog.at_level(logging.DEBUG, logger="exporter.webconfig"):
        load_web_config(write(pem, TLS + "http_server_config:\n  http2: false\n"))
    assert caplog.records == []


def basic(user: str, password: str) -> str:
    """An Authorization header value."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


async def test_right_credentials_pass_and_are_cached() -> None:
    """The right pair passes; the same pair again is answered from the cache, without bcrypt."""
    credentials = Credentials({"alice": HASH.encode()})
    assert await credentials.check(basic("alice", PASSWORD))
    assert await credentials.check(basic("alice", PASSWORD))
    assert credentials.bcrypt_runs == 1


async def test_wrong_or_missing_credentials_fail() -> None:
    """Wrong password, unknown user, no header and malformed headers all fail."""
    credentials = Credentials({"alice": HASH.encode()})
    assert not await credentials.check(basic("alice", "wrong"))
    assert not await credentials.check(basic("alice", "wrong"))
    assert credentials.bcrypt_runs == 2  # failures are never cached
    assert not await credentials.check(basic("mallory", PASSWORD))
    assert credentials.bcrypt_runs == 3  # unknown users pay bcrypt too
    for header in (None, "", "Basic !!!", "Bearer abc", "Basic " + base64.b64encode(b"x").decode()):
        assert not await credentials.check(header)
    assert credentials.bcrypt_runs == 3


def test_basic_credentials_are_parsed_as_go_does() -> None:
    """The scheme is case-insensitive, the password may hold colons and is kept as raw bytes."""
    raw = base64.b64encode(b"alice:p\xe4ss:word").decode()
    assert basic_credentials(f"basic {raw}") == ("alice", b"p\xe4ss:word")
    assert basic_credentials(basic("alice", "")) == ("alice", b"")
    bad_user = "Basic " + base64.b64encode(b"\xff:x").decode()
    for header in (None, "", "Basic", "Basic !!!", "Digest " + raw, bad_user):
        assert basic_credentials(header) is None


async def test_non_utf8_passwords_are_compared_as_bytes() -> None:
    """A password hashed from Latin-1 bytes still matches: bytes go to bcrypt untouched."""
    credentials = Credentials({"alice": bcrypt.hashpw(b"p\xe4ss", bcrypt.gensalt(4))})
    assert await credentials.check("Basic " + base64.b64encode(b"alice:p\xe4ss").decode())


async def test_unknown_users_cost_as_much_as_known_ones() -> None:
    """The decoy hash has the highest cost in use, so unknown users take as long as known ones."""
    slow = bcrypt.hashpw(b"x", bcrypt.gensalt(rounds=9))
    credentials = Credentials({"fast": HASH.encode(), "slow": slow})
    assert credentials.decoy.startswith(b"$2b$09$")

    async def median(header: str) -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            assert not await credentials.check(header)
            times.append(time.perf_counter() - start)
        return sorted(times)[1]

    known, unknown = await median(basic("slow", "wrong")), await median(basic("nobody", "wrong"))
    assert 0.5 < unknown / known < 2


async def test_long_passwords_compare_on_their_first_72_bytes() -> None:
    """Passwords over bcrypt's 72-byte limit do not raise; the first 72 bytes decide, as in Go."""
    long = "p" * 72
    credentials = Credentials({"alice": bcrypt.hashpw(long.encode(), bcrypt.gensalt(4))})
    assert await credentials.check(basic("alice", long + "ignored tail"))
    assert not await credentials.check(basic("alice", "q" * 100))


async def test_cache_is_bounded() -> None:
    """Past its limit the cache starts over instead of growing."""
    credentials = Credentials({"alice": HASH.encode(), "bob": HASH.encode()}, cache_limit=1)
    assert await credentials.check(basic("alice", PASSWORD))
    assert await credentials.check(basic("bob", PASSWORD))
    assert len(credentials.verified) == 1
    assert await credentials.check(basic("alice", PASSWORD))
    assert credentials.bcrypt_runs == 3


async def test_bcrypt_does_not_block_the_event_loop() -> None:
    """Other requests keep being served while a costly hash is checked."""
    credentials = Credentials({"alice": bcrypt.hashpw(b"x", bcrypt.gensalt(rounds=11))})
    check = asyncio.create_task(credentials.check(basic("alice", "wrong")))
    ticks = 0
    while not check.done():
        await asyncio.sleep(0.005)
        ticks += 1
    assert not check.result()
    assert ticks >= 5


def peer(cert: dict[str, object] | None) -> SimpleNamespace:
    """A transport whose TLS peer certificate is ``cert``."""
    return SimpleNamespace(get_extra_info=lambda name, default=None: cert)


@pytest.mark.parametrize(
    ("sans", "allowed", "expected"),
    [
        ((("DNS", "scraper.example"),), ("scraper.example",), True),
        ((("DNS", "scraper.example"),), ("other.example",), False),
        ((("IP Address", "2001:DB8:0:0:0:0:0:1\n"),), ("2001:db8::1",), True),
        ((("email", "ops@example.org"), ("URI", "spiffe://a/b")), ("spiffe://a/b",), True),
        ((), ("scraper.example",), False),
    ],
)
def test_client_sans_are_matched(
    sans: tuple[tuple[str, str], ...], allowed: tuple[str, ...], expected: bool
) -> None:
    """client_allowed_sans matches DNS, IP (by value), email and URI names of the peer."""
    request = make_mocked_request("GET", "/", transport=peer({"subjectAltName": sans}))
    assert peer_has_allowed_san(request, allowed) is expected


def test_no_client_certificate_matches_nothing() -> None:
    """Without a verified peer certificate no SAN can match."""
    request = make_mocked_request("GET", "/", transport=peer(None))
    assert not peer_has_allowed_san(request, ("scraper.example",))
