"""vt-export-marian as a file, for a checkout: `python export/export_marian.py --help`."""

from vanilla_transformer.marian.cli import export_marian_main

if __name__ == "__main__":
    raise SystemExit(export_marian_main())
