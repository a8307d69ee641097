"""What the exporter tells about itself: ``/explain``, ``/stat``, its own metrics and
the process's. Reads what the passes left; runs nothing on the database but
``--explain``'s preflight.

- ``explain``: what would run, and why not the rest.
- ``stat``: per-collector statistics.
- ``selfmetrics``: the exporter's own metric families.
- ``process``: the process, interpreter and GC families, from ``/proc``.
- ``heap``: glibc's free heap given back to the system after an answer.
- ``implementations``: which libraries run their compiled code paths, which fell back.

May import: :mod:`exporter.collect` and every layer below it.
"""
