"""The data model: frozen dataclasses with one ``to_json`` / ``from_json`` pair each.

Pure values: nothing here starts a process, reads a file or imports an
optional package.  ``scan`` (the import tree and its culprits), ``replay``
(fork replays), ``diff`` (what a fix changed), ``sweep``, ``bisect`` and ``run`` (a watched command).
"""
