"""What a scrape costs the installed exporter, beside the venv's in the same run (issue 37).

The packages once shipped pure-Python wheels and cost 1.6x the venv's CPU per uncached
scrape; see :mod:`tests.packaging.cost` for how the two are compared.
"""

from __future__ import annotations

import sys

from rigs.localpg import LocalCluster
from tests.packaging.conftest import REPO
from tests.packaging.cost import LIMIT, cpu_ratio, serving


def test_installed_scrape_cpu_is_within_115_percent_of_the_venv(
    installed: None, cluster: LocalCluster
) -> None:
    """Uncached, the installed exporter's CPU per scrape is at most 1.15x the venv's."""
    url = cluster.dsn()
    installed_command = ["/usr/bin/pg_exporter", "--config", "/etc/pg_exporter"]
    venv_command = [sys.executable, "-m", "exporter", "--config", str(REPO / "collectors")]
    with serving(installed_command, url) as mine, serving(venv_command, url) as theirs:
        ratio, per_scrape = cpu_ratio(mine, theirs)
    print(f"CPU per uncached scrape, ms, installed / venv: {per_scrape}; {ratio:.2f}")
    assert ratio <= LIMIT, per_scrape
