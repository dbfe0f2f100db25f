"""Upload a trained model folder to the Hugging Face Hub with a filled-in model card.

    python scripts/push_to_hub.py --model runs/demo --repo_id user/en-de-transformer --dry_run hub-folder

Installed as `vt-push-to-hub`; the logic lives in `vanilla_transformer.cli`. `main` is `push_to_hub_command`, which
returns what it made (for Python callers); run as a script, `push_to_hub_main` reports a user error as one line on
stderr and exit status 2.
"""

import sys

from vanilla_transformer.cli import push_to_hub_command as main
from vanilla_transformer.cli import push_to_hub_main

__all__ = ["main"]  # the command, for Python callers and tests

if __name__ == "__main__":
    sys.exit(push_to_hub_main())
