"""A saved folder loads with trust_remote_code=True in a fresh interpreter that cannot import the package."""

import json
import re
import shutil
import subprocess
import sys
import textwrap

import torch
from transformers import AutoConfig, AutoModelForSeq2SeqLM

from vanilla_transformer.hub import CODE_FILES, MODEL_DIR, remote_code_files

from .conftest import make_model, padded_batch

FRESH_PROCESS = textwrap.dedent(
    """
    import json, sys
    sys.modules["vanilla_transformer"] = None  # as on a Hub user's machine: the package is not installed
    try:
        import vanilla_transformer
        sys.exit("the package must not be importable here")
    except ImportError:
        pass
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

    folder, data = sys.argv[1], json.load(open(sys.argv[2]))
    src, mask = torch.tensor(data["src"]), torch.tensor(data["mask"])
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    base = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    with torch.no_grad():
        logits = model(input_ids=src, attention_mask=mask, decoder_input_ids=src[:, :4]).logits
        generated = model.generate(src, attention_mask=mask, num_beams=2, max_new_tokens=5, min_new_tokens=5)
        hidden = base(input_ids=src, attention_mask=mask, decoder_input_ids=src[:, :4]).last_hidden_state
    print(json.dumps({
        "config": type(config).__name__, "model": type(model).__name__, "base": type(base).__name__,
        "tied": model.lm_head.weight is model.model.shared.weight,
        "logits": logits.tolist(), "generated": generated.tolist(), "hidden": hidden.tolist(),
    }))
    """
)


def test_remote_code_set_is_every_model_file():
    """What `vanilla_transformer.hub` ships (the modeling and pipeline files and their single-dot imports,
    recursively) is exactly the model folder's source, so that no model file is left behind and nothing else is
    shipped."""
    model_files = {path.name for path in MODEL_DIR.glob("*.py")} - {"__init__.py"}
    assert set(remote_code_files()) == model_files
    assert set(CODE_FILES) == model_files


def test_modeling_file_imports_every_sibling_directly():
    """Loading remote code from a local folder copies only the entry file's direct relative imports in some
    transformers versions, so the modeling file names every sibling itself (the pipeline file is its own entry)."""
    source = (MODEL_DIR / "modeling_vanilla_transformer.py").read_text()
    direct = {f"{name}.py" for name in re.findall(r"^from \.(\w+) import", source, re.MULTILINE)}
    assert direct == set(CODE_FILES) - {"modeling_vanilla_transformer.py", "pipeline_vanilla_transformer.py"}


def test_remote_code_loading_in_a_fresh_interpreter(tmp_path):
    model = make_model(seed=12)
    model.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert set(saved["auto_map"]) == {"AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM"}
    for name in set(CODE_FILES) - {"pipeline_vanilla_transformer.py"}:  # the pipeline is added by the hub upload
        assert (tmp_path / "saved" / name).exists(), name

    # A copy elsewhere, loaded from a working directory where the package is not on the path (-I: isolated mode).
    shutil.copytree(tmp_path / "saved", tmp_path / "hub_copy")
    src, mask = padded_batch()
    (tmp_path / "inputs.json").write_text(json.dumps({"src": src.tolist(), "mask": mask.tolist()}))
    (tmp_path / "check.py").write_text(FRESH_PROCESS)
    result = subprocess.run(
        [sys.executable, "-I", str(tmp_path / "check.py"), str(tmp_path / "hub_copy"), str(tmp_path / "inputs.json")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["config"] == "VanillaTransformerConfig" and got["base"] == "VanillaTransformerModel"
    assert got["model"] == "VanillaTransformerForConditionalGeneration" and got["tied"]

    with torch.no_grad():
        logits = model(input_ids=src, attention_mask=mask, decoder_input_ids=src[:, :4]).logits
        generated = model.generate(src, attention_mask=mask, num_beams=2, max_new_tokens=5, min_new_tokens=5)
    torch.testing.assert_close(torch.tensor(got["logits"]), logits)
    assert torch.equal(torch.tensor(got["generated"]), generated)
    with torch.no_grad():
        hidden = model.model(src, attention_mask=mask, decoder_input_ids=src[:, :4]).last_hidden_state
    torch.testing.assert_close(torch.tensor(got["hidden"]), hidden)


def test_registered_auto_classes_load_without_remote_code(tmp_path):
    make_model(seed=13).save_pretrained(tmp_path)
    assert type(AutoConfig.from_pretrained(tmp_path)).__module__.startswith("vanilla_transformer")
    assert type(AutoModelForSeq2SeqLM.from_pretrained(tmp_path)).__module__.startswith("vanilla_transformer")
