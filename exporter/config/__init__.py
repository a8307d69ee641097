"""What the operator asked for: flags, environment, collector files and targets file,
read and validated into frozen objects. No database, no HTTP, no event loop.

- ``flags``: the flag table and the command-line scanner.
- ``commandline``: command line and environment into :class:`settings.Settings`.
- ``settings``: how the exporter runs, one frozen object.
- ``rules``: each rule a setting's value must meet, written once for flags,
  environment and targets file.
- ``problems``: a file's problems, every one at its place.
- ``files``: the small files an operator names (secrets, configs, certificates).
- ``yamlfiles``: an operator's YAML file, read within bounds.
- ``loading``: collector files into :class:`definitions.Definitions`.
- ``validation``: one collector branch into a :class:`definitions.Collector`.
- ``definitions``: what collectors exist, as frozen objects.
- ``columns``: a branch's ``metrics`` list into columns.
- ``top``: a branch's ``top`` mapping (rank the rows, name the busiest keys).
- ``sqltext``: where a collector's SQL statements end, as PostgreSQL's lexer says.
- ``target``: the target URL as libpq reads it.
- ``targetsfile``: a fleet's targets file.
- ``discovery``: which databases auto-discovery scrapes.
- ``dryrun``: ``--dry-run``, the definitions printed back.
- ``logs``: log lines as logfmt or JSON, secrets scrubbed.

May import: :mod:`exporter.errors` and the package itself (its version).
"""
