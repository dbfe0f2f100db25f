"""benchmarks/onnx_gpu.py end to end on the CPU provider (the path a GPU run takes, I/O binding and all)."""

import json

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from benchmarks import onnx_gpu  # noqa: E402


def test_smoke_run_on_cpu_writes_tokens_per_second(tmp_path):
    results = tmp_path / "onnx_gpu.json"
    argv = ["--provider", "cpu", "--preset", "tiny", "--vocab_size", "96", "--batches", "1", "3", "--num_beams", "2"]
    argv += ["--new_tokens", "4", "--rounds", "1", "--workdir", str(tmp_path / "work"), "--output", str(results)]
    payload = onnx_gpu.main(argv)
    assert json.loads(results.read_text()) == payload
    assert set(payload) == {"benchmark", "command", "machine", "settings", "results"}
    assert payload["machine"]["provider"] == "CPUExecutionProvider"
    assert (tmp_path / "work" / "onnx-fp16" / "decoder_model.onnx").is_file()
    for batch in ("1", "3"):
        row = payload["results"]["batches"][batch]
        assert set(row) == {"ORT fp16", "PyTorch fp32"}
        for system in row.values():
            assert system["tokens_per_second"] == pytest.approx(int(batch) * 4 / system["seconds"])
        # share of positions with PyTorch fp32's token; the outputs have the same shape, or token_agreement raises
        assert 0.0 <= row["ORT fp16"]["same_tokens_as_pytorch_fp32"] <= 1.0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_cuda_without_a_gpu_says_so(tmp_path):
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        onnx_gpu.main(["--workdir", str(tmp_path)])
