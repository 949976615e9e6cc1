"""The reference solutions of ``my_engine``: the learner's stubs (``my_engine/`` at the repository root)
filled in. The course's tests check them with :mod:`minipaged.course.my_engine`; they are never
copied into a learner's copy."""
