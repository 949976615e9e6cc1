"""The commands of ``python -m minipaged`` that live in modules of their own: :mod:`.demo` (real
chats through the paged engine, then the copy model's check) and :mod:`.chat` (a multi-turn chat
in the terminal, streamed through the step API). :mod:`minipaged.__main__` parses the command
line and imports each command only when it runs."""
