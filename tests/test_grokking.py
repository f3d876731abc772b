"""Grokking: the modular-addition task, the Fourier probe on planted embeddings, the shipped run."""
import math

import pytest
import torch

from attnlab.grokking import (
    FULL_CONFIG, FULL_RUN_COMMAND, GrokkingConfig, ModularMLP, fourier_power, fourier_sparsity, key_frequencies,
    load_full_run, run_grokking, top_share,
)
from attnlab.tasks import modular_addition


def test_modular_addition_is_the_full_table_split_once():
    data = modular_addition(13, 0.3, seed=4)
    inputs = torch.cat([data.train_inputs, data.val_inputs])
    targets = torch.cat([data.train_targets, data.val_targets])
    assert len(data.train_inputs) == round(0.3 * 169) and len(inputs) == 169
    assert len({tuple(r) for r in inputs.tolist()}) == 169                  # every pair exactly once
    assert torch.equal(targets, (inputs[:, 0] + inputs[:, 1]) % 13)
    again = modular_addition(13, 0.3, seed=4)
    assert torch.equal(again.train_inputs, data.train_inputs)
    assert not torch.equal(modular_addition(13, 0.3, seed=5).train_inputs, data.train_inputs)
    with pytest.raises(ValueError, match="train_fraction"):
        modular_addition(13, 1.0)
    with pytest.raises(ValueError, match="p must be"):
        modular_addition(1)


def _planted(p, freqs, amps, d=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(p, dtype=torch.float64).unsqueeze(-1)
    cols = []
    for k, a in zip(freqs, amps):
        phase = torch.rand(1, 3, generator=g, dtype=torch.float64) * 2 * math.pi
        cols.append(a * torch.cos(2 * math.pi * k * t / p + phase))
    return torch.cat(cols, dim=-1) @ torch.linalg.qr(torch.randn(3 * len(freqs), d, generator=g,
                                                                  dtype=torch.float64).T)[0].T


def test_fourier_probe_finds_planted_frequencies():
    p = 31
    emb = _planted(p, [3, 11], [2.0, 1.0])
    power = fourier_power(emb)
    assert power.shape == (16,) and power.sum().item() == pytest.approx(1.0)
    assert power[3].item() == pytest.approx(0.8, abs=1e-9) and power[11].item() == pytest.approx(0.2, abs=1e-9)
    assert key_frequencies(emb, top=2) == [3, 11]
    assert fourier_sparsity(emb, top=2) == pytest.approx(1.0, abs=1e-12)
    assert top_share(power, top=1) == pytest.approx(0.8, abs=1e-9)           # the stored-spectrum form
    with pytest.raises(ValueError, match="top must be between"):
        fourier_sparsity(emb, top=16)


def test_fourier_power_is_parseval_against_the_dft_matrix():
    for p in (10, 11):                                   # even p has an unpaired Nyquist frequency
        emb = torch.randn(p, 5, dtype=torch.float64)
        t = torch.arange(p, dtype=torch.float64)
        energy = []
        for k in range(p // 2 + 1):
            basis = torch.exp(-2j * math.pi * k * t / p)
            coeff = (basis.unsqueeze(-1) * emb).sum(0)
            pair = 1 if k == 0 or (p % 2 == 0 and k == p // 2) else 2
            energy.append(pair * coeff.abs().square().sum().item() / p)
        assert sum(energy) == pytest.approx(emb.square().sum().item())    # Parseval
        assert torch.allclose(fourier_power(emb), torch.tensor(energy, dtype=torch.float64) / sum(energy))
    rand = fourier_sparsity(torch.randn(97, 128, generator=torch.Generator().manual_seed(0)), top=5)
    assert 5 / 48 * 0.7 < rand < 5 / 48 * 1.6                            # spread: about top / (K - 1)
    with pytest.raises(ValueError, match=r"shape \(p, d_embed\)"):
        fourier_power(torch.randn(5))


def test_mlp_shapes():
    model = ModularMLP(11, 8, 16)
    assert model(torch.tensor([[1, 2], [10, 10]])).shape == (2, 11)
    with pytest.raises(ValueError, match=r"shape \(b, 2\)"):
        model(torch.tensor([1, 2]))


def test_short_run_records_every_evaluation():
    run = run_grokking(GrokkingConfig(p=11, d_embed=8, width=16, steps=30, eval_every=10), progress=False)
    assert run.steps == [10, 20, 30]
    for key in ("train_acc", "val_acc", "train_loss", "val_loss", "weight_norm", "sparsity", "spectra"):
        assert len(getattr(run, key)) == 3
    assert len(run.spectra[0]) == 6 and run.first_step("train_acc", 2.0) is None


def test_shipped_full_run_says_how_it_was_made():
    record = load_full_run()
    assert record["command"] == FULL_RUN_COMMAND and record["seed"] == 0 and record["complete"]
    assert record["config"]["p"] == FULL_CONFIG.p and record["config"]["train_fraction"] == FULL_CONFIG.train_fraction
    n = len(record["steps"])
    assert record["steps"][-1] == FULL_CONFIG.steps
    assert all(len(record[k]) == n for k in ("train_acc", "val_acc", "train_loss", "val_loss", "sparsity"))
    assert len(record["spectra"][0]) == FULL_CONFIG.p // 2 + 1
