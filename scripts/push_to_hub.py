"""Upload a trained model folder to the Hugging Face Hub with a filled-in model card.

    python scripts/push_to_hub.py --model runs/demo --repo_id user/en-de-transformer --dry_run hub-folder

Installed as `vt-push-to-hub`; the logic lives in `vanilla_transformer.cli.push_to_hub_command`.
"""

import sys

from vanilla_transformer.cli import push_to_hub_command as main

if __name__ == "__main__":
    sys.exit(main())
