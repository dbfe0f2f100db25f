"""Hub sharing without a network: the dry-run folder, the model card, and the upload with Hub calls intercepted."""

import importlib.util
import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import pytest
import torch
from huggingface_hub import ModelCard
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.hub import CODE_FILES, prepare_hub_folder, push_to_hub, read_eval_results
from vanilla_transformer.hub.cli import push_to_hub_command

ROOT = Path(__file__).resolve().parents[1]

SECRET = "hf_TESTtokenNEVERshownABCDEFGHIJKLMNOP"
SENTENCES = ["hello world", "the cat sat on the mat", "good morning", "hallo welt", "die katze", "guten morgen"]


def build_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=80, special_tokens=["<pad>", "<s>", "</s>", "<unk>"])
    tokenizer.train_from_iterator(SENTENCES * 5, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


@pytest.fixture
def model_dir(tmp_path) -> Path:
    """A folder as the training script leaves it: model, tokenizer, metrics, training record, a checkpoint."""
    folder = tmp_path / "run"
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_preset("tiny", vocab_size=len(tokenizer), d_model=32, encoder_ffn_dim=48)
    VanillaTransformerForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "all_results.json").write_text(json.dumps({"test_bleu": 12.3456, "test_chrf": 40.5, "eval_bleu": 9.0}))
    (folder / "training_info.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de",
                                                           "dataset": "gettext-en-de", "steps": 20}))  # fmt: skip
    (folder / "checkpoint-10").mkdir()
    (folder / "checkpoint-10" / "model.safetensors").write_text("not uploaded")
    (folder / "training_args.bin").write_bytes(b"not uploaded")
    return folder


def test_dry_run_writes_exactly_the_upload_folder(model_dir, tmp_path, capsys):
    out = tmp_path / "hub"
    assert push_to_hub_command(["--model", str(model_dir), "--repo_id", "someone/en-de", "--dry_run", str(out)]) == 0
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    expected = {"README.md", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json", "all_results.json", "training_info.json", *CODE_FILES}  # fmt: skip
    assert set(files) == expected
    assert "Dry run" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert set(config["auto_map"]) == {"AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM"}
    assert config["custom_pipelines"]["translation"]["impl"] == "pipeline_vanilla_transformer.TranslationPipeline"


def test_model_card_metadata_comes_from_the_measured_results(model_dir, tmp_path):
    prepare_hub_folder(model_dir, tmp_path / "hub", "someone/en-de", ROOT / "model_card.md")
    card = ModelCard.load(tmp_path / "hub" / "README.md")  # huggingface_hub's own parser and validation
    data = card.data
    assert data.library_name == "transformers" and data.pipeline_tag == "translation"
    assert data.language == ["en", "de"] and data.license == "apache-2.0" and data.datasets == ["gettext-en-de"]
    results = {r.metric_type: r for r in data.eval_results}
    assert results["bleu"].metric_value == 12.35 and results["chrf"].metric_value == 40.5  # from all_results.json
    assert results["bleu"].dataset_split == "test" and results["bleu"].task_type == "translation"
    text = card.text
    assert "{{" not in text and "trust_remote_code=True" in text and 'pipeline("translation"' in text
    n_params = sum(
        p.numel() for p in VanillaTransformerForConditionalGeneration.from_pretrained(model_dir).parameters()
    )
    assert f"{n_params:,}" in text


def test_card_names_the_dropouts_that_are_on(model_dir, tmp_path):
    prepare_hub_folder(model_dir, tmp_path / "plain", "someone/en-de", ROOT / "model_card.md")
    card = (tmp_path / "plain" / "README.md").read_text()
    assert "| Dropout | 0.1 on sub-layer outputs and embedding sums (§5.4) |" in card  # the tiny preset: P_drop only
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(
        json.dumps({**config, "attention_dropout": 0.1, "activation_dropout": 0.05})
    )
    prepare_hub_folder(model_dir, tmp_path / "more", "someone/en-de", ROOT / "model_card.md")
    card = (tmp_path / "more" / "README.md").read_text()
    assert "0.1 on attention weights, 0.05 after the ReLU (not in the paper) |" in card


def test_card_without_results_says_so(model_dir, tmp_path):
    (model_dir / "all_results.json").unlink()
    assert read_eval_results(model_dir) == {}
    prepare_hub_folder(model_dir, tmp_path / "hub", "someone/en-de", ROOT / "model_card.md")
    card = ModelCard.load(tmp_path / "hub" / "README.md")
    assert card.data.eval_results is None
    assert "not evaluated" in card.text


FRESH_PROCESS = textwrap.dedent(
    """
    import json, sys
    sys.modules["vanilla_transformer"] = None  # a Hub user's machine: the package is not installed
    import torch
    from transformers import AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

    folder = sys.argv[1]
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    plain_tokenizer = AutoTokenizer.from_pretrained(folder)  # no remote code needed for the tokenizer itself
    assert plain_tokenizer("hello world")["input_ids"] == tokenizer("hello world")["input_ids"]
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True)
    base = AutoModel.from_pretrained(folder, trust_remote_code=True)
    batch = tokenizer(["hello world", "good morning"], return_tensors="pt", padding=True)
    ids = model.generate(**batch, num_beams=2, max_new_tokens=6)
    translator = pipeline("translation", model=folder, trust_remote_code=True)
    print()  # ends any prompt line
    print(json.dumps({
        "generate": tokenizer.batch_decode(ids, skip_special_tokens=True),
        "pipeline": translator(["hello world", "good morning"], num_beams=2, max_new_tokens=6),
        "base": type(base).__name__,
    }))
    """
)


def test_dry_run_folder_loads_where_the_package_is_not_installed(model_dir, tmp_path):
    out = tmp_path / "hub"
    prepare_hub_folder(model_dir, out, "someone/en-de", ROOT / "model_card.md")
    (tmp_path / "check.py").write_text(FRESH_PROCESS)
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-I", str(tmp_path / "check.py"), str(out)],
        cwd=tmp_path, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])

    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir)
    batch = tokenizer(["hello world", "good morning"], return_tensors="pt", padding=True)
    expected = tokenizer.batch_decode(model.generate(**batch, num_beams=2, max_new_tokens=6), skip_special_tokens=True)
    assert got["generate"] == expected
    assert [r["translation_text"] for r in got["pipeline"]] == expected
    assert got["base"] == "VanillaTransformerModel"


class FakeHub:
    """Records the Hub calls; each upload lists the files of the folder at upload time."""

    def __init__(self):
        self.calls, self.uploaded = [], []

    def create_repo(self, repo_id, token=None, private=None, exist_ok=False, **kwargs):
        self.calls.append(("create_repo", repo_id, private, token))
        return SimpleNamespace(repo_id=repo_id)

    def create_branch(self, repo_id, branch, token=None, exist_ok=False, **kwargs):
        self.calls.append(("create_branch", repo_id, branch, token))

    def upload_folder(self, repo_id, folder_path, commit_message=None, revision=None, token=None, **kwargs):
        self.calls.append(("upload_folder", repo_id, revision, token))
        self.uploaded = sorted(str(p.relative_to(folder_path)) for p in Path(folder_path).rglob("*") if p.is_file())
        return SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/abc")


def test_upload_sends_the_prepared_folder_and_never_shows_the_token(model_dir, tmp_path, monkeypatch, capsys, caplog):
    fake = FakeHub()
    monkeypatch.setattr(huggingface_hub, "HfApi", lambda *a, **k: fake)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    caplog.set_level(logging.DEBUG)
    code = push_to_hub_command(
        ["--model", str(model_dir), "--repo_id", "someone/en-de", "--private", "--revision", "v1",
         "--commit_message", "first"]
    )  # fmt: skip
    assert code == 0
    assert [c[0] for c in fake.calls] == ["create_repo", "create_branch", "upload_folder"]
    assert fake.calls[0][2] is True and fake.calls[2][2] == "v1"
    assert all(call[-1] == SECRET for call in fake.calls)  # the token goes to the Hub client only
    assert "README.md" in fake.uploaded and "modeling_vanilla_transformer.py" in fake.uploaded
    assert not any(name.startswith("checkpoint-") or name == "training_args.bin" for name in fake.uploaded)
    captured = capsys.readouterr()
    assert SECRET not in captured.out + captured.err + caplog.text
    assert "https://huggingface.co/someone/en-de/commit/abc" in captured.out


def test_model_push_to_hub_uploads_code_and_auto_map(model_dir, monkeypatch):
    operations = []

    def create_commit(self, repo_id, operations_, *args, **kwargs):
        for op in operations_:
            content = op.path_or_fileobj
            operations.append((op.path_in_repo, Path(content).read_bytes() if isinstance(content, str) else content))
        return SimpleNamespace(commit_url="https://huggingface.co/x/y/commit/1", oid="1", pr_url=None)

    monkeypatch.setattr(
        huggingface_hub.HfApi, "create_repo", lambda self, repo_id, **k: SimpleNamespace(repo_id=repo_id)
    )
    monkeypatch.setattr(
        huggingface_hub.HfApi,
        "create_commit",
        lambda self, repo_id, operations, *a, **k: create_commit(self, repo_id, operations),
    )
    model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir)
    model.push_to_hub("someone/en-de", token=SECRET)
    files = {name: content for name, content in operations}
    assert {"config.json", "model.safetensors", "modeling_vanilla_transformer.py", "attention.py", "layers.py",
            "embeddings.py", "kernels.py", "configuration_vanilla_transformer.py"} <= set(files)  # fmt: skip
    config = json.loads(files["config.json"])
    assert set(config["auto_map"]) == {"AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM"}


class TestBadInput:
    def test_missing_model_files_are_named(self, model_dir, tmp_path, capsys):
        (model_dir / "tokenizer.json").unlink()
        (model_dir / "model.safetensors").unlink()
        code = push_to_hub_command(["--model", str(model_dir), "--repo_id", "a/b", "--dry_run", str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert code == 2 and "model.safetensors" in err and "tokenizer.json" in err
        assert not (tmp_path / "o").exists()

    def test_missing_folder(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="no such folder"):
            prepare_hub_folder(tmp_path / "nope", tmp_path / "o", "a/b", ROOT / "model_card.md")

    @pytest.mark.parametrize("repo_id", ["no-namespace", "a/b/c", "bad name/x", "a/b..c", ""])
    def test_invalid_repo_id(self, model_dir, tmp_path, repo_id):
        with pytest.raises(ValueError, match="Invalid --repo_id"):
            prepare_hub_folder(model_dir, tmp_path / "o", repo_id, ROOT / "model_card.md")

    def test_no_token_fails_before_anything_is_sent(self, model_dir, monkeypatch, tmp_path):
        fake = FakeHub()
        monkeypatch.setattr(huggingface_hub, "HfApi", lambda *a, **k: fake)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
        with pytest.raises(ValueError, match="No Hugging Face token"):
            push_to_hub(model_dir, "someone/en-de", ROOT / "model_card.md")
        assert fake.calls == []


def test_onnx_export_goes_under_onnx(model_dir, tmp_path):
    onnx_dir = tmp_path / "onnx_export"
    onnx_dir.mkdir()
    for name in ("encoder_model.onnx", "decoder_model.onnx", "manifest.json"):
        (onnx_dir / name).write_bytes(b"graph")
    files = prepare_hub_folder(model_dir, tmp_path / "hub", "someone/en-de", ROOT / "model_card.md", onnx_dir)
    assert {"onnx/encoder_model.onnx", "onnx/decoder_model.onnx", "onnx/manifest.json"} <= set(files)
    assert "The ONNX export is in `onnx/`." in (tmp_path / "hub" / "README.md").read_text()
    with pytest.raises(FileNotFoundError, match="no encoder_model.onnx"):
        prepare_hub_folder(model_dir, tmp_path / "hub2", "someone/en-de", ROOT / "model_card.md", tmp_path)


def test_push_to_hub_from_a_wheel_in_a_fresh_venv(model_dir, tmp_path):
    """The model-card templates travel as package data: `vt-push-to-hub --dry_run` of a wheel installed in a fresh
    venv (no checkout on its path) writes the card. The venv's dependencies come from this interpreter's
    site-packages as a plain path entry, so this checkout's editable install is not active there."""
    import site
    import sysconfig

    source = tmp_path / "source"
    tracked = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in tracked:
        if (ROOT / name).is_file() and not name.startswith(("tests/", "docs/", "benchmarks/", "examples/")):
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((ROOT / name).read_bytes())  # links followed: model_card.md is a link
    wheels = tmp_path / "wheels"
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", str(wheels), "."],
        cwd=source, check=True, capture_output=True,
    )  # fmt: skip
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
         *map(str, wheels.glob("vanilla_transformer-*.whl"))], check=True, capture_output=True,
    )  # fmt: skip
    fresh_site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    ours = [path for path in site.getsitepackages() if path == sysconfig.get_paths()["purelib"]]
    Path(fresh_site, "dependencies.pth").write_text("\n".join(ours) + "\n")
    out = tmp_path / "hub"
    run = subprocess.run(
        [str(venv / "bin" / "vt-push-to-hub"), "--model", str(model_dir), "--repo_id", "someone/en-de",
         "--dry_run", str(out)],
        cwd=tmp_path, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    where = subprocess.run(
        [str(python), "-c", "import vanilla_transformer.hub as h; print(h.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert where.startswith(fresh_site)  # the wheel's package, not this checkout
    card = (out / "README.md").read_text()
    assert "someone/en-de" in card and "{{" not in card
