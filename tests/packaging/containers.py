"""Running the OCI image under podman in tests: how podman works here, and one container.

Podman is Debian's. In a sandbox it may refuse the defaults (ulimits above what the
sandbox grants, a hybrid cgroup layout crun rejects): the ``podman`` fixture of
``conftest.py`` tries :data:`WAYS` in order and every test uses the first that works.
"""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from rigs.localpg import free_port

UID = 9630  # the image's fixed prometheus user
# A private mount namespace without the cgroup v2 mount: crun then sees plain cgroup v1.
NO_CGROUP2 = (
    'for m in $(awk \'$9 == "cgroup2" {print $5}\' /proc/self/mountinfo); do umount -l "$m"; done; '
    'exec podman "$@"'
)


@dataclass(frozen=True, slots=True)
class Podman:
    """How podman runs containers on this machine."""

    name: str
    prefix: tuple[str, ...]  # the podman command, perhaps in a private mount namespace
    run_flags: tuple[str, ...]

    def run_argv(self, *args: str) -> list[str]:
        """``podman run`` with this machine's flags, then ``args``."""
        return [*self.prefix, "run", "--rm", *self.run_flags, *args]


def ways() -> list[Podman]:
    """Ways to run podman, from the plainest to the most adapted to a sandbox."""
    ulimits = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")
    isolated = ("unshare", "-m", "sh", "-c", NO_CGROUP2, "podman")
    return [
        Podman("defaults", ("podman",), ()),
        Podman("ulimits at or below the current ones", ("podman",), ulimits),
        Podman(
            "private mount namespace without cgroup2, --cgroups=disabled, low ulimits",
            isolated, (*ulimits, "--cgroups=disabled"),
        ),
    ]  # fmt: skip


@dataclass
class Running:
    """One container of the exporter, started in the foreground."""

    process: subprocess.Popen[str]
    name: str
    port: int
    started: float

    def get(self, path: str) -> tuple[int, str]:
        """Status and body of GET ``path``; (0, error) when nothing answers."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()
        except (urllib.error.URLError, OSError) as error:
            return 0, str(error)

    def wait_for(self, path: str, deadline: float = 60) -> float:
        """Seconds from start until ``path`` answered 200."""
        end = time.monotonic() + deadline
        while time.monotonic() < end and self.process.poll() is None:
            if self.get(path)[0] == 200:
                return time.monotonic() - self.started
            time.sleep(0.05)  # polling the port with a deadline
        raise AssertionError(f"{path} never answered 200: {self.output()}")

    def stop(self) -> tuple[int, float]:
        """SIGTERM (podman passes it on); the exit code and seconds it took."""
        began = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(60)
        return code, time.monotonic() - began

    def output(self) -> str:
        """What the container wrote (after it ended)."""
        if self.process.poll() is None:
            return "(still running)"
        out, err = self.process.communicate()
        return f"stdout:\n{out}\nstderr:\n{err}"


def start(podman: Podman, image: str, env: dict[str, str], *args: str) -> Running:
    """The image, read-only, on the host network, with ``env`` and the exporter's ``args``
    (a ``--web.listen-address`` on a free loopback port is added)."""
    port, name = free_port(), f"pgx-test-{free_port()}"
    env_flags = [word for key, value in env.items() for word in ("--env", f"{key}={value}")]
    argv = podman.run_argv(
        "--name", name, "--network=host", "--read-only", "--read-only-tmpfs=false",
        *env_flags, image, *args, f"--web.listen-address=127.0.0.1:{port}",
    )  # fmt: skip
    process = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return Running(process, name, port, time.monotonic())
