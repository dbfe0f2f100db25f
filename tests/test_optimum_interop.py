"""🤗 Optimum's own `ORTModelForSeq2SeqLM` on the standard layout (`vt-export-onnx --layout optimum`): greedy and
beam-4 tokens equal this package's PyTorch `generate()` on the tiny trained model.

Optimum pins an older transformers (optimum-onnx 0.1.0: transformers < 4.58), so it runs in an environment of its own,
built once and cached (tests/ecosystem_envs.py), from tests/optimum_generate.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import GenerationConfig

from tests import ecosystem_envs
from tests.ecosystem_envs import ecosystem_env, env_python
from tests.onnx_helpers import SENTENCES, build_tokenizer, load_trained_model
from tests.standard_layout_helpers import standard_export_dir

# torch first, from the local CPU wheel (a bare torch would pull a CUDA build), then Optimum with onnxruntime.
OPTIMUM_STEPS = [["torch==2.13.0"], ["optimum-onnx[onnxruntime]==0.1.0"]]
SCRIPT = Path(__file__).with_name("optimum_generate.py")
MAX_NEW_TOKENS = 10


def generation_settings(num_beams: int) -> dict:
    """Every setting that changes the tokens, the same on both sides (config defaults differ between transformers
    4.57 and 5.24, and the folder's generation_config.json asks for beam 4)."""
    return dict(
        num_beams=num_beams, do_sample=False, max_new_tokens=MAX_NEW_TOKENS, min_new_tokens=0, length_penalty=1.0,
        early_stopping=False, no_repeat_ngram_size=0, repetition_penalty=1.0, num_return_sequences=1,
        decoder_start_token_id=1, bos_token_id=1, eos_token_id=2, pad_token_id=0, forced_bos_token_id=None,
        forced_eos_token_id=None, bad_words_ids=None,
    )  # fmt: skip


def test_optimum_generates_the_same_tokens_as_pytorch(tmp_path):
    env = ecosystem_env("optimum", OPTIMUM_STEPS)
    encoded = build_tokenizer()(SENTENCES, padding=True, return_tensors="np")
    input_ids, attention_mask = encoded["input_ids"].astype(np.int64), encoded["attention_mask"].astype(np.int64)
    runs = {"greedy": generation_settings(1), "beam4": generation_settings(4)}
    request = {
        "folder": str(standard_export_dir()),
        "input_ids": input_ids.tolist(),
        "attention_mask": attention_mask.tolist(),
        "runs": runs,
    }
    (tmp_path / "request.json").write_text(json.dumps(request))
    result = subprocess.run(
        [str(env_python(env)), str(SCRIPT), str(tmp_path / "request.json"), str(tmp_path / "result.json")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    output = json.loads((tmp_path / "result.json").read_text())
    assert output["versions"]["optimum-onnx"] == "0.1.0" and output["versions"]["transformers"].startswith("4.57.")
    assert output["is_merged"] and "use_cache_branch" in output["decoder_inputs"]

    model = load_trained_model()
    for name, settings in runs.items():
        model.generation_config = GenerationConfig(**settings)  # as in optimum_generate.py
        with torch.no_grad():
            expected = model.generate(
                input_ids=torch.from_numpy(input_ids), attention_mask=torch.from_numpy(attention_mask),
                generation_config=GenerationConfig(**settings),
            ).tolist()  # fmt: skip
        assert output["tokens"][name] == expected, name
        longest = max(len([token for token in row if token not in (0, 1, 2)]) for row in expected)
        assert longest >= 3, "outputs this short would test little"


@pytest.mark.parametrize("add_prefix_space", [True, False])
def test_transformers_4_tokenizes_the_export_as_the_model_was_trained(tmp_path, add_prefix_space):
    """The transformers that Optimum pins overwrites a byte-level pre-tokenizer's `add_prefix_space` with its own
    default (False) unless tokenizer_config.json names it: the export must name it, or every sentence's first word
    is split differently from training (vt-train-tokenizer --add_prefix_space, the main job's setting)."""
    from tests.conftest import make_model
    from vanilla_transformer.marian.exporter import save_marian
    from vanilla_transformer.training.tokenization import train_bpe_tokenizer

    texts = ["Issued on %s", "Unknown role type", "Open the file", "Datei öffnen", "Unbekannter Typ"] * 4
    tokenizer = train_bpe_tokenizer(texts, vocab_size=300, min_frequency=1, add_prefix_space=add_prefix_space)
    folder = tmp_path / "model"
    make_model().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    output = save_marian(folder, tmp_path / "marian")
    code = textwrap.dedent(f"""
        import json, sys, transformers
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained({str(output)!r})
        print(json.dumps({{"version": transformers.__version__, "ids": tokenizer({texts!r}).input_ids}}))
    """)
    result = subprocess.run(
        [str(env_python(ecosystem_env("optimum", OPTIMUM_STEPS))), "-c", code], capture_output=True, text=True,
        timeout=300, cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    output = json.loads(result.stdout.strip().splitlines()[-1])
    assert output["version"].startswith("4.57.")
    assert output["ids"] == tokenizer(texts).input_ids


def test_two_processes_building_one_environment_share_it(tmp_path):
    """Both wait on the lock; one builds, the other finds the finished environment; nothing is left half-built."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
        from tests.ecosystem_envs import ecosystem_env
        print(ecosystem_env("probe", []))
    """)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )  # fmt: skip
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=300) for process in processes]
    assert all(process.returncode == 0 for process in processes), [err[-2000:] for _, err in outputs]
    paths = {out.strip() for out, _ in outputs}
    assert len(paths) == 1
    envs = tmp_path / "vanilla-transformer" / "envs"
    built = Path(paths.pop())
    assert sorted(p.name for p in envs.iterdir() if not p.name.endswith(".lock")) == [built.name]
    assert subprocess.run([str(env_python(built)), "-c", "import sys"]).returncode == 0  # renamed into place, runs


def test_only_an_unreachable_registry_skips():
    """pip's connection errors skip (here: an index on a closed local port); any other pip failure fails."""
    missing = "vt-package-that-is-not-there"
    with pytest.raises(pytest.skip.Exception, match="registry cannot be reached"):
        ecosystem_envs._pip(Path(sys.executable), ["--dry-run", "--index-url", "http://127.0.0.1:9/simple", missing])
    with pytest.raises(RuntimeError, match="failed"):
        ecosystem_envs._pip(Path(sys.executable), ["--dry-run", "--no-index", missing])
