"""Entry point for ``python -m exporter``."""

import sys

# Nothing before it: exporter.cli imports little, and main() takes the signals first.
from exporter.cli import main

sys.exit(main())
