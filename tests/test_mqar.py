"""The recall lab: the MQAR task is what it claims to be, the sweep records what it trained,
and the shipped sweeps are consistent with the code that made them (configs, state sizes,
parameter counts, curves)."""
import json
from dataclasses import fields

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnlab.experiments import mqar as lab
from attnlab.hybrid import HybridConfig, HybridLM, LayerSpec
from attnlab.tasks import mqar


@given(n_pairs=st.integers(1, 12), extra=st.integers(0, 12), n_values=st.integers(1, 20), seed=st.integers(0, 99),
       fraction=st.floats(0.1, 1.0))
def test_every_query_asks_for_the_value_bound_to_its_key(n_pairs, extra, n_values, seed, fraction):
    n_keys = n_pairs + extra
    n_queries = max(1, round(fraction * n_pairs))
    b = mqar(3, n_pairs, n_queries=n_queries, n_keys=n_keys, n_values=n_values, seed=seed)
    assert b.inputs.shape == b.targets.shape == (3, 2 * (n_pairs + n_queries))
    assert b.vocab == n_keys + n_values
    context = b.inputs[:, : 2 * n_pairs]
    keys, values = context[:, 0::2], context[:, 1::2]
    assert bool((keys < n_keys).all() and (values >= n_keys).all() and (values < n_keys + n_values).all())
    for row in range(3):
        assert len(set(keys[row].tolist())) == n_pairs                       # distinct keys
        binding = dict(zip(keys[row].tolist(), values[row].tolist()))
        asked = b.query_mask[row].nonzero().flatten().tolist()
        assert len(asked) == n_queries and len({b.inputs[row, i].item() for i in asked}) == n_queries
        for i in asked:
            assert i >= 2 * n_pairs
            assert b.targets[row, i].item() == binding[b.inputs[row, i].item()] == b.inputs[row, i + 1].item()
    assert torch.equal(b.inputs.gather(1, b.answer_positions()), b.targets[b.query_mask].view(3, n_queries))


def test_mqar_is_seeded():
    assert torch.equal(mqar(4, 8, seed=3).inputs, mqar(4, 8, seed=3).inputs)
    assert not torch.equal(mqar(4, 8, seed=3).inputs, mqar(4, 8, seed=4).inputs)


def test_mqar_bad_input_is_named():
    with pytest.raises(ValueError, match="n_pairs must be between 1 and n_keys=4"):
        mqar(2, 5, n_keys=4)
    with pytest.raises(ValueError, match="n_queries must be between 1 and n_pairs=3"):
        mqar(2, 3, n_queries=4)
    with pytest.raises(ValueError, match="batch and n_values must be positive"):
        mqar(0, 3)


class Oracle(torch.nn.Module):
    """Looks the answer up: logits one-hot on the value that followed the same key earlier."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab

    def forward(self, tokens):
        logits = torch.zeros(*tokens.shape, self.vocab)
        for row in range(tokens.shape[0]):
            seen = {}
            for i in range(tokens.shape[1] - 1):
                token = tokens[row, i].item()
                if token in seen:
                    logits[row, i, seen[token]] = 1.0
                else:
                    seen.setdefault(token, tokens[row, i + 1].item())
        return logits


def test_recall_accuracy_is_one_for_an_oracle_zero_for_a_key_and_the_share_of_a_constant_value():
    b = mqar(16, 6, seed=1)
    assert lab.recall_accuracy(Oracle(b.vocab), b.inputs, b.targets) == 1.0
    constant = lambda tokens: torch.zeros(*tokens.shape, b.vocab)          # always predicts token 0, a key
    assert lab.recall_accuracy(constant, b.inputs, b.targets) == 0.0
    value = int(b.targets[b.query_mask][0])                                # always predicts one value
    always = lambda tokens: torch.nn.functional.one_hot(torch.full_like(tokens, value), b.vocab).float()
    share = b.targets[b.query_mask].eq(value).double().mean().item()       # about 1/64 for a random value
    assert abs(lab.recall_accuracy(always, b.inputs, b.targets) - share) < 1e-6 and share > 0


def test_models_are_causal_with_learned_positions():
    torch.manual_seed(0)
    for architecture in lab.ARCHITECTURES:
        model = lab.build_model(lab.PointConfig(architecture, 16, n_pairs=3)).double()
        tokens = mqar(2, 3, seed=0).inputs
        changed = tokens.clone()
        changed[:, 6:] = (changed[:, 6:] + 1) % 128
        assert torch.equal(model(tokens)[:, :6], model(changed)[:, :6]), architecture


def test_positions_are_learned_and_bounded_by_max_len():
    model = HybridLM([LayerSpec("attention")], HybridConfig(vocab=8, d_model=8, n_heads=2, max_len=5))
    assert model.embed_tokens(torch.zeros(1, 5, dtype=torch.long)).shape == (1, 5, 8)
    with pytest.raises(ValueError, match="length 6; config.max_len is 5"):
        model(torch.zeros(1, 6, dtype=torch.long))
    with pytest.raises(ValueError, match="architecture must be one of"):
        lab.build_model(lab.PointConfig("transformer", 16))


def test_state_sizes_follow_the_formulas():
    L, d = 32, 16
    size = lambda arch: lab.build_model(lab.PointConfig(arch, d, n_pairs=L // 4)).state_size(L)
    assert size("attention") == 2 * 2 * L * d                             # K and V, every position, 2 layers
    assert size("sliding_window") == 2 * 2 * 8 * (d // 2)                 # one KV head, the last w positions
    assert size("linear_attention") == 2 * 2 * ((d // 2) ** 2 + d // 2)   # h (d_h² + d_h) per layer
    assert size("mamba") == 2 * 2 * d * (16 + 3)                          # d_inner (n + d_conv − 1) per layer
    assert size("hybrid") == size("mamba") // 2 + size("attention") // 2


def test_run_point_records_its_run():
    point = lab.PointConfig("attention", 8, n_pairs=2, steps=4, eval_every=2, eval_size=8, batch=4, warmup=1)
    result = lab.run_point(point)
    assert result["curve"]["step"] == [2, 4] and result["steps_run"] == 4
    assert result["accuracy"] == max(result["curve"]["accuracy"])
    assert result["solved"] == (result["accuracy"] >= point.solved_at)
    assert result["state_size"] == lab.build_model(point).state_size(8)
    json.dumps(result)


def test_sweep_writes_after_each_point_and_resumes(tmp_path, monkeypatch):
    ran = []

    def fake_run(point, progress=False):
        ran.append((point.architecture, point.d_model))
        return {"architecture": point.architecture, "d_model": point.d_model, "accuracy": 0.5}

    monkeypatch.setattr(lab, "run_point", fake_run)
    out = tmp_path / "sweep.json"
    lab.run_sweep(lab.sweep_points((8,), ("attention", "mamba")), out, progress=False, command="test")
    assert json.loads(out.read_text())["command"] == "test" and len(ran) == 2
    result = lab.run_sweep(lab.sweep_points((8, 16), ("attention", "mamba")), out, resume=True, progress=False)
    assert sorted(ran[2:]) == [("attention", 16), ("mamba", 16)]                 # only the new points ran
    assert [(r["architecture"], r["d_model"]) for r in result["points"]] == [
        ("attention", 8), ("attention", 16), ("mamba", 8), ("mamba", 16)]


# ---------------------------------------------------------------------------------------------
# Zoology's MQAR (tasks.mqar_zoology) and the grid (issue 19)
# ---------------------------------------------------------------------------------------------

from attnlab import hybrid
from attnlab.tasks import mqar_zoology, power_law_gaps


@given(n_pairs=st.integers(1, 8), extra=st.integers(0, 10), vocab=st.integers(20, 60), seed=st.integers(0, 99),
       random_filler=st.booleans())
def test_zoology_every_key_is_asked_once_for_its_value(n_pairs, extra, vocab, seed, random_filler):
    L = 4 * n_pairs + 2 * extra
    b = mqar_zoology(3, n_pairs, L, vocab=vocab, seed=seed, random_non_queries=random_filler)
    assert b.inputs.shape == b.targets.shape == (3, L) and b.vocab == vocab and b.gaps.shape == (3, n_pairs)
    half = vocab // 2
    keys, values = b.inputs[:, 0:2 * n_pairs:2], b.inputs[:, 1:2 * n_pairs:2]
    assert bool(((keys >= 1) & (keys < half)).all() and ((values >= half) & (values < vocab)).all())
    assert bool(((b.inputs >= 0) & (b.inputs < vocab)).all())
    space = (L - 2 * n_pairs) // 2
    assert bool(((b.gaps >= 1) & (b.gaps <= space)).all())
    for row in range(3):
        assert len(set(keys[row].tolist())) == len(set(values[row].tolist())) == n_pairs   # both without replacement
        assert len(set(b.gaps[row].tolist())) == n_pairs
        asked = b.query_mask[row].nonzero().flatten().tolist()
        assert asked == sorted(b.query_positions()[row].tolist())                         # one query per pair
        for j in range(n_pairs):
            position = 2 * n_pairs + 2 * (b.gaps[row, j].item() - 1)
            assert b.inputs[row, position].item() == keys[row, j].item()
            assert b.targets[row, position].item() == values[row, j].item()
        if not random_filler:
            tail = [i for i in range(2 * n_pairs, L) if i not in asked]
            assert all(b.inputs[row, i].item() == 0 for i in tail)
    assert torch.equal(b.inputs.gather(1, b.answer_positions()), b.targets[b.query_mask].view(3, n_pairs))
    assert torch.equal(b.pairs_back()[0], torch.arange(n_pairs, 0, -1))


def test_zoology_is_seeded_and_keeps_mqar_unchanged():
    assert torch.equal(mqar_zoology(4, 8, 64, seed=3).inputs, mqar_zoology(4, 8, 64, seed=3).inputs)
    assert not torch.equal(mqar_zoology(4, 8, 64, seed=3).inputs, mqar_zoology(4, 8, 64, seed=4).inputs)
    simple = mqar(2, 3, seed=0)                       # the simplified task: answers echoed, length 4P
    assert simple.inputs.shape == (2, 12) and simple.vocab == 128
    assert torch.equal(simple.inputs[:, 7::2], simple.targets[:, 6::2])


def test_power_law_gaps_follow_the_formula():
    a, space = 0.01, 24
    p = power_law_gaps(space, a)
    g = torch.arange(1, space + 1, dtype=torch.float64)
    assert torch.allclose(p, g ** (a - 1) / (g ** (a - 1)).sum()) and abs(p.sum().item() - 1) < 1e-12
    assert abs(p[0].item() / p[1].item() - 2 ** (1 - a)) < 1e-12
    assert torch.allclose(power_law_gaps(7, 1.0), torch.full((7,), 1 / 7, dtype=torch.float64))


def _within(observed: float, expected: float, n: int, sigmas: float = 4.5) -> bool:
    return abs(observed - expected) <= sigmas * (expected * (1 - expected) / n) ** 0.5


def test_gaps_are_power_law_distributed():
    """Many draws: the first pair's gap (the first draw) has exactly the power law's distribution,
    so the fraction at gap 1 and the log-log slope of the frequencies match the formula; a
    single pair's gap likewise; power_a = 1 is uniform."""
    n, a = 20_000, 0.01
    one = mqar_zoology(n, 1, 64, vocab=16, seed=5).gaps[:, 0]                 # space 31
    p = power_law_gaps(31, a)
    assert _within((one == 1).double().mean().item(), p[0].item(), n)
    freq = torch.bincount(one, minlength=32)[1:].double() / n
    slope = torch.linalg.lstsq(torch.stack([torch.log(torch.arange(1.0, 32)), torch.ones(31)], 1).double(),
                               freq.log().unsqueeze(1)).solution[0, 0].item()
    assert abs(slope - (a - 1)) < 0.1, slope
    first = mqar_zoology(n, 8, 64, vocab=32, seed=6).gaps[:, 0]                 # space 24
    assert _within((first == 1).double().mean().item(), power_law_gaps(24, a)[0].item(), n)
    uniform = mqar_zoology(n, 1, 20, vocab=16, power_a=1.0, seed=7).gaps[:, 0]  # space 9
    assert all(_within(f, 1 / 9, n) for f in (torch.bincount(uniform, minlength=10)[1:].double() / n).tolist())


def test_zoology_bad_input_is_named():
    with pytest.raises(ValueError, match="seq_len must be even and at least 4 n_pairs = 32"):
        mqar_zoology(2, 8, 30)
    with pytest.raises(ValueError, match="seq_len must be even"):
        mqar_zoology(2, 2, 17)
    with pytest.raises(ValueError, match="vocab must hold n_pairs = 8"):
        mqar_zoology(2, 8, 64, vocab=16)
    with pytest.raises(ValueError, match="batch must be a positive int"):
        mqar_zoology(0, 2, 16)
    with pytest.raises(ValueError, match="power_a must lie in"):
        mqar_zoology(2, 2, 16, power_a=0.0)


def test_short_conv_is_causal_and_counts_its_state():
    torch.manual_seed(0)
    mixer = hybrid.build_mixer("short_conv", hybrid.HybridConfig(d_model=8)).double()
    x = torch.randn(2, 10, 8, dtype=torch.float64)
    changed = x.clone()
    changed[:, 6:] += 1.0
    assert torch.equal(mixer(x)[:, :6], mixer(changed)[:, :6])
    moved = x.clone()
    moved[:, 2] += 1.0                                    # reaches tokens 2 … 5 only (kernel width 4)
    differs = (mixer(moved) - mixer(x)).abs().sum((0, 2)) > 0
    assert differs.tolist() == [False, False, True, True, True, True, False, False, False, False]
    assert mixer.state_size() == 16 * 3 and hybrid.pattern_string([hybrid.LayerSpec("short_conv")])[0] == "C"
    with pytest.raises(ValueError, match="u must be"):
        mixer(torch.randn(2, 10, 4, dtype=torch.float64))


def test_grid_models_are_causal_and_their_states_follow_the_formulas():
    L, P, d = 64, 8, 16
    size = lambda arch: lab.build_grid_model(lab.GridPoint(arch, d, seq_len=L, n_pairs=P)).state_size(L)
    assert size("attention") == 2 * 2 * L * d
    assert size("hybrid") == 2 * d * (16 + 3) + 2 * L * d
    assert size("conv_attention") == 2 * d * 3 + 2 * L * d            # the hybrid less Mamba's scan state
    assert size("hybrid_deep") == 3 * 2 * d * (16 + 3) + 2 * L * d
    assert hybrid.pattern_string(lab.build_grid_model(lab.GridPoint("hybrid_deep", d)).pattern)[0] == "MMMA"
    torch.manual_seed(0)
    tokens = mqar_zoology(2, 4, 32, vocab=256, seed=0).inputs
    changed = tokens.clone()
    changed[:, 20:] = (changed[:, 20:] + 1) % 256
    for arch in lab.GRID_ARCHITECTURES:
        model = lab.build_grid_model(lab.GridPoint(arch, 16, seq_len=32, n_pairs=4)).double()
        assert torch.equal(model(tokens)[:, :20], model(changed)[:, :20]), arch
    with pytest.raises(ValueError, match="architecture must be one of"):
        lab.build_grid_model(lab.GridPoint("transformer", 16))


TINY = dict(seq_len=32, n_pairs=4, steps=20, eval_every=10, val_size=32, test_size=64, batch=16, warmup=2)


def test_grid_point_records_val_selection_and_test_profile():
    point = lab.GridPoint("hybrid", 16, **TINY)
    r = lab.run_grid_point(point)
    assert r["curve"]["step"] == [10, 20] and r["steps_run"] == 20
    assert r["val_accuracy"] == max(r["curve"]["val_accuracy"]) or abs(
        r["val_accuracy"] - max(r["curve"]["val_accuracy"])) < 1e-4
    assert r["best_step"] in r["curve"]["step"] and r["solved"] == (r["val_accuracy"] >= point.solved_at)
    assert r["pairs_back"]["k"] == [1, 2, 3, 4] and sum(r["distance"]["count"]) == 64 * 4
    mean_back = sum(r["pairs_back"]["accuracy"]) / 4
    assert abs(mean_back - r["test_accuracy"]) < 1e-3
    assert r["state_size"] == lab.build_grid_model(point).state_size(32)
    again = lab.run_grid_point(point)                                        # same seed: same bits
    assert again["param_hash"] == r["param_hash"] and again["test_accuracy"] == r["test_accuracy"]
    json.dumps(r)


def test_recall_profile_of_an_oracle_is_perfect():
    b = mqar_zoology(8, 4, 32, vocab=64, seed=2)
    profile = lab.recall_profile(Oracle(b.vocab), b)
    assert profile["accuracy"] == 1.0 and profile["pairs_back"]["accuracy"] == [1.0] * 4


def _fake_result(point, progress=False):
    val = {1e-3: 0.5, 3e-3: 0.995, 1e-2: 0.999}[point.lr] if point.architecture == "attention" else point.lr * 10
    return {**lab.asdict(point), "val_accuracy": val, "best_step": 300 if point.lr == 1e-2 else 200,
            "test_accuracy": 0.5, "seconds": 0.0}


def test_rates_are_selected_on_validation_only():
    scan = lab.scan_points(("attention", "mamba"), ((64, 8),))
    results = [_fake_result(p) for p in scan]
    selected = lab.select_rates(results)
    # attention: 3e-3 and 1e-2 both reach 0.99, 3e-3 got there in fewer steps; mamba: the best val
    assert selected[(64, 8, "attention", 32)] == 3e-3 and selected[(64, 8, "mamba", 64)] == 1e-2
    results.append({**results[0], "stage": "seeds", "val_accuracy": 1.0, "lr": 1e-3})   # never a seeds run
    assert lab.select_rates(results) == selected
    points = lab.seed_points(selected)
    assert {p.seed for p in points} == set(lab.TEST_SEEDS) and all(p.stage == "seeds" for p in points)
    assert len(points) == 3 * len(selected)


def test_grid_runs_the_scan_first_then_seeds_and_resumes(tmp_path, monkeypatch):
    ran = []

    def fake(point, progress=False):
        ran.append(point)
        return _fake_result(point)

    monkeypatch.setattr(lab, "run_grid_point", fake)
    out = tmp_path / "grid.json"
    scan = lab.scan_points(("attention",), ((64, 8),))
    lab.run_grid(scan, out, stages=("scan",), progress=False, command="test")
    assert len(ran) == 6 and all(p.stage == "scan" for p in ran)
    result = lab.run_grid(scan, out, resume=True, progress=False, command="test 2")
    assert len(ran) == 6 + 6 and all(p.stage == "seeds" and p.lr == 3e-3 for p in ran[6:])
    saved = json.loads(out.read_text())
    assert saved["command"] == "test 2" and len(saved["points"]) == 12 == len(result["points"])
    assert {"torch", "machine", "date", "selected"} <= set(saved)
    lab.run_grid(scan, out, resume=True, progress=False)
    assert len(ran) == 12                                                        # nothing left to run
    with pytest.raises(ValueError, match="needs the scan"):
        lab.run_grid(lab.scan_points(("mamba",), ((64, 8),)), out, stages=("seeds",), resume=True, progress=False)
    with pytest.raises(ValueError, match="backend must be"):
        lab.run_grid(scan, None, backend="dask")


def test_seed_summary_counts_only_complete_configurations():
    scan = lab.scan_points(("attention", "mamba"), ((64, 8),))
    selected = lab.select_rates([_fake_result(p) for p in scan])
    runs = [{**_fake_result(p), "task": "L64 P8", "state_size": 10, "solved": p.seed == 1,
             "test_accuracy": 0.1 * p.seed} for p in lab.seed_points(selected)]
    runs = [r for r in runs if not (r["architecture"] == "mamba" and r["d_model"] == 64 and r["seed"] == 3)]
    rows = lab.seed_summary(runs)
    assert [(r["architecture"], r["d_model"]) for r in rows] == [("attention", 32), ("attention", 64), ("mamba", 32)]
    first = rows[0]
    assert first["test"] == pytest.approx([0.1, 0.2, 0.3]) and first["mean"] == pytest.approx(0.2)
    assert (first["min"], first["max"], first["solved"], first["lr"]) == (pytest.approx(0.1), pytest.approx(0.3), 1, 3e-3)


def test_grid_command_line_rejects_a_bad_task(capsys):
    with pytest.raises(SystemExit):
        lab.main(["grid", "--tasks", "64by8"])
    assert "LENGTHxPAIRS" in capsys.readouterr().err


def test_a_diverging_point_is_recorded_not_raised(monkeypatch):
    def blow_up(model, batch_fn, **kwargs):
        batch_fn(1)
        kwargs["eval_fn"](model)
        batch_fn(2)
        raise FloatingPointError("loss became nan at step 2")

    monkeypatch.setattr(lab, "train", blow_up)
    r = lab.run_grid_point(lab.GridPoint("attention", 8, **TINY))
    assert r["diverged"] and r["steps_run"] == 2 and r["curve"]["step"] == [1] and r["best_step"] == 1


@pytest.mark.skipif(not (lab.resources.files("attnlab") / "data" / lab.GRID_FILE).is_file(),
                    reason="the grid has not been run yet")
@pytest.mark.parametrize("name", [lab.GRID_FILE, "mqar_grid_l128_scan.json"])
def test_shipped_grid_matches_the_code_that_made_it(name):
    grid = lab.load_grid(name)
    assert grid["command"].startswith("python -m attnlab.experiments.mqar grid")
    assert {"torch", "machine", "date", "val_seed", "test_seed"} <= set(grid)
    default = {lab._grid_key(p) for p in lab.scan_points()}
    for r in grid["points"]:
        point = lab.GridPoint(**{f.name: r[f.name] for f in fields(lab.GridPoint)})
        if r["stage"] == "scan" and name == lab.GRID_FILE:
            assert lab._grid_key(point) in default
        model = lab.build_grid_model(point)
        assert r["state_size"] == model.state_size(point.seq_len)
        assert r["parameters"] == sum(p.numel() for p in model.parameters())
        assert r["steps_run"] <= point.steps and 0 <= r["test_accuracy"] <= 1
        assert r["solved"] == (r["val_accuracy"] >= point.solved_at)
        assert abs(r["val_accuracy"] - max(r["curve"]["val_accuracy"])) < 1e-4
        assert len(r["pairs_back"]["accuracy"]) == point.n_pairs
    selected = lab.select_rates(grid["points"])
    for r in grid["points"]:
        if r["stage"] == "seeds":          # every seeds run at the rate the scan selects
            assert r["lr"] == selected[(r["seq_len"], r["n_pairs"], r["architecture"], r["d_model"])]
