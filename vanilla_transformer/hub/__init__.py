"""Sharing on the Hugging Face Hub: the folder users download, its model card, and the upload.

The uploaded folder loads for users who never install this package: it carries the modeling/config source, an
`auto_map` for `AutoConfig`, `AutoModel` and `AutoModelForSeq2SeqLM`, and a `custom_pipelines` entry that brings
back `pipeline("translation", ...)` (removed from transformers 5) with `trust_remote_code=True`.
"""

import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

from transformers.utils import logging

from ..cli_parsers import check_model_folder
from ..model.configuration_vanilla_transformer import PRESETS
from ..model.modeling_vanilla_transformer import AUTO_MAP
from ..model.pipeline_vanilla_transformer import CUSTOM_PIPELINES

logger = logging.get_logger(__name__)

MODEL_DIR = Path(__file__).resolve().parents[1] / "model"
REMOTE_CODE_ENTRY_POINTS = ("modeling_vanilla_transformer.py", "pipeline_vanilla_transformer.py")
_RELATIVE_IMPORT = re.compile(r"^\s*from \.(\w+) import", re.MULTILINE)


def remote_code_files(model_dir: Path = MODEL_DIR) -> tuple[str, ...]:
    """The files `trust_remote_code` needs: the entry points and, transitively, every module they import with a
    single-dot relative import (transformers copies exactly these next to the weights)."""
    found: list[str] = []
    pending = list(REMOTE_CODE_ENTRY_POINTS)
    while pending:
        name = pending.pop(0)
        if name in found:
            continue
        source = model_dir / name
        if not source.is_file():
            raise FileNotFoundError(f"Remote-code module {name} is imported but missing from {model_dir}.")
        found.append(name)
        pending.extend(f"{module}.py" for module in _RELATIVE_IMPORT.findall(source.read_text(encoding="utf-8")))
    return tuple(sorted(found))


CODE_FILES = remote_code_files()
# Files of a training output folder that do not belong on the Hub.
SKIPPED = re.compile(r"^(checkpoint-\d+|runs|optimizer\.pt|scheduler\.pt|rng_state.*\.pth|training_args\.bin)$")
METRIC_FILES = ("all_results.json", "test_results.json", "predict_results.json", "eval_results.json")
TRAINING_INFO = "training_info.json"
# What `vt-push-to-hub --format` uploads: this package's model with its source, or the native MarianMT export.
HUB_FORMATS = ("vanilla_transformer", "marian")
# The model-card templates, package data beside this module (the repository's top-level model_card.md links here).
MODEL_CARD_TEMPLATES = {
    "vanilla_transformer": Path(__file__).with_name("model_card.md"),
    "marian": Path(__file__).with_name("model_card_marian.md"),
}


def check_repo_id(repo_id: str) -> str:
    """`namespace/name` with Hub-legal characters; raises `ValueError` before anything is sent."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise ValueError(f"Invalid --repo_id {repo_id!r}: {error}") from None
    if "/" not in repo_id:
        raise ValueError(f"Invalid --repo_id {repo_id!r}: expected 'user-or-org/model-name'.")
    return repo_id


def read_eval_results(model_dir: str | Path) -> dict[str, Any]:
    """BLEU and chrF that the training run measured, from the metric files the Trainer writes.

    Test-split figures win over validation ones. Returns {} when the folder holds none: the card then says the model
    was not evaluated rather than showing numbers nobody measured.
    """
    model_dir = Path(model_dir)
    metrics: dict[str, Any] = {}
    for name in METRIC_FILES:
        if (model_dir / name).exists():
            for key, value in json.loads((model_dir / name).read_text()).items():
                metrics.setdefault(key, value)
    for split, prefix in (("test", "test_"), ("test", "predict_"), ("validation", "eval_")):
        if f"{prefix}bleu" in metrics:
            return {
                "split": split,
                "bleu": round(float(metrics[f"{prefix}bleu"]), 2),
                "chrf": round(float(metrics[f"{prefix}chrf"]), 2) if f"{prefix}chrf" in metrics else None,
            }
    return {}


def count_saved_parameters(model_dir: str | Path) -> int:
    """Parameters stored in the checkpoint (the shared embedding counted once), read from the safetensors headers."""
    from safetensors import safe_open

    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    shards = (
        sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    )
    total = 0
    for shard in shards:
        with safe_open(model_dir / shard, "np") as f:
            for key in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                shape = f.get_slice(key).get_shape()
                total += int(math.prod(shape))
    return total


def _preset_name(config: dict[str, Any]) -> str | None:
    for name, fields in PRESETS.items():
        if all(config.get(key) == value for key, value in fields.items()):
            return name
    return None


def card_context(
    model_dir: str | Path,
    repo_id: str,
    source_lang: str | None = None,
    target_lang: str | None = None,
    dataset: str | None = None,
    license: str = "apache-2.0",
    onnx: bool = False,
) -> dict[str, Any]:
    """Everything the model card says, read from the model folder (config, metrics, training_info.json)."""
    model_dir = Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    info = json.loads((model_dir / TRAINING_INFO).read_text()) if (model_dir / TRAINING_INFO).exists() else {}
    source_lang = source_lang or info.get("source_lang")
    target_lang = target_lang or info.get("target_lang")
    dataset = dataset or info.get("dataset")
    results = read_eval_results(model_dir)
    parameters = count_saved_parameters(model_dir)
    preset = _preset_name(config)
    return {
        "repo_id": repo_id,
        "model_name": repo_id.split("/")[-1],
        "source_lang": source_lang or "unknown",
        "target_lang": target_lang or "unknown",
        "languages": [lang for lang in (source_lang, target_lang) if lang],
        "dataset": dataset or "unknown",
        "license": license,
        "preset": preset or "custom",
        "parameters": f"{parameters:,}",
        "config": config,
        "training": info,
        "results": results,
        "onnx": onnx,
    }


def _yaml_front_matter(context: dict[str, Any]) -> str:
    """YAML metadata the Hub reads, with a model-index only for figures the training run measured."""
    lines = ["---", "library_name: transformers", "pipeline_tag: translation", f"license: {context['license']}"]
    if context["languages"]:
        lines += ["language:"] + [f"  - {lang}" for lang in context["languages"]]
    lines += ["tags:", "  - translation", "  - vanilla-transformer", "  - attention-is-all-you-need"]
    if context.get("hub_format") == "marian":
        lines.append("  - marian")
    if context["dataset"] != "unknown":
        lines += ["datasets:", f"  - {context['dataset']}"]
    results = context["results"]
    if results:
        pair = f"{context['source_lang']}-{context['target_lang']}"
        lines += [
            "model-index:",
            f"  - name: {context['model_name']}",
            "    results:",
            "      - task:",
            "          type: translation",
            f"          name: Translation {pair}",
            "        dataset:",
            f"          name: {context['dataset']}",
            f"          type: {context['dataset']}",
            f"          split: {results['split']}",
            "        metrics:",
            "          - type: bleu",
            f"            value: {results['bleu']}",
            "            name: sacreBLEU",
        ]
        if results.get("chrf") is not None:
            lines += ["          - type: chrf", f"            value: {results['chrf']}", "            name: chrF"]
    return "\n".join(lines + ["---"])


def _evaluation_text(context: dict[str, Any]) -> str:
    results = context["results"]
    if not results:
        return "This model was not evaluated by its training run; no scores are reported."
    chrf = f", chrF {results['chrf']}" if results.get("chrf") is not None else ""
    return (
        f"sacreBLEU {results['bleu']}{chrf} on the {results['split']} split of {context['dataset']}, "
        "measured by the training run (beam search as in the generation config)."
    )


def _training_text(context: dict[str, Any]) -> str:
    info = context["training"]
    if not info:
        return "No training record (training_info.json) was saved with this model."
    skipped = ("source_lang", "target_lang")
    # A setting that was off is recorded as null: the card says "none" rather than Python's "None".
    return "\n".join(
        f"- {key}: {'none' if value is None else value}" for key, value in info.items() if key not in skipped
    )


def _dropout_text(config: dict[str, Any]) -> str:
    """P_drop (§5.4), and the two dropouts the paper does not have where they are on."""
    text = f"{config['dropout']} on sub-layer outputs and embedding sums (§5.4)"
    extra = [
        f"{config[key]} {where}"
        for key, where in (("attention_dropout", "on attention weights"), ("activation_dropout", "after the ReLU"))
        if config.get(key)
    ]
    return text + (f"; {', '.join(extra)} (not in the paper)" if extra else "")


def render_model_card(template: str, context: dict[str, Any]) -> str:
    """Fill `{{ name }}` placeholders of the model card template; `{{ metadata }}` is the YAML front matter."""
    config = context["config"]
    values = {
        "metadata": _yaml_front_matter(context),
        "evaluation": _evaluation_text(context),
        "training": _training_text(context),
        "d_model": config["d_model"],
        "encoder_layers": config["encoder_layers"],
        "decoder_layers": config["decoder_layers"],
        "heads": config["encoder_attention_heads"],
        "ffn_dim": config["encoder_ffn_dim"],
        "vocab_size": config["vocab_size"],
        "dropout": _dropout_text(config),
        "normalization": "pre-LN (a deviation from the paper)" if config.get("normalize_before") else "post-LN",
        "onnx_note": "The ONNX export is in `onnx/`." if context["onnx"] else "No ONNX export was uploaded.",
        **{k: v for k, v in context.items() if isinstance(v, str)},
    }

    def fill(match: re.Match) -> str:
        key = match.group(1)
        if key not in values:
            raise ValueError(f"The model card template uses an unknown placeholder {{{{ {key} }}}}.")
        return str(values[key])

    return re.sub(r"\{\{\s*(\w+)\s*\}\}", fill, template)


def prepare_hub_folder(
    model_dir: str | Path,
    output_dir: str | Path,
    repo_id: str,
    template_path: str | Path,
    onnx_dir: str | Path | None = None,
    hub_format: str = "vanilla_transformer",
    **card_kwargs: Any,
) -> list[str]:
    """Write exactly the folder that would be uploaded; returns its files (relative paths, sorted).

    `hub_format` "vanilla_transformer" uploads the model with its source (loaded with `trust_remote_code=True`);
    "marian" uploads the native MarianMT folder of `marian_export.save_marian`, which transformers loads without
    remote code (docs/marian.md).
    """
    if hub_format not in HUB_FORMATS:
        raise ValueError(f"Unknown hub format {hub_format!r}; choose one of {', '.join(HUB_FORMATS)}.")
    model_dir = check_model_folder(model_dir, complete=True)
    check_repo_id(repo_id)
    template_path = Path(template_path)
    if not template_path.exists():
        raise FileNotFoundError(f"Model card template {str(template_path)!r} does not exist.")
    if onnx_dir is not None and not (Path(onnx_dir) / "encoder_model.onnx").exists():
        raise FileNotFoundError(f"--onnx {str(onnx_dir)!r} holds no encoder_model.onnx: export the model first.")
    output_dir = Path(output_dir)
    if output_dir.exists() and any(output_dir.iterdir()):
        raise FileExistsError(f"Output folder {str(output_dir)!r} is not empty.")
    output_dir.mkdir(parents=True, exist_ok=True)

    if hub_format == "marian":
        _write_marian_folder(model_dir, output_dir)
    else:
        for path in sorted(model_dir.iterdir()):
            if path.is_file() and not SKIPPED.match(path.name) and path.name not in CODE_FILES:
                shutil.copy2(path, output_dir / path.name)
        for name in CODE_FILES:  # the package's own source, so the code matches the installed version
            shutil.copy2(MODEL_DIR / name, output_dir / name)
        config = json.loads((output_dir / "config.json").read_text())
        config["auto_map"] = {**config.get("auto_map", {}), **AUTO_MAP}
        config["custom_pipelines"] = CUSTOM_PIPELINES
        (output_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if onnx_dir is not None:
        shutil.copytree(onnx_dir, output_dir / "onnx")

    context = card_context(model_dir, repo_id, onnx=onnx_dir is not None, **card_kwargs)
    if hub_format == "marian":
        context.update(_marian_card_context(output_dir))
    (output_dir / "README.md").write_text(render_model_card(template_path.read_text(), context))
    return sorted(str(p.relative_to(output_dir)) for p in output_dir.rglob("*") if p.is_file())


def _write_marian_folder(model_dir: Path, output_dir: Path) -> None:
    """The native MarianMT folder (`marian_export.save_marian`) and the run's metric and training records."""
    from ..marian.exporter import save_marian

    save_marian(model_dir, output_dir)
    for name in (*METRIC_FILES, TRAINING_INFO):
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, output_dir / name)


def _marian_card_context(marian_dir: Path) -> dict[str, str]:
    """What the MarianMT card says beyond the common card: the position limit and whether CTranslate2's own converter
    reads the folder exactly (`marian_export.ctranslate2_converter_issues`)."""
    from ..marian.exporter import ctranslate2_converter_issues

    issues = ctranslate2_converter_issues(marian_dir)
    if issues:
        ctranslate2_note = (
            "CTranslate2's `ct2-transformers-converter` does not convert this folder exactly: it assumes OPUS-MT's "
            f"conventions, and here {'; '.join(issues)}. Convert the original model with `vt-export-ctranslate2` "
            "from the vanilla-transformer package instead, which is exact."
        )
    else:
        ctranslate2_note = (
            "The folder follows OPUS-MT's conventions, which CTranslate2's converter assumes, so it converts exactly: "
            "`ct2-transformers-converter --model DOWNLOADED_FOLDER --output_dir ct2`."
        )
    config = json.loads((marian_dir / "config.json").read_text())
    return {
        "hub_format": "marian",
        "max_positions": str(config["max_position_embeddings"]),
        "ctranslate2_note": ctranslate2_note,
    }


def resolve_token(token: str | None = None) -> str:
    """The token from the argument, `HF_TOKEN`, or the login cache; never printed or logged."""
    from huggingface_hub import get_token

    token = token or get_token()
    if not token:
        raise ValueError(
            "No Hugging Face token found: set HF_TOKEN or run `hf auth login` (a write token is needed to upload)."
        )
    return token


def push_to_hub(
    model_dir: str | Path,
    repo_id: str,
    template_path: str | Path,
    onnx_dir: str | Path | None = None,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    token: str | None = None,
    api: Any = None,
    **card_kwargs: Any,
) -> str:
    """Create the repository (if needed) and upload the prepared folder; returns the commit URL."""
    import tempfile

    from huggingface_hub import HfApi

    token = resolve_token(token)  # before anything is written or sent
    api = api or HfApi()
    with tempfile.TemporaryDirectory() as staging:
        files = prepare_hub_folder(model_dir, staging, repo_id, template_path, onnx_dir, **card_kwargs)
        logger.info(f"Uploading {len(files)} files to {repo_id}")
        api.create_repo(repo_id, token=token, private=private, exist_ok=True)
        if revision is not None:
            api.create_branch(repo_id, branch=revision, token=token, exist_ok=True)
        commit = api.upload_folder(
            repo_id=repo_id,
            folder_path=staging,
            commit_message=commit_message or "Upload vanilla-transformer model",
            revision=revision,
            token=token,
        )
    return str(getattr(commit, "commit_url", commit))
