"""The paper's recipe: schedule against the closed form, token-budget batches, a short Trainer run, resume."""

import math

import numpy as np
import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, Seq2SeqTrainingArguments

from tests.training_fixtures import *  # noqa: F403 (pytest fixtures)
from tests.training_fixtures import tiny_model
from vanilla_transformer.training.data import DataArguments, load_parallel_data, tokenize_parallel
from vanilla_transformer.training.experiment import build_trainer
from vanilla_transformer.training.recipe import (
    NoamSchedule,
    RecipeArguments,
    apply_paper_recipe,
    explicit_flags,
    get_noam_schedule,
    noam_learning_rate,
    noam_peak_learning_rate,
)
from vanilla_transformer.training.token_batches import TokenBudgetBatchSampler, pack_token_batches


def paper_formula(step, d_model, warmup):  # the oracle: Eq. (3) written out independently
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


# ---------------------------------------------------------------- schedule


@pytest.mark.parametrize(("d_model", "warmup"), [(512, 4000), (1024, 4000), (64, 10)])
def test_noam_scheduler_follows_the_formula(d_model, warmup):
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([parameter], lr=noam_peak_learning_rate(d_model, warmup))
    scheduler = get_noam_schedule(optimizer, warmup)
    checkpoints = {1, 2, warmup // 2, warmup - 1, warmup, warmup + 1, 3 * warmup, 10 * warmup}
    for update in range(1, 10 * warmup + 1):
        lr_used = optimizer.param_groups[0]["lr"]  # the rate this update is made with
        if update in checkpoints:
            assert lr_used == pytest.approx(paper_formula(update, d_model, warmup), rel=1e-9)
            assert noam_learning_rate(update, d_model, warmup) == pytest.approx(paper_formula(update, d_model, warmup))
        optimizer.step()
        scheduler.step()


@pytest.mark.parametrize(("warmup", "total", "cooldown"), [(10, 100, 0.2), (4, 37, 0.5), (1, 9, 0.1)])
def test_noam_cooldown_follows_the_formula(warmup, total, cooldown):
    d_model = 64
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([parameter], lr=noam_peak_learning_rate(d_model, warmup))
    scheduler = get_noam_schedule(optimizer, warmup, cooldown, total)
    steps_down = round(cooldown * total)  # the last `steps_down` updates fall linearly towards 0
    rates = []
    for update in range(1, total + 1):
        rates.append(optimizer.param_groups[0]["lr"])
        fall = min(1.0, (total - update + 1) / steps_down)
        assert rates[-1] == pytest.approx(paper_formula(update, d_model, warmup) * fall, rel=1e-9)
        optimizer.step()
        scheduler.step()
    plain = [paper_formula(update, d_model, warmup) for update in range(1, total + 1)]
    assert rates[: total - steps_down] == pytest.approx(plain[: total - steps_down], rel=1e-9)
    falling = rates[total - steps_down :]
    assert all(a > b for a, b in zip(falling, falling[1:], strict=False)) and falling[-1] > 0
    assert rates[-1] == pytest.approx(plain[-1] / steps_down, rel=1e-9)


def test_noam_cooldown_total_moves_until_the_cooldown_begins_and_is_saved():
    schedule = NoamSchedule(warmup_steps=10, cooldown=0.2, total_steps=1_000_000)
    assert schedule.set_total_steps(100, completed_steps=30)  # the budget allows 100 steps: cool down from 81
    assert (schedule.total_steps, schedule.cooldown_steps) == (100, 20)
    assert not schedule.cooldown_started(80) and schedule.cooldown_started(81)
    assert not schedule.set_total_steps(120, completed_steps=85)  # cooling down: the end cannot move away
    assert schedule.total_steps == 100
    rate = schedule(85)
    assert schedule.set_total_steps(95, completed_steps=85)  # a slower machine: an earlier end, the same length
    assert (schedule.total_steps, schedule.cooldown_steps) == (95, 20) and schedule(85) < rate
    late = NoamSchedule(warmup_steps=10, cooldown=0.2, total_steps=1_000)
    assert late.set_total_steps(50, completed_steps=60) and late.total_steps == 61  # never before the next update
    assert not NoamSchedule(10).set_total_steps(5, 1)  # no cooldown: nothing to move
    # LambdaLR keeps the moved total with the checkpoint, so a resumed run cools down at the same steps.
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = get_noam_schedule(optimizer, 10, 0.2, 1_000_000)
    scheduler.lr_lambdas[0].set_total_steps(100, 0)
    restored = get_noam_schedule(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), 10, 0.2, 1_000_000)
    restored.load_state_dict(scheduler.state_dict())
    assert restored.lr_lambdas[0].total_steps == 100
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="fraction of the training steps"):
            NoamSchedule(10, bad, 100)
    with pytest.raises(ValueError, match="needs the number of training steps"):
        NoamSchedule(10, 0.2)


def test_noam_peak_matches_the_paper_numbers():
    assert noam_peak_learning_rate(512) == pytest.approx(6.988e-4, rel=1e-3)  # base, step 4000
    assert noam_peak_learning_rate(1024) == pytest.approx(4.941e-4, rel=1e-3)  # big
    assert noam_learning_rate(4000, 512) == max(noam_learning_rate(s, 512) for s in range(1, 20000))
    with pytest.raises(ValueError, match="must be >= 1"):
        noam_learning_rate(0, 512)


def test_recipe_switch_sets_paper_values_and_explicit_flags_win(tmp_path):
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), adam_beta2=0.999, use_cpu=True)
    recipe = RecipeArguments()
    apply_paper_recipe(args, recipe, d_model=512, explicit=explicit_flags(["--adam_beta2=0.997", "--max_tokens", "9"]))
    assert (args.adam_beta1, args.adam_beta2, args.adam_epsilon) == (0.9, 0.999, 1e-9)
    assert (args.warmup_steps, args.label_smoothing_factor, args.weight_decay) == (4000, 0.1, 0.0)
    assert args.learning_rate == pytest.approx(512**-0.5 * 4000**-0.5)
    assert args.generation_num_beams == 4 and recipe.length_penalty == 0.6 and recipe.max_tokens == 4096
    off = Seq2SeqTrainingArguments(output_dir=str(tmp_path), use_cpu=True)
    apply_paper_recipe(off, RecipeArguments(paper_recipe=False), d_model=512)
    assert off.adam_beta2 == 0.999 and off.label_smoothing_factor == 0.0
    with pytest.raises(ValueError, match="--lr_schedule must be"):
        apply_paper_recipe(off, RecipeArguments(lr_schedule="cosine"), d_model=512)
    with pytest.raises(ValueError, match="--lr_cooldown belongs to the noam schedule"):
        apply_paper_recipe(off, RecipeArguments(lr_schedule="trainer", lr_cooldown=0.2), d_model=512)
    with pytest.raises(ValueError, match="--lr_cooldown is a fraction"):
        apply_paper_recipe(off, RecipeArguments(lr_cooldown=1.5), d_model=512)


# ---------------------------------------------------------------- token-budget batches


def _lengths(count=500, seed=0):
    rng = np.random.default_rng(seed)
    source = rng.integers(2, 60, count)
    target = np.clip(source + rng.integers(-10, 11, count), 2, 70)
    return source, target


def test_token_batches_respect_the_budget_and_cover_the_data():
    source, target = _lengths()
    sampler = TokenBudgetBatchSampler(source, target, max_tokens=300, seed=3)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    for batch in batches:
        assert len(batch) * source[batch].max() <= 300 and len(batch) * target[batch].max() <= 300
    assert sorted(i for batch in batches for i in batch) == list(range(len(source)))  # each pair exactly once
    # grouped by length: padding is a small share of the tokens
    padded = sum(len(b) * source[b].max() for b in batches)
    assert source.sum() / padded > 0.85
    assert np.mean([len(b) for b in batches]) > 4  # and batches are not trivially small


def test_token_batches_differ_across_ranks_and_epochs():
    source, target = _lengths()
    single = TokenBudgetBatchSampler(source, target, max_tokens=300, seed=5)
    ranks = [TokenBudgetBatchSampler(source, target, max_tokens=300, num_replicas=2, rank=r, seed=5) for r in (0, 1)]
    batches = [list(sampler) for sampler in ranks]
    assert len(batches[0]) == len(batches[1]) == len(ranks[0])  # same number of steps on every rank
    seen = [{i for batch in rank_batches for i in batch} for rank_batches in batches]
    overlap = seen[0] & seen[1]
    assert len(overlap) <= max(len(b) for b in single.global_batches())  # only the wrap-around padding batch
    assert seen[0] | seen[1] == set(range(len(source)))
    first_epoch = list(ranks[0])
    for sampler in ranks:
        sampler.set_epoch(1)
    assert list(ranks[0]) != first_epoch  # reshuffled each epoch
    ranks[0].set_epoch(0)
    assert list(ranks[0]) == first_epoch  # deterministic for a given seed and epoch


def _whole_corpus_batches(source, target, max_tokens, seed, epoch, shuffle=True, max_sentences=None):
    """The sampler's epoch as one lexsort over the whole corpus (the definition the block-wise build must equal)."""
    rng = np.random.default_rng([seed, epoch])
    tie_break = rng.random(len(source)) if shuffle else np.arange(len(source))
    order = np.lexsort((tie_break, target, source))
    bounds = pack_token_batches(np.maximum(source, target)[order], max_tokens, max_sentences)
    ids = rng.permutation(len(bounds) - 1) if shuffle else np.arange(len(bounds) - 1)
    return [order[bounds[i] : bounds[i + 1]].tolist() for i in ids]


def _sharded_batches(source, target, max_tokens, seed, epoch, shards, max_sentences=None):
    """The sampler's epoch over `shards` shards, stated on whole arrays: each pair's shard from one draw of
    `Generator([seed, 2**32 - 1])`, each shard one lexsort and one packing, shards in the order of
    `Generator([seed, epoch, 1])`, each shard's batches permuted by the tie-break generator in that order."""
    shard_of = (np.random.default_rng([seed, 2**32 - 1]).random(len(source)) * shards).astype(int)
    rng = np.random.default_rng([seed, epoch])
    tie_break = rng.random(len(source))
    batches = []
    for shard in np.random.default_rng([seed, epoch, 1]).permutation(shards):
        members = np.flatnonzero(shard_of == shard)
        order = members[np.lexsort((tie_break[members], target[members], source[members]))]
        bounds = pack_token_batches(np.maximum(source, target)[order], max_tokens, max_sentences)
        batches += [order[bounds[i] : bounds[i + 1]].tolist() for i in rng.permutation(len(bounds) - 1)]
    return batches


@pytest.mark.parametrize("shuffle", [True, False])
def test_block_wise_epochs_equal_one_sort_of_the_whole_corpus(monkeypatch, shuffle):
    pa = pytest.importorskip("pyarrow")
    monkeypatch.setattr(TokenBudgetBatchSampler, "block_size", 97)  # many blocks, read one at a time
    source, target = _lengths(3000, seed=11)
    source[:400] = 7  # one (source, target) length with more pairs than a block
    target[:400] = 9
    chunked = [pa.chunked_array([column[:1000], column[1000:1001], column[1001:]]) for column in (source, target)]
    for lengths in ((source, target), chunked):
        for epoch in (0, 1):
            sampler = TokenBudgetBatchSampler(*lengths, max_tokens=300, seed=4, shuffle=shuffle, max_sentences=9)
            sampler.set_epoch(epoch)
            assert sampler.num_shards == 1
            expected = _whole_corpus_batches(source, target, 300, 4, epoch, shuffle, max_sentences=9)
            assert sampler.global_batches() == expected


def test_a_large_corpus_is_batched_shard_by_shard(monkeypatch):
    monkeypatch.setattr(TokenBudgetBatchSampler, "block_size", 97)
    monkeypatch.setattr(TokenBudgetBatchSampler, "shard_size", 700)
    source, target = _lengths(3000, seed=12)
    sampler = TokenBudgetBatchSampler(source, target, max_tokens=300, seed=6, max_sentences=9)
    assert sampler.num_shards == 5
    shard_of = (np.random.default_rng([6, 2**32 - 1]).random(3000) * 5).astype(int)
    assert np.bincount(shard_of).min() > 450  # a random split: every shard about a fifth of the corpus
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        batches = sampler.global_batches()
        assert batches == _sharded_batches(source, target, 300, 6, epoch, shards=5, max_sentences=9)
        assert len(batches) == len(sampler)
        assert sorted(i for batch in batches for i in batch) == list(range(3000))  # each pair exactly once
        assert all(len({shard_of[i] for i in batch}) == 1 for batch in batches)  # a batch never spans shards
        assert all(len(b) * source[b].max() <= 300 and len(b) * target[b].max() <= 300 for b in batches)
    ranks = [TokenBudgetBatchSampler(source, target, 300, num_replicas=3, rank=r, seed=6) for r in range(3)]
    steps = [list(rank) for rank in ranks]
    assert len({len(s) for s in steps}) == 1 == len({len(rank) for rank in ranks})  # same steps on every rank


def test_memory_is_one_shard_not_the_corpus(monkeypatch):
    """Iterating an epoch of 1,000,000 pairs in shards of 20,000 allocates well under the 4 MB that one int32 index
    a pair would take (numpy's allocations are traced by tracemalloc)."""
    import tracemalloc

    monkeypatch.setattr(TokenBudgetBatchSampler, "block_size", 10_000)
    monkeypatch.setattr(TokenBudgetBatchSampler, "shard_size", 20_000)
    source, target = _lengths(1_000_000, seed=13)
    sampler = TokenBudgetBatchSampler(source, target, max_tokens=300, seed=1)
    tracemalloc.start()
    try:
        first = next(iter(sampler))
        first_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        count = sum(1 for _ in sampler)
        epoch_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert first and count == len(sampler)
    assert max(first_peak, epoch_peak) < 1_000_000 * 4 / 2, (first_peak, epoch_peak)


def test_packing_run_lengths_equals_packing_the_array():
    rng = np.random.default_rng(2)
    values, counts = rng.integers(1, 60, 50), rng.integers(1, 400, 50)
    for max_tokens, max_sentences in ((60, None), (500, None), (4000, 33)):
        expected = pack_token_batches(np.repeat(values, counts), max_tokens, max_sentences)
        assert pack_token_batches((values, counts), max_tokens, max_sentences).tolist() == expected.tolist()


def test_token_sampler_bad_input():
    with pytest.raises(ValueError, match="smaller than the longest sequence"):
        TokenBudgetBatchSampler([5, 50], [5, 5], max_tokens=20)
    with pytest.raises(ValueError, match="rank must be in"):
        TokenBudgetBatchSampler([5], [5], max_tokens=20, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="empty dataset"):
        TokenBudgetBatchSampler([], [], max_tokens=20)


# ---------------------------------------------------------------- a short run with the Trainer


def _datasets(toy_data_dir, tokenizer):
    args = DataArguments(train_file=str(toy_data_dir / "train.tsv"), validation_file=str(toy_data_dir / "valid.tsv"))
    raw = load_parallel_data(args)
    return {split: tokenize_parallel(part, tokenizer, 64, 64)[0] for split, part in raw.items()}


def _training_args(output_dir, max_steps, **extra):
    return Seq2SeqTrainingArguments(
        output_dir=str(output_dir), max_steps=max_steps, save_steps=10, logging_steps=5, report_to="none",
        use_cpu=True, seed=0, disable_tqdm=True, **extra,
    )  # fmt: skip


def _recipe(args, model):
    recipe = RecipeArguments(max_tokens=256)
    apply_paper_recipe(args, recipe, model.config.d_model, explicit={"warmup_steps", "learning_rate"})
    return recipe


@torch.no_grad()
def _mean_loss(model, trainer, dataset):
    model.eval()
    batch = trainer.data_collator([{k: dataset[i][k] for k in ("input_ids", "labels")}
                                   for i in range(64)])  # fmt: skip
    return model(**batch).loss.item()


def test_twenty_steps_lower_the_loss_and_the_checkpoint_reloads(tmp_path, toy_data_dir, toy_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(toy_tokenizer_dir)
    data = _datasets(toy_data_dir, tokenizer)
    model = tiny_model(tokenizer)
    args = _training_args(tmp_path, 20, warmup_steps=5, learning_rate=3e-3)
    trainer = build_trainer(model, tokenizer, args, _recipe(args, model), data["train"], data["validation"])
    assert args.adam_beta2 == 0.98 and args.label_smoothing_factor == 0.1  # the recipe is in force
    before = _mean_loss(model, trainer, data["train"])
    trainer.train()
    after = _mean_loss(model, trainer, data["train"])
    assert after < 0.75 * before, (before, after)
    # the logged learning rates follow the schedule (peak scale 3e-3 at step 5)
    logged = {entry["step"]: entry["learning_rate"] for entry in trainer.state.log_history if "learning_rate" in entry}
    assert sorted(logged) == [5, 10, 15, 20]
    for step, lr in logged.items():  # the rate update number `step` was made with
        assert lr == pytest.approx(3e-3 * math.sqrt(5) * min(step**-0.5, step * 5**-1.5), rel=1e-6)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "checkpoint-20")
    batch = trainer.data_collator([data["validation"][i] for i in range(4)])
    batch = {k: batch[k] for k in ("input_ids", "attention_mask", "decoder_input_ids")}
    model.eval()
    torch.testing.assert_close(reloaded(**batch).logits, model(**batch).logits, rtol=0, atol=1e-6)


def test_resume_from_checkpoint_continues_the_same_run(tmp_path, toy_data_dir, toy_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(toy_tokenizer_dir)
    data = _datasets(toy_data_dir, tokenizer)
    final = {}
    for name in ("straight", "resumed"):
        model = tiny_model(tokenizer)
        args = _training_args(tmp_path / name, 20, warmup_steps=5, learning_rate=3e-3, gradient_accumulation_steps=2)
        trainer = build_trainer(model, tokenizer, args, _recipe(args, model), data["train"])
        if name == "resumed":
            trainer.train(resume_from_checkpoint=str(tmp_path / "straight" / "checkpoint-10"))
        else:
            trainer.train()
        final[name] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for key, value in final["straight"].items():
        torch.testing.assert_close(final["resumed"][key], value, rtol=1e-5, atol=1e-6, msg=key)


def test_label_smoothing_runs_in_the_model_loss_with_the_trainers_value(tmp_path, toy_data_dir, toy_tokenizer_dir):
    """The recipe's ε = 0.1 reaches the model's loss, and gives what transformers' LabelSmoother gives."""
    from transformers.trainer_pt_utils import LabelSmoother

    tokenizer = AutoTokenizer.from_pretrained(toy_tokenizer_dir)
    data = _datasets(toy_data_dir, tokenizer)
    model = tiny_model(tokenizer)
    args = _training_args(tmp_path, 1)
    trainer = build_trainer(model, tokenizer, args, _recipe(args, model), data["train"])
    assert trainer.label_smoother is None and trainer.model_label_smoothing == 0.1
    batch = trainer.data_collator([{k: data["train"][i][k] for k in ("input_ids", "labels")}
                                   for i in range(8)])  # fmt: skip
    model.eval()
    with torch.no_grad():
        ours = trainer.compute_loss(model, dict(batch))
        unlabelled = {k: v for k, v in batch.items() if k != "labels"}
        unlabelled["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(batch["labels"])
        expected = LabelSmoother(epsilon=0.1)(model(**unlabelled), batch["labels"])
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)


def test_fused_loss_trains_as_the_unfused_one(tmp_path, toy_data_dir, toy_tokenizer_dir, monkeypatch):
    """The Trainer's steps (label smoothing 0.1, gradient accumulation over batches with padding, hence
    `num_items_in_batch`) take the fused output projection and loss, and leave the weights the unfused path leaves."""
    from vanilla_transformer.model import modeling_vanilla_transformer as modeling

    tokenizer = AutoTokenizer.from_pretrained(toy_tokenizer_dir)
    data = _datasets(toy_data_dir, tokenizer)
    fused_calls = []
    fused_loss = modeling.seq2seq_linear_cross_entropy
    monkeypatch.setattr(modeling, "seq2seq_linear_cross_entropy", lambda *a: fused_calls.append(1) or fused_loss(*a))
    final = {}
    for fused in (True, False):
        model = tiny_model(tokenizer)
        model.config.fused_output_loss = fused
        args = _training_args(
            tmp_path / str(fused), 3, warmup_steps=2, learning_rate=3e-3, gradient_accumulation_steps=2
        )
        trainer = build_trainer(model, tokenizer, args, _recipe(args, model), data["train"])
        trainer.train()
        final[fused] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        assert len(fused_calls) == 6  # 3 steps of 2 batches, all fused; none more with the switch off
    for key, value in final[False].items():
        if "k_proj.bias" not in key:  # its gradient is 0 up to rounding (softmax ignores a shift); Adam scales that up
            torch.testing.assert_close(final[True][key], value, rtol=1e-5, atol=1e-6, msg=key)


def test_bf16_autocast_and_gradient_accumulation_run(tmp_path, toy_data_dir, toy_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(toy_tokenizer_dir)
    data = _datasets(toy_data_dir, tokenizer)
    model = tiny_model(tokenizer)
    args = _training_args(tmp_path, 3, warmup_steps=2, learning_rate=3e-3, bf16=True, gradient_accumulation_steps=2)
    trainer = build_trainer(model, tokenizer, args, _recipe(args, model), data["train"])
    result = trainer.train()
    assert math.isfinite(result.training_loss) and trainer.state.global_step == 3
    assert (tmp_path / "checkpoint-3" / "model.safetensors").is_file()
    assert len(trainer.get_train_dataloader()) == len(TokenBudgetBatchSampler(
        data["train"]["source_length"], data["train"]["target_length"], max_tokens=256))  # fmt: skip


def test_time_budget_stops_training_and_saves(tmp_path, toy_data_dir, toy_tokenizer_dir):
    from vanilla_transformer.training.callbacks import TimeBudgetCallback

    tokenizer = AutoTokenizer.from_pretrained(toy_tokenizer_dir)
    data = _datasets(toy_data_dir, tokenizer)
    model = tiny_model(tokenizer)
    args = _training_args(tmp_path, 50, warmup_steps=2, learning_rate=3e-3)
    budget = TimeBudgetCallback(0.0, show_progress=False)
    trainer = build_trainer(model, tokenizer, args, _recipe(args, model), data["train"], callbacks=[budget])
    trainer.train()
    assert trainer.state.global_step == 1  # the budget was spent after the first step
    assert (tmp_path / "checkpoint-1" / "model.safetensors").is_file()


def test_time_budget_sets_the_cooldown_from_the_time_per_step(tmp_path, toy_data_dir, toy_tokenizer_dir, monkeypatch):
    """A clock that advances 1 s per step and a 40 s budget: the schedule learns at step 10 that 40 steps fit, cools
    down over the last 10 (lr_cooldown 0.25) and training stops at step 40, before max_steps and before the time."""
    from vanilla_transformer.training import callbacks
    from vanilla_transformer.training.callbacks import TimeBudgetCallback

    tokenizer = AutoTokenizer.from_pretrained(toy_tokenizer_dir)
    data = _datasets(toy_data_dir, tokenizer)
    model = tiny_model(tokenizer)
    args = _training_args(tmp_path, 500, warmup_steps=4, learning_rate=3e-3)
    args.logging_steps, args.save_steps = 1, 1000
    clock = {"now": 0.0}
    monkeypatch.setattr(callbacks.time, "monotonic", lambda: clock["now"])
    budget = TimeBudgetCallback(40.5, show_progress=False)

    class Tick(callbacks.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            clock["now"] += 1.0

    recipe = _recipe(args, model)
    recipe.lr_cooldown = 0.25
    trainer = build_trainer(model, tokenizer, args, recipe, data["train"], callbacks=[Tick(), budget])
    trainer.train()
    assert trainer.state.global_step == 40
    schedule = trainer.lr_scheduler.lr_lambdas[0]
    assert (schedule.total_steps, schedule.cooldown_steps) == (40, 10)
    rates = {entry["step"]: entry["learning_rate"] for entry in trainer.state.log_history if "learning_rate" in entry}
    noam = {step: 3e-3 * min(step**-0.5, step * 4**-1.5) * 4**0.5 for step in rates}
    assert rates[30] == pytest.approx(noam[30], rel=1e-6)  # the last update before the cooldown
    assert rates[31] == pytest.approx(noam[31], rel=1e-6)  # the first cooldown update: 10/10 of the rate
    assert rates[32] == pytest.approx(noam[32] * 0.9, rel=1e-6)
    assert rates[40] == pytest.approx(noam[40] / 10, rel=1e-6)
