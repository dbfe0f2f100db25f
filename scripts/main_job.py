"""vt-main-job as a file, for a checkout (`bash scripts/main_job.sh` installs the package and runs it)."""

from vanilla_transformer.cli import main_job_main

if __name__ == "__main__":
    raise SystemExit(main_job_main())
