"""The target: the server the exporter connects to, as libpq reads its URL.

The URL (or keyword string) is parsed once, at start, by libpq's own parser
(PQconninfoParse, through psycopg). Masking, the added ``sslmode``, the database
name and pgBouncer mode all follow that reading, so a password with any character
libpq accepts is neither shown nor changed (§1, D14). :func:`mask` is the one
masking rule, for the target and for any text a log line or an error message carries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import unquote

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from exporter.errors import TargetError

MASK = "xxxxx"
PGBOUNCER_DATABASE = "pgbouncer"  # pgBouncer's admin console
_URI_PREFIXES = ("postgresql://", "postgres://")  # libpq's, case-sensitive


def _libpq_secrets() -> frozenset[str]:
    """Parameters libpq hides itself: '*' (passwords) and 'D' (debug only, e.g. SCRAM keys).

    Asked of libpq's parser, not of its defaults: PQconndefaults reads the service file
    $PGSERVICE names, which could be a FIFO, before the variable is cleared (issue 29)."""
    hidden = {
        option.keyword.decode()
        for option in pq.Conninfo.parse(b"")
        if option.dispchar in (b"*", b"D")
    }
    return frozenset(hidden | {"password", "sslpassword"})  # an older libpq hides these too


SECRET_PARAMETERS = _libpq_secrets()

_KEYWORDS = "|".join(sorted(SECRET_PARAMETERS, key=len, reverse=True))
# A URL of any scheme (so an odd spelling cannot slip through), or a secret keyword
# with its value: libpq's quoted and bare forms (backslash escapes), or double quotes.
# The scheme's length is bounded so that a long run like "a.a.a." costs linear time.
_SECRET = re.compile(
    r"(?P<url>\b[a-z][a-z0-9+.-]{0,31}://[^\s'\"<>]+)"
    rf"|(?P<key>(?:{_KEYWORDS})\s*=\s*)"
    r"(?:'(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?|(?:[^\s\\]|\\.)+)"
    # A crypt(3) or bcrypt hash ($6$salt$hash, $2b$10$…): a shadow or htpasswd line.
    r"|(?P<hash>\$(?:[0-9]|2[abxy]|y|gy|sha1|md5|apr1)\$[^\s'\":]+)",
    re.IGNORECASE | re.DOTALL,
)
_URI_HINT = (
    "in a URL, percent-encode special characters of the user name and password "
    "(% as %25, @ as %40, / as %2F, a space as %20)"
)
# As $PGSERVICE is cleared at start (exporter.cli), for the same reason, and because the
# service file is opened when libpq connects, on the event loop (a FIFO there holds it).
_SERVICE_REFUSED = (
    "the target URL names a libpq service (service=): libpq would read a service file "
    "(~/.pg_service.conf or the system's) behind the URL's back, which can name another "
    "server and files of its own; write the service's host, port, user and database in "
    "the URL instead"
)
_KEYWORD_HINT = "quote a value holding spaces or quotes, with \\ before ' and \\ (password='a b')"


@dataclass(frozen=True, slots=True)
class Target:
    """The target URL as libpq reads it, with ``sslmode=disable`` added when absent."""

    masked: str  # the URL as given (or as libpq read it), each secret xxxxx: the form shown
    params: tuple[tuple[str, str], ...] = field(repr=False)  # libpq's reading, secrets in clear

    @classmethod
    def parse(cls, text: str) -> Target:
        """Read ``text`` with libpq; TargetError, quoting none of it, if libpq cannot."""
        params = checked(text)
        # A URL is masked whole: unlike in free text, its password may hold quotes.
        shown = _mask_url(text) if text.startswith(_URI_PREFIXES) else mask(text)
        if "sslmode" not in params:
            params["sslmode"] = "disable"
            shown = _with_sslmode(shown)
        return cls(masked=_verified(shown, params), params=tuple(params.items()))

    @property
    def conninfo(self) -> str:
        """The keyword string handed to libpq: every value exactly as libpq read it."""
        return make_conninfo("", **dict(self.params))

    @property
    def dbname(self) -> str:
        """The database libpq will ask for ('' when it relies on libpq's default)."""
        return dict(self.params).get("dbname", "")

    @property
    def is_pgbouncer(self) -> bool:
        """True when the target is pgBouncer's admin console."""
        return self.dbname == PGBOUNCER_DATABASE


def checked(text: str) -> dict[str, str]:
    """libpq's reading of ``text``; TargetError, quoting none of it, when libpq cannot
    read it or reads a URL in a way no real target is written (a misplaced password)."""
    try:
        params = _read(text)
    except TargetError as exc:
        hint = _URI_HINT if text.startswith(_URI_PREFIXES) else _KEYWORD_HINT
        raise TargetError(f"libpq cannot read the target URL ({exc}); {hint}") from None
    if "service" in params:
        raise TargetError(_SERVICE_REFUSED)
    doubt = _implausible(params) if text.startswith(_URI_PREFIXES) else None
    if doubt is not None:  # a password libpq took for a host, port or database
        raise TargetError(
            f"libpq reads the target URL with {doubt}: the password (or user name) "
            f"likely holds an unencoded '/' or '@'; {_URI_HINT}"
        )
    return params


def _implausible(params: dict[str, str]) -> str | None:
    """What in libpq's reading of a URL no real target has, or None.

    A ``/`` ends the authority for libpq, so ``u:Ab3/Pw@host/db`` is host ``u``, port
    ``Ab3`` and database ``Pw@host/db``: nothing is a password, so nothing would be
    masked. A port that is not a number, or an ``@`` in a host or database, is refused.
    """
    ports = params.get("port", "").split(",")
    if not all(port.isascii() and (port.isdigit() or not port) for port in ports):
        return "a port that is not a number"
    if "@" in params.get("host", "") or "@" in params.get("hostaddr", ""):
        return "an '@' in the host"
    if "@" in params.get("dbname", ""):
        return "an '@' in the database name"
    return None


def database_of(conninfo: str) -> str:
    """The database libpq reads in a connection string ('' when none or unreadable)."""
    try:
        return _read(conninfo).get("dbname", "")
    except TargetError:
        return ""


def mask(text: str) -> str:
    """``text`` with the secrets of every URL and keyword string in it replaced by xxxxx."""
    return _SECRET.sub(_mask_match, text)


def _mask_match(match: re.Match[str]) -> str:
    url = match.group("url")
    if match.group("hash") is not None:
        return MASK
    return f"{match.group('key')}{MASK}" if url is None else _mask_url(url)


def _mask_url(url: str) -> str:
    """Mask the userinfo password and the secret query parameters.

    libpq ends the authority at the first ``/``, and a password may hold ``?``,
    ``#`` or ``@``: everything from the first ``:`` to the last ``@`` before that
    ``/`` is masked.
    """
    start = url.index("://") + 3
    slash = url.find("/", start)
    at = url.rfind("@", start, slash if slash >= 0 else len(url))
    colon = url.find(":", start, at) if at >= 0 else -1
    if colon >= 0:
        url = f"{url[: colon + 1]}{MASK}{url[at:]}"
    base, question, query = url.partition("?")
    if not question:
        return url
    return f"{base}?" + "&".join(_mask_query_item(item) for item in query.split("&"))


def _mask_query_item(item: str) -> str:
    key, equals, _ = item.partition("=")
    secret = equals and unquote(key).lower() in SECRET_PARAMETERS
    return f"{key}={MASK}" if secret else item


def _with_sslmode(text: str) -> str:
    if not text.startswith(_URI_PREFIXES):
        return f"{text} sslmode=disable".strip()
    joiner = "" if text.endswith("?") else "&" if "?" in text else "?"
    return f"{text}{joiner}sslmode=disable"


def _verified(shown: str, params: dict[str, str]) -> str:
    """``shown`` if libpq reads it as ``params`` with every secret xxxxx.

    Otherwise (libpq reads a password differently from how it looks, e.g. one
    holding an unencoded space) the keyword form of ``params``, exact by construction.
    """
    expected = {key: MASK if key in SECRET_PARAMETERS else value for key, value in params.items()}
    try:
        if _read(shown) == expected:
            return shown
    except TargetError:
        pass
    return make_conninfo("", **expected)


def _read(text: str) -> dict[str, str]:
    """libpq's reading of ``text``; TargetError with libpq's reason, the input left out."""
    if "\0" in text:
        raise TargetError("it contains a NUL character")
    try:
        return {key: str(value) for key, value in conninfo_to_dict(text).items()}
    except UnicodeEncodeError:
        raise TargetError("it is not valid UTF-8") from None
    except psycopg.ProgrammingError as exc:
        raise TargetError(_sanitised(str(exc))) from None


def _sanitised(message: str) -> str:
    """libpq's message without what it quotes from the input, where a secret may be.

    libpq puts input between double quotes and the input may hold quotes itself,
    so everything from the first quote to the last is left out.
    """
    message = " ".join(message.split())
    first, last = message.find('"'), message.rfind('"')
    if first < 0:
        return message
    return f'{message[:first]}"…"{message[last + 1 :]}' if last > first else message[:first]
