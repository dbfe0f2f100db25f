"""benchmarks/onnx_gpu.py end to end on the CPU provider (the path a GPU run takes, I/O binding and all)."""

import json

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from benchmarks import onnx_gpu  # noqa: E402


def test_smoke_run_on_cpu_writes_tokens_per_second(tmp_path):
    results = tmp_path / "onnx_gpu"
    argv = ["--provider", "cpu", "--preset", "tiny", "--vocab-size", "96", "--batches", "1", "3", "--num-beams", "2"]
    argv += ["--new-tokens", "4", "--repeats", "1", "--work-dir", str(tmp_path / "work"), "--name", str(results)]
    payload = onnx_gpu.main(argv)
    assert json.loads(results.with_suffix(".json").read_text()) == payload
    assert payload["provider"] == "CPUExecutionProvider"
    assert (tmp_path / "work" / "onnx-fp16" / "decoder_model.onnx").is_file()
    for batch in ("1", "3"):
        row = payload["results"][batch]
        assert set(row) == {"ORT fp16", "PyTorch fp32"}
        for system in row.values():
            assert system["tokens_per_second"] == pytest.approx(int(batch) * 4 / system["seconds"])
        same = row["ORT fp16"]["tokens_vs_pytorch_fp32"]  # "identical", or "xx% of tokens" when shapes agree
        assert same == "identical" or same.endswith("of tokens")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_cuda_without_a_gpu_says_so(tmp_path):
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        onnx_gpu.main(["--work-dir", str(tmp_path)])
