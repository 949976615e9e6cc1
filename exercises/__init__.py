"""The notebooks' exercises: your files ``stageN_*.py``, one per notebook.

Check them with ``python -m exercises stageN`` (every stage: ``python -m exercises``); see
``exercises/README.md``. The checks live in ``tests/exercises/``, the reference solutions in
``tests/exercises/solutions/``.
"""
