"""The health probe behind the routing endpoints: a connection of its own, asked at a
pace that quickens while the target may be changing role.

- ``probe``: the health probe and the snapshot the handlers read.
- ``pace``: how often it asks.
- ``probeslots``: a fleet's ceilings on probes.

May import: :mod:`exporter.pg`, :mod:`exporter.config`, :mod:`exporter.errors`.
"""
