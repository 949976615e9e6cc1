"""Exercises of the notebooks: your scratch files (``stageN_*.py``) and reference ``solutions/``.

Check them with ``pytest tests/exercises -k stageN`` (see ``exercises/README.md``).
"""
