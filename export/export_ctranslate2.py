"""vt-export-ctranslate2 as a file, for a checkout: `python export/export_ctranslate2.py --help`."""

from vanilla_transformer.export.cli import export_ctranslate2_main

if __name__ == "__main__":
    raise SystemExit(export_ctranslate2_main())
