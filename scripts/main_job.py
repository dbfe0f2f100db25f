"""The main job: gettext corpus → tokenizer → small Transformer on the CPU → BLEU/chrF → examples.

    python scripts/main_job.py                          # everything, about 20 minutes
    python scripts/main_job.py --time_budget_minutes 5  # a quicker, weaker run

Installed as `vt-main-job`; the logic lives in `vanilla_transformer.cli.main_job_command`.
"""

from vanilla_transformer.cli import main_job_command as main

if __name__ == "__main__":
    main()
