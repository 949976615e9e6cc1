"""The embedded tiny model: its task (:mod:`.task`), its training (:mod:`.train`) and its
weights (``assets/tiny-copy``)."""
