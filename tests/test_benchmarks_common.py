"""The benchmark harness's pure functions: statistics, interleaving, FLOP counting, tables (never timings)."""

import importlib.metadata
import json
import subprocess
import sys

import pytest

from benchmarks import common


def test_summarize_median_min_and_noise():
    stats = common.summarize([2.0, 1.0, 4.0, 3.0])
    assert stats["median"] == 2.5
    assert stats["min"] == 1.0
    assert stats["max"] == 4.0
    assert stats["spread"] == pytest.approx(3.0)  # (4 - 1) / 1
    assert stats["cv"] == pytest.approx(1.2909944 / 2.5)  # sample stdev / mean
    assert common.summarize([5.0])["cv"] == 0.0
    with pytest.raises(ValueError):
        common.summarize([])


def test_run_interleaved_order_and_warmup():
    calls = []
    systems = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    times = common.run_interleaved(systems, rounds=2, warmup=1)
    assert calls == ["a", "b"] * 3
    assert {name: len(t) for name, t in times.items()} == {"a": 2, "b": 2}


def test_forward_flops_against_a_hand_count():
    # One layer per stack, d=4, d_ff=8, vocab 10, batch 1, source 2 tokens, target 3 tokens.
    dims = common.Dims(d_model=4, d_ff=8, encoder_layers=1, decoder_layers=1, heads=2, vocab_size=10)
    mac = 0
    # encoder, per source token: q, k, v, out (4 x 16 MACs), FFN (2 x 32), scores + weighted sum over 2 keys
    mac += 2 * (4 * 16 + 2 * 32 + 2 * 2 * 4)
    mac += 2 * (2 * 16)  # cross-attention keys and values of the 2 source tokens
    # decoder, per target token: self q, k, v, out; cross q, out; FFN; self attention over 3; cross attention over 2
    mac += 3 * (4 * 16 + 2 * 16 + 2 * 32 + 2 * 3 * 4 + 2 * 2 * 4)
    mac += 3 * 4 * 10  # output projection
    assert common.forward_matmul_flops(dims, batch=1, src_len=2, tgt_len=3) == 2 * mac
    assert common.training_step_flops(dims, batch=5, src_len=2, tgt_len=3) == 3 * 5 * 2 * mac


def test_generation_flops_against_a_hand_count():
    # One layer per stack, d=4, d_ff=8, vocab 10; batch 2, 3 beams, source 2 tokens, 2 decoder steps.
    dims = common.Dims(d_model=4, d_ff=8, encoder_layers=1, decoder_layers=1, heads=2, vocab_size=10)
    per_sentence = 2 * (4 * 16 + 2 * 32 + 2 * 2 * 4) + 2 * (2 * 16)  # encoder over 2 tokens, cross K/V once
    per_row_step = 4 * 16 + 2 * 16 + 2 * 32 + 2 * 2 * 4 + 4 * 10  # projections, FFN, cross attention, vocabulary
    self_attention = 2 * 1 * 4 + 2 * 2 * 4  # step 1 attends over 1 position, step 2 over 2
    mac = 2 * per_sentence + 6 * (2 * per_row_step + self_attention)
    assert common.generation_matmul_flops(dims, batch=2, num_beams=3, src_len=2, new_tokens=2) == 2 * mac


def test_generation_flops_equal_a_forward_pass_per_prefix():
    # Greedy at batch 1: step t's work is the last-token slice of a forward pass over t target tokens.
    dims = common.Dims(d_model=8, d_ff=16, encoder_layers=2, decoder_layers=3, heads=2, vocab_size=11)
    steps = 5
    total = common.generation_matmul_flops(dims, batch=1, num_beams=1, src_len=4, new_tokens=steps)
    full = common.forward_matmul_flops(dims, batch=1, src_len=4, tgt_len=steps)
    # The forward pass counts each target token's attention over all `steps` positions (a full square);
    # generation attends over t positions at step t, the lower triangle.
    square_minus_triangle = dims.decoder_layers * 2 * 2 * dims.d_model * (steps * steps - steps * (steps + 1) // 2)
    assert total == full - square_minus_triangle


def test_base_training_flops_match_the_issue_reference():
    # Marian's 308 target tokens/s at 64x32 were about 65% of 172 GFLOP/s, i.e. ~363 MFLOP per target token.
    flops = common.training_step_flops(common.BASE, batch=64, src_len=32, tgt_len=32)
    per_token = flops / (64 * 32)
    assert 355e6 < per_token < 372e6


def test_sgemm_gflops():
    assert common.sgemm_gflops(1.0, n=1000) == pytest.approx(2.0)


def test_format_table():
    table = common.format_table(["a", "bb"], [[1, "x"], ["long", 2.5]])
    lines = table.splitlines()
    assert lines[0] == "| a    | bb  |"
    assert lines[1] == "|------|-----|"
    assert lines[3] == "| long | 2.5 |"


def test_marian_vocabulary_layout():
    vocab = common.marian_vocabulary(10)
    assert vocab[0] == "</s>" and vocab[1] == "<unk>" and vocab[-1] == "<pad>"
    assert len(set(vocab)) == 10


def test_save_results_writes_the_one_schema_by_name_or_path(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path / "results")
    fields = {"machine": {"cpu": "x"}, "settings": {"rounds": 2}, "results": {"row": {"median": 1.5}}}
    payload = common.save_results("demo", "generate_speed", ["--rounds", "2"], **fields)
    command = "python -m benchmarks.generate_speed --rounds 2"
    assert payload == {"benchmark": "generate_speed", "command": command, **fields}
    assert json.loads((tmp_path / "results" / "demo.json").read_text()) == payload
    assert common.save_results(tmp_path / "elsewhere" / "x.json", "memory", [], **fields)["benchmark"] == "memory"
    assert (tmp_path / "elsewhere" / "x.json").is_file()
    assert "wrote" in capsys.readouterr().out


def test_save_results_keeps_a_machines_runs_one_per_settings(tmp_path):
    """With `same_run`, the file holds every run, and a run replaces the earlier one of the same settings only."""
    path = tmp_path / "serve.json"

    def save(clients, seconds, value):
        settings = {"clients": clients, "seconds": seconds}
        return common.save_results(path, "serve_load", [], machine={}, settings=settings, results={"value": value},
                                   same_run=("clients",))  # fmt: skip

    save([32], 15, 1)
    save([1, 32], 15, 2)
    run = save([32], 20, 3)  # the same run as the first: it goes, this one comes last
    runs = json.loads(path.read_text())["runs"]
    assert [r["results"]["value"] for r in runs] == [2, 3] and runs[-1] == run
    assert run["benchmark"] == "serve_load" and run["settings"] == {"clients": [32], "seconds": 20}


def test_machine_info_reads_torchs_version_without_importing_it():
    """`serve_load` records its machine too, and its process never needs torch."""
    code = "import sys; from benchmarks import common; print(common.machine_info()['torch'], 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=common.ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [importlib.metadata.version("torch"), "False"]


def test_open_loop_arrivals_are_a_poisson_stream_with_the_share_of_paragraphs_asked():
    """`benchmarks.serve_load`'s open loop: exponential gaps at the asked rate (mean and spread of a Poisson stream),
    fixed by the seed, and about the asked share of paragraphs of 5-8 texts among the one-line requests."""
    import itertools
    import statistics

    from benchmarks.serve_load import arrival_times, with_paragraphs

    times = arrival_times(rate=50.0, seconds=200.0, seed=3)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert abs(len(times) / 200.0 - 50.0) < 2.0  # 10,000 arrivals: the count is within 4 standard deviations
    assert abs(statistics.mean(gaps) - 0.02) < 0.001 and abs(statistics.stdev(gaps) - 0.02) < 0.002
    assert times == arrival_times(rate=50.0, seconds=200.0, seed=3) and all(0 < t < 200 for t in times)
    texts = [f"line {i}" for i in range(30)]
    requests = with_paragraphs(texts, share=0.1, count=5000, seed=0)
    paragraphs = [text for text, is_line in requests if not is_line]
    assert 0.08 < len(paragraphs) / len(requests) < 0.12
    assert all(5 <= text.count("line") <= 8 for text in paragraphs)
    assert all(text in texts for text, is_line in requests if is_line)
