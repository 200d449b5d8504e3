"""The store: the only code in weft_django that talks SQL.

Everything that runs a statement (a cursor, ``execute``, ``raw``, ``RawSQL``), reads the database
clock, sends or listens for NOTIFY, prepares statements or draws an epoch lives in this package.
The database differences live in one place, ``backend.py``: one class per vendor behind one
interface. Callers outside this package never branch on the vendor.

One module per group of tables:

- ``claims``: every write and lock of a claim row (the only writer of ``WorkflowClaim``);
- ``commit``: the fenced commit, the one transaction boundary for workflow-scoped writes;
- ``runs``: runs and steps (creating runs, writing and loading histories);
- ``mailbox``: signals and updates;
- ``timers``, ``schedules``, ``engines``: their tables;
- ``clock``, ``notify``, ``prepared``, ``epochs``, ``sessions``: the database services.

See docs/architecture.md.
"""
