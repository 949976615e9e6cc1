"""Attention: the torch reference (:mod:`.reference`) and the cache backends (:mod:`.backend`)."""
