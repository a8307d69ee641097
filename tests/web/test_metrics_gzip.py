"""The gzipped answer reuses the last answer's compression of the pieces they share
(PrefixGzip): it must always be one valid gzip member of exactly the identity body."""

from __future__ import annotations

import gc
import gzip
import random
import weakref
import zlib

import pytest
from aiohttp import web
from pytest_aiohttp.plugin import AiohttpClient

from exporter.collect.admission import Admission
from exporter.expose.exposition import Family, Format, encode, encode_chunks, make_family
from exporter.web import metrics
from exporter.web.metrics import MAX_COMPRESSORS, Answer, PrefixGzip, compressor_for, write


def _one_member(data: bytes) -> bytes:
    """The content of ``data``, which must be exactly one gzip member."""
    inflater = zlib.decompressobj(31)
    content = inflater.decompress(data)
    assert inflater.eof, "the gzip member is not finished"
    assert inflater.unused_data == b"", "more than one gzip member"
    return content


def _piece(seed: int, size: int = 3000) -> bytes:
    rng = random.Random(seed)
    return b"".join(
        b'metric_%d{db="x"} %d\n' % (rng.randrange(50), rng.randrange(9)) for _ in range(size // 20)
    )


def _check(compressor: PrefixGzip, chunks: list[bytes]) -> bytes:
    answer = compressor.compress(chunks)
    assert _one_member(answer) == b"".join(chunks)
    assert gzip.decompress(answer) == b"".join(chunks)
    return answer


def test_prefix_stays_changes_shrinks_and_grows() -> None:
    stable = [_piece(n) for n in range(6)]
    compressor = PrefixGzip()
    passes = [
        [*stable, _piece(100)],  # first: nothing to reuse
        [*stable, _piece(101)],  # tail changed: the prefix is saved
        [*stable, _piece(102)],  # and reused
        [*stable[:3], _piece(103), *stable[4:], _piece(104)],  # a piece inside changed
        [*stable[:2]],  # shrinks below the saved prefix
        [*stable[:2], _piece(105)],
        [*stable, _piece(106), _piece(107)],  # grows past it
        [*stable, _piece(106), _piece(108)],
        [],  # empty exposition
        [b"", *stable, b""],  # empty pieces
        [*stable],
        [*stable],  # identical answer: every piece reused
    ]
    for chunks in passes:
        _check(compressor, chunks)


def test_equal_bytes_that_are_new_objects_are_recompressed_correctly() -> None:
    """Reuse is by identity; equal content in a new object is compressed again, right."""
    compressor = PrefixGzip()
    first = [_piece(1), _piece(2)]
    _check(compressor, first)
    _check(compressor, [bytes(bytearray(first[0])), _piece(3)])
    _check(compressor, [first[0], _piece(2)])


def test_the_shared_prefix_is_compressed_once() -> None:
    """The third answer with the same leading pieces starts from the saved compressor:
    the leading pieces are not handed to zlib again (counted through a wrapper)."""
    stable = [_piece(n) for n in range(4)]
    compressor = PrefixGzip()
    for seed in (10, 11):
        _check(compressor, [*stable, _piece(seed)])
    fed: list[bytes] = []

    class Spy:
        def __init__(self, inner: zlib._Compress) -> None:
            self.inner = inner

        def compress(self, data: bytes) -> bytes:
            fed.append(data)
            return self.inner.compress(data)

        def flush(self, mode: int = zlib.Z_FINISH) -> bytes:
            return self.inner.flush(mode)

        def copy(self) -> Spy:
            return Spy(self.inner.copy())

    saved = compressor._saved
    assert saved is not None
    assert saved[0] == len(stable)
    compressor._saved = (saved[0], Spy(saved[1]), saved[2])  # type: ignore[assignment]
    tail = _piece(12)
    _check(compressor, [*stable, tail])
    assert fed == [tail]


def test_random_passes_stay_valid() -> None:
    """Many passes mixing reused and fresh pieces in random places."""
    rng = random.Random(22)
    pool = [_piece(n, rng.randrange(0, 5000)) for n in range(12)]
    compressor = PrefixGzip()
    for step in range(150):
        chunks = [
            p if rng.random() < 0.85 else _piece(1000 + step * 20 + i) for i, p in enumerate(pool)
        ]
        chunks = chunks[: rng.randrange(len(chunks) + 1)]
        _check(compressor, chunks)


def test_compressor_is_one_per_owner_and_format(monkeypatch: pytest.MonkeyPatch) -> None:
    class Owner:
        pass

    monkeypatch.setattr(metrics, "_COMPRESSORS", weakref.WeakKeyDictionary())

    a, b = Owner(), Owner()
    assert compressor_for(a, Format.TEXT) is compressor_for(a, Format.TEXT)
    assert compressor_for(a, Format.TEXT) is not compressor_for(a, Format.OPENMETRICS)
    assert compressor_for(a, Format.TEXT) is not compressor_for(b, Format.TEXT)
    del a, b
    gc.collect()
    assert len(metrics._COMPRESSORS) == 0  # a target gone gives its compressors back


def test_compressors_kept_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fleet of many targets keeps MAX_COMPRESSORS at most; the rest gzip whole, right."""

    class Owner:
        pass

    monkeypatch.setattr(metrics, "_COMPRESSORS", weakref.WeakKeyDictionary())
    owners = [Owner() for _ in range(MAX_COMPRESSORS + 5)]
    kept = [compressor_for(owner, Format.TEXT) for owner in owners]
    assert sum(c is not None for c in kept) == MAX_COMPRESSORS
    assert kept[-1] is None
    del owners[0]
    gc.collect()
    assert compressor_for(Owner(), Format.TEXT) is not None  # a target gone frees its place


async def test_a_gzipped_answer_is_never_joined_whole(aiohttp_client: AiohttpClient) -> None:
    """An answer made of chunks is gzipped from them: the body is joined only when a
    client takes it uncompressed, and then once for every such client."""
    chunks = encode_chunks([make_family(f"m_{n}", "gauge", "h", [((), n)]) for n in range(50)],
                           Format.TEXT)  # fmt: skip
    answers: list[Answer] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        answer = answers[-1]
        return await write(request, Admission(limit=4), answer, 10.0)

    app = web.Application()
    app.router.add_get("/metrics", handler)
    client = await aiohttp_client(app)
    answers.append(Answer(None, "text/plain", chunks, PrefixGzip()))
    zipped = await client.get("/metrics", headers={"Accept-Encoding": "gzip"})
    assert await zipped.read() == b"".join(chunks)  # aiohttp's client inflates it
    assert zipped.headers["Content-Encoding"] == "gzip"
    assert not answers[-1].joined
    plain = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert await plain.read() == b"".join(chunks)
    assert answers[-1].joined
    body = answers[-1].body
    assert answers[-1].body is body  # joined once


async def test_a_real_client_reads_every_gzipped_answer(aiohttp_client: AiohttpClient) -> None:
    """Through aiohttp's client, gzip accepted: each answer decodes to the identity body
    while the exposition's leading families stay, change and disappear."""
    stable = [
        make_family(
            f"stable_{n}", "gauge", "h", [((("db", str(i)),), float(i)) for i in range(200)]
        )
        for n in range(5)
    ]
    state = {"pass": 0}
    compressor = PrefixGzip()
    admission = Admission(limit=4)

    def families() -> list[Family]:
        n = state["pass"]
        fresh = make_family("every_pass", "counter", "h", [((), float(n))])
        kept = stable if n % 4 != 3 else stable[2:]  # now and then the prefix shrinks
        return [*kept, fresh]

    async def handler(request: web.Request) -> web.StreamResponse:
        chunks = encode_chunks(families(), Format.TEXT)
        answer = Answer(b"".join(chunks), "text/plain", chunks, compressor)
        return await write(request, admission, answer, 10.0)

    app = web.Application()
    app.router.add_get("/metrics", handler)
    client = await aiohttp_client(app)
    for n in range(8):
        state["pass"] = n
        expected = encode(families(), Format.TEXT).decode()
        zipped = await client.get("/metrics", headers={"Accept-Encoding": "gzip"})
        assert zipped.headers["Content-Encoding"] == "gzip"
        assert await zipped.text() == expected
        plain = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
        assert "Content-Encoding" not in plain.headers
        assert await plain.text() == expected
