"""The targets file of a fleet: what it accepts, what it refuses, and that no error
message ever quotes a URL, a password or the content of a secret file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exporter.config.settings import Settings
from exporter.config.targetsfile import MAX_TARGETS, load_targets
from exporter.errors import ConfigError

BASE = Settings(config="collectors", const_labels=(("env", "prod"),), tags=("base",))
SECRET = "s3cr3t-Pa55"


def _write(tmp_path: Path, text: str, name: str = "targets.yml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _problems(path: str, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_targets(path, BASE, environ or {})
    return str(caught.value)


def test_targets_take_the_process_settings_with_their_own_url_and_options(
    tmp_path: Path,
) -> None:
    path = _write(
        tmp_path,
        """
defaults:
  labels: {region: eu}
  auto_discovery: false
targets:
  - name: orders-primary
    url: postgresql://exporter@db1:5432/postgres
    labels: {cluster: orders, env: staging}
    tags: [primary, big]
    max_connections: 6
  - name: bouncer.1
    url: postgresql://pgbouncer@db1:6432/pgbouncer
    auto_discovery: true
    include_databases: app_*, billing
""",
    )
    declared = load_targets(path, BASE, {})
    assert declared.names() == ["orders-primary", "bouncer.1"]
    orders, bouncer = (t.settings for t in declared.targets)
    assert orders.target.dbname == "postgres"
    assert not orders.is_pgbouncer
    # --label's labels, then the defaults', then the target's; the target wins.
    assert orders.const_labels == (("env", "staging"), ("region", "eu"), ("cluster", "orders"))
    assert orders.tags == ("primary", "big")
    assert (orders.max_connections, orders.auto_discovery) == (6, False)
    assert bouncer.is_pgbouncer
    assert bouncer.effective_namespace() == "pgbouncer"
    assert bouncer.tags == ("base",)  # not given: the process's
    assert bouncer.auto_discovery is True
    assert bouncer.include_databases == ("app_*", "billing")
    assert declared.warnings == ()


def test_passwords_from_env_and_file_reach_libpq_and_are_masked(tmp_path: Path) -> None:
    secret_file = tmp_path / "password"
    secret_file.write_text(SECRET + "\n")
    path = _write(
        tmp_path,
        f"""
targets:
  - name: from-file
    url: postgresql://exporter@db1/postgres
    password_file: {secret_file}
  - name: from-env
    url_env: DB2_URL
    password_env: DB2_PASSWORD
  - name: in-url
    url: postgresql://exporter:{SECRET}@db3/postgres
""",
    )
    environ = {"DB2_URL": "postgresql://exporter@db2/postgres", "DB2_PASSWORD": SECRET}
    declared = load_targets(path, BASE, environ)
    for target in declared.targets:
        assert dict(target.settings.target.params)["password"] == SECRET
        assert SECRET not in target.settings.masked_url
        assert SECRET not in repr(target)
    assert declared.secret_files == (str(secret_file),)


def test_url_file_holds_the_whole_url(tmp_path: Path) -> None:
    url_file = tmp_path / "url"
    url_file.write_text(f"postgresql://exporter:{SECRET}@db9:5433/app\n")
    path = _write(tmp_path, f"targets:\n  - name: a\n    url_file: {url_file}\n")
    (target,) = load_targets(path, BASE, {}).targets
    params = dict(target.settings.target.params)
    assert (params["host"], params["port"], params["dbname"]) == ("db9", "5433", "app")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("targets: {a: 1}", "needs a list of targets under 'targets', got a mapping"),
        ("[]", "needs a list of targets under 'targets', got a list"),
        ("targets: []\nextra: 1", "extra: unknown top-level key"),
        ("targets:\n  - url: postgresql:///x", "targets[0].name: a name of 1-64"),
        ("targets:\n  - name: 'a b'\n    url: postgresql:///x", "targets[0].name:"),
        ("targets:\n  - name: ../etc\n    url: postgresql:///x", "targets[0].name:"),
        ("targets:\n  - name: a", "exactly one of url, url_env, url_file names the target"),
        (
            "targets:\n  - name: a\n    url: postgresql:///x\n    url_env: X",
            "url and url_env are given",
        ),
        (
            "targets:\n  - name: a\n    url: postgresql:///x\n  - name: a\n    url: postgresql:///y",
            "targets[1].name: 'a' is already the name of targets[0]",
        ),
        (
            "targets:\n  - name: a\n    url: postgresql:///x\n    tag: [x]",
            "targets[0](a).tag: unknown field; did you mean 'tags'?",
        ),
        (
            "targets:\n  - name: a\n    url: postgresql:///x\n    max_connections: 1",
            "targets[0](a).max_connections: must be at least 2, the health probe's connection "
            "and one database's (a whole number from 2 to 2147483647), got 1",
        ),
        (
            "targets:\n  - name: a\n    url: postgresql:///x\n    parallel_databases: 1"
            + "9" * 400,
            "targets[0](a).parallel_databases: must be at least 1 (a whole number from 1 to "
            "2147483647), got ",
        ),
        (
            "targets:\n  - name: a\n    url: postgresql:///x\n    server_time_budget: -5",
            "targets[0](a).server_time_budget: must be milliseconds of server time a second, "
            "0 for none (a number from 0 to 1e+06), got -5",
        ),
        (
            "targets:\n  - name: a\n    url: postgresql:///x\n    server_time_budget: '50'",
            "targets[0](a).server_time_budget: must be milliseconds",
        ),
        (
            "targets:\n  - name: a\n    url: postgresql:///x\n    server_time_budget: .nan",
            "targets[0](a).server_time_budget: must be milliseconds",
        ),
        (
            "targets:\n  - name: a\n    url: postgresql:///x\n    server_time_budget: 1"
            + "0" * 400,
            "targets[0](a).server_time_budget: must be milliseconds",
        ),
        (
            "targets:\n  - name: a\n    url: postgresql:///x\n    labels: {__x: y}",
            "targets[0](a).labels.__x: not a valid label name",
        ),
        (
            "targets:\n  - name: a\n    url: postgresql:///x\n    auto_discovery: 'yes'",
            "targets[0](a).auto_discovery: must be true or false",
        ),
        ("defaults: {url: postgresql:///x}\ntargets: []", "defaults.url: not an option"),
        ("targets:\n  - name: a\n    url_env: NOT_SET", "variable 'NOT_SET' (the target URL)"),
        ('targets:\n  - name: a\n    url: "host=a port=\'1"', "libpq cannot read the target URL"),
    ],
)
def test_problems_are_located_and_explained(tmp_path: Path, text: str, expected: str) -> None:
    path = _write(tmp_path, text)
    message = _problems(path)
    assert expected in message
    assert message.startswith(f"{path}: the targets file has problems")


def test_a_server_time_budget_is_set_per_target_or_for_all(tmp_path: Path) -> None:
    """issue 31: ``server_time_budget`` in the defaults applies to every target, a target's
    own replaces it, and a target with neither keeps the process's (``BASE``'s)."""
    path = _write(
        tmp_path,
        "defaults: {server_time_budget: 50}\n"
        "targets:\n  - name: a\n    url: postgresql:///x\n"
        "  - name: b\n    url: postgresql:///y\n    server_time_budget: 0.5\n",
    )
    a, b = (t.settings.server_time_budget for t in load_targets(path, BASE, {}).targets)
    assert (a, b) == (50.0, 0.5)
    plain = _write(tmp_path, "targets:\n  - name: c\n    url: postgresql:///z\n", "plain.yml")
    (only,) = load_targets(plain, BASE, {}).targets
    assert only.settings.server_time_budget == BASE.server_time_budget


def test_every_problem_is_listed_at_once(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "targets:\n  - name: a\n  - name: b\n    url: postgresql:///x\n    parallel_databases: 0",
    )
    message = _problems(path)
    assert "targets[0](a)" in message
    assert "targets[1](b).parallel_databases" in message


def test_no_message_quotes_a_secret(tmp_path: Path) -> None:
    """A URL libpq cannot read, a password file of several lines and a password in a
    variable with a malformed URL beside it: the messages name places, never values."""
    bad_file = tmp_path / "two-lines"
    bad_file.write_text(f"{SECRET}\n{SECRET}\n")
    path = _write(
        tmp_path,
        f"""
targets:
  - name: a
    url: "postgresql://u:{SECRET}@h:notaport/db?x"
  - name: b
    url: postgresql://u@h/db
    password_file: {bad_file}
  - name: c
    url: "host=h password='{SECRET}"
""",
    )
    message = _problems(path, {"P": SECRET})
    assert "targets[0](a).url" in message
    assert "targets[2](c).url" in message
    assert "targets[1](b).password_file" in message
    assert "on one line" in message
    assert SECRET not in message


def test_missing_and_unreadable_files_are_named(tmp_path: Path) -> None:
    assert "no such file or directory; check --targets.file" in _problems(
        str(tmp_path / "absent.yml")
    )
    path = _write(tmp_path, "targets:\n  - name: a\n    url: x\n    password_file: /nonexistent/p")
    message = _problems(path)
    assert "targets[0](a).password_file: cannot read '/nonexistent/p' (the password)" in message


def test_an_empty_fleet_is_a_warning_not_an_error(tmp_path: Path) -> None:
    declared = load_targets(_write(tmp_path, "targets: []"), BASE, {})
    assert declared.targets == ()
    assert any("no target is declared" in warning for warning in declared.warnings)


def test_too_many_targets_are_refused_before_any_is_read(tmp_path: Path) -> None:
    entries = "".join(f"  - name: t{i}\n    url: postgresql:///x\n" for i in range(MAX_TARGETS + 1))
    message = _problems(_write(tmp_path, "targets:\n" + entries))
    assert f"at most {MAX_TARGETS} may be declared" in message


def test_the_most_targets_load_with_six_labels_each(tmp_path: Path) -> None:
    """10 000 targets with 6 labels each (190 000 YAML values) once hit the collector
    file's 100 000-value limit: the documented maximum holds with options (issue 25)."""
    labels = "{{cluster: c{0}, region: eu, zone: eu-1a, role: primary, team: t, env: prod}}"
    entries = "".join(
        f"  - name: t{i}\n    url: postgresql://h{i}/db\n    labels: {labels.format(i)}\n"
        for i in range(MAX_TARGETS)
    )
    declared = load_targets(_write(tmp_path, "targets:\n" + entries), BASE, {})
    assert len(declared.targets) == MAX_TARGETS
    assert dict(declared.targets[-1].settings.const_labels)["cluster"] == f"c{MAX_TARGETS - 1}"


def test_yaml_limits_of_the_collector_loader_apply(tmp_path: Path) -> None:
    """An alias bomb is refused as in a collector file, quickly and without memory blow-up."""
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(9)
    )
    message = _problems(_write(tmp_path, bomb + "targets: *j\n"))
    assert "alias" in message or "values" in message


def test_a_targets_own_password_replaces_the_defaults(tmp_path: Path) -> None:
    """A target's own password source, or a password in its own URL, wins over the
    defaults' password source; two of the target's own are refused."""
    default_file = tmp_path / "default-password"
    default_file.write_text("from-defaults\n")
    path = _write(
        tmp_path,
        f"""
defaults:
  password_file: {default_file}
targets:
  - name: default
    url: postgresql://u@h/db
  - name: own-env
    url: postgresql://u@h/db
    password_env: OWN
  - name: own-url
    url: postgresql://u:from-url@h/db
""",
    )
    declared = load_targets(path, BASE, {"OWN": "from-env"})
    passwords = {t.name: dict(t.settings.target.params)["password"] for t in declared.targets}
    assert passwords == {"default": "from-defaults", "own-env": "from-env", "own-url": "from-url"}


def test_two_passwords_of_a_target_are_refused(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        f"targets:\n  - name: a\n    url: postgresql://u:{SECRET}@h/db\n    password_env: P\n",
    )
    message = _problems(path, {"P": "other"})
    assert "targets[0](a): the URL holds a password and password_env or password_file" in message
    assert SECRET not in message


def test_a_fifo_or_device_as_secret_file_is_refused_without_blocking(tmp_path: Path) -> None:
    """A password or URL file that is a FIFO or /dev/zero: refused at once (issue 25)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    path = _write(
        tmp_path,
        f"targets:\n  - name: a\n    url: postgresql://u@h/db\n    password_file: {fifo}\n"
        "  - name: b\n    url_file: /dev/zero\n",
    )
    message = _problems(path)
    assert "targets[0](a).password_file: cannot read" in message
    assert "it is a FIFO, not a regular file" in message
    assert "targets[1](b).url_file: cannot read '/dev/zero' (the target URL): it is a " in message


@pytest.mark.parametrize("field", ["url", "url_env", "url_file"])
def test_a_url_libpq_misreads_is_refused_per_target(tmp_path: Path, field: str) -> None:
    """An unencoded '/' in a password: refused where it is given, quoting none of it,
    even when a password file would be added to it (issue 25)."""
    url = f"postgresql://u:Ab3/{SECRET}@host/db"
    secret_file = tmp_path / "url"
    secret_file.write_text(url)
    password = tmp_path / "password"
    password.write_text("other")
    value = {"url": f'"{url}"', "url_env": "URL", "url_file": str(secret_file)}[field]
    path = _write(
        tmp_path,
        f"defaults:\n  password_file: {password}\n"
        f"targets:\n  - name: a\n    {field}: {value}\n  - name: b\n    url: postgresql:///x\n",
    )
    message = _problems(path, {"URL": url})
    assert f"targets[0](a).{field}: libpq reads the target URL with a port that is not" in message
    assert "/ as %2F" in message
    assert "Ab3" not in message
    assert SECRET not in message
    assert "targets[1]" not in message


URL = f"postgresql://monitor:{SECRET}@db1/postgres"


def test_a_wrong_file_is_not_quoted(tmp_path: Path) -> None:
    """A URL file given as --targets.file: its type and the fix, never its line (issue 25)."""
    message = _problems(_write(tmp_path, f"{URL}\n"))
    assert "the file needs a list of targets under 'targets', got a string; check" in message
    assert "--targets.file" in message
    assert "db1" not in message
    assert SECRET not in message


@pytest.mark.parametrize(
    ("entry", "where"),
    [
        (f'  - "{URL}"', "targets[0]"),
        (f'  - name: "{URL}"', "targets[0].name"),
        (f'  - name: a\n    url: postgresql:///x\n    namespace: "{URL}"', "(a).namespace"),
        (f'  - name: a\n    url: postgresql:///x\n    password_env: "{URL}"', "(a).password_env"),
        (f'  - name: a\n    url: postgresql:///x\n    password_file: "{URL}"', "(a).password_file"),
        (f'  - name: a\n    url: postgresql:///x\n    "{URL}": 1', "(a).postgresql://monitor:"),
        (f'  - name: a\n    url: postgresql:///x\n    labels: {{"{URL}": x}}', "(a).labels."),
        (f'  - name: a\n    url: postgresql:///x\n    tags: {{"{URL}": x}}', "(a).tags"),
        (f'  - name: a\n    url_file: {{"{URL}": x}}', "(a).url_file"),
    ],
)
def test_a_url_in_any_other_field_is_masked(tmp_path: Path, entry: str, where: str) -> None:
    """A URL where a name, path, variable or key belongs: the password is never quoted."""
    message = _problems(_write(tmp_path, f"targets:\n{entry}\n"))
    assert where in message
    assert SECRET not in message


def test_defaults_given_as_a_url_are_not_quoted(tmp_path: Path) -> None:
    message = _problems(_write(tmp_path, f'defaults: "{URL}"\ntargets: []\n'))
    assert "defaults: must be a mapping of target options, got a string" in message
    assert "db1" not in message
