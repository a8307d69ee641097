"""Reading an operator's small files: only regular files, bounded, never blocking."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from exporter.config.files import FileRefused, entry_kind, read_regular


def test_a_regular_file_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("Zq9 é\n")
    assert read_regular(str(path), 64) == "Zq9 é\n"


def test_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    """Opening a FIFO for reading waits for a writer; here it is refused without waiting."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []
    reader = threading.Thread(target=lambda: _catch(str(fifo), outcome), daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "the read blocked on the FIFO"
    assert isinstance(outcome[0], FileRefused)
    assert "a FIFO, not a regular file" in str(outcome[0])


def _catch(path: str, outcome: list[BaseException]) -> None:
    try:
        read_regular(path, 64)
    except BaseException as exc:  # the test inspects whatever it was
        outcome.append(exc)


@pytest.mark.parametrize(
    ("path", "kind"), [("/dev/zero", "a character device"), ("/", "a directory")]
)
def test_devices_and_directories_are_refused(path: str, kind: str) -> None:
    """/dev/zero would never end: refused before any byte is read."""
    with pytest.raises(FileRefused, match=f"it is {kind}, not a regular file"):
        read_regular(path, 64)


def test_a_file_over_the_limit_is_refused_without_quoting_it(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_text("Zq9" * 100)
    with pytest.raises(FileRefused) as caught:
        read_regular(str(path), 64)
    assert caught.value.too_large
    assert "Zq9" not in str(caught.value)


def test_missing_and_binary_files_say_why(tmp_path: Path) -> None:
    with pytest.raises(FileRefused) as caught:
        read_regular(str(tmp_path / "absent"), 64)
    assert caught.value.missing
    assert str(caught.value) == "No such file or directory"
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfeZq9")
    with pytest.raises(FileRefused, match=r"^it is not UTF-8 text$"):
        read_regular(str(binary), 64)


def _entries(directory: Path) -> dict[str, Path]:
    """One entry of each kind a config directory may hold by mistake, made for real."""
    os.mkfifo(directory / "fifo.yml")
    (directory / "zero.yml").symlink_to("/dev/zero")
    (directory / "loop-a.yml").symlink_to("loop-b.yml")
    (directory / "loop-b.yml").symlink_to("loop-a.yml")
    (directory / "dangling.yml").symlink_to("gone.yml")
    (directory / "sub.yml").mkdir()
    (directory / "file.yml").write_text("x: 1\n")
    (directory / "link.yml").symlink_to("file.yml")
    return {path.name: path for path in directory.iterdir()}


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("fifo.yml", "it is a FIFO, not a regular file"),
        ("zero.yml", "it is a symbolic link to a character device, not a regular file"),
        ("loop-a.yml", "it is a symbolic link in a loop"),
        ("dangling.yml", "it is a symbolic link to 'gone.yml', which does not exist"),
        ("sub.yml", "it is a directory, not a regular file"),
        ("file.yml", None),
        ("link.yml", None),
    ],
)
def test_entry_kind_says_what_an_entry_is_without_opening_it(
    tmp_path: Path, name: str, kind: str | None
) -> None:
    """A FIFO, a device, a loop, a link to nothing, a directory: each named; files pass."""
    entries = _entries(tmp_path)
    assert entry_kind(str(entries[name])) == kind
