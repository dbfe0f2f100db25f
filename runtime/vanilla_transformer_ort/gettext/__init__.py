"""gettext catalogs: reading and writing `.po`/`.pot` files, plural rules, and `vt-translate-po`, which pre-translates
a catalog with every placeholder kept (docs/localization.md). The placeholder protection itself
(`placeholders.py`, `protected_translation.py`) is the runtime's, shared with the server."""
