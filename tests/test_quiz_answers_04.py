"""Transfer questions of chapter 04: each answer computed with attnlab (see test_quiz_answers.py)."""

import torch
import torch.nn.functional as F

from quiz_checks import accepts, correct_option


def _probabilities(logits, temperature, top_k):
    # the distribution attnlab.models.sample_next draws from, measured by drawing from it
    from attnlab.models import sample_next
    z = torch.tensor([logits], dtype=torch.float64).expand(200_000, -1)
    draws = sample_next(z, temperature=temperature, top_k=top_k, generator=torch.Generator().manual_seed(0))
    return torch.bincount(draws[:, 0], minlength=len(logits)).double() / len(draws)


def test_04_logits_shape_8x24():
    from attnlab.models import GPTConfig, MicroGPT
    torch.manual_seed(0)
    model = MicroGPT(GPTConfig(vocab_size=50, max_len=24, d_model=48, n_heads=4))
    logits = model(torch.randint(50, (8, 24)))
    assert correct_option("04-logits-shape-8x24") == str(tuple(logits.shape))


def test_04_initial_loss_65_chars():
    loss = F.cross_entropy(torch.zeros(1, 65, dtype=torch.float64), torch.tensor([7]))   # a uniform guess
    accepts("04-initial-loss-65-chars", loss.item())


def test_04_demo_weight_unmasked():
    from attnlab.attention import scaled_dot_product_attention
    i, j = torch.arange(4.0, dtype=torch.float64)[:, None], torch.arange(8.0, dtype=torch.float64)
    q, k, v = 0.1 * (i + j), 0.1 * (i - j), 0.01 * i * j
    _, weights = scaled_dot_product_attention(q, k, v, return_weights=True)       # no mask
    accepts("04-demo-weight-unmasked", weights[0, 3].item())


def test_04_causal_uniform_entropy_256():
    from attnlab.attention import uniform_entropy
    accepts("04-causal-uniform-entropy-256", uniform_entropy(256, causal=True).mean().item())


def test_04_span_corruption_target():
    from attnlab.objectives import span_corrupt
    tokens = "Thank you for inviting me to your party last week .".split()
    _, target = span_corrupt(tokens, [(tokens.index("inviting"), 1), (tokens.index("last"), 1)],
                             sentinels=["<X>", "<Y>", "<Z>"])
    assert correct_option("04-span-corruption-target") == " ".join(target)


def test_04_weight_tying_savings_50():
    from attnlab.blocks import count_parameters
    from attnlab.models import GPTConfig, MicroGPT
    sizes = {tie: count_parameters(MicroGPT(GPTConfig(vocab_size=50, d_model=48, tie_weights=tie)))
             for tie in (True, False)}
    accepts("04-weight-tying-savings-50", sizes[False] - sizes[True])


def test_04_temperature_probability():
    z = torch.tensor([2.0, 1.0, 0.0], dtype=torch.float64)
    p = torch.softmax(z / 0.5, 0)
    assert abs(_probabilities([2.0, 1.0, 0.0], 0.5, None)[0] - p[0]) < 0.005
    accepts("04-temperature-probability", p[0].item())


def test_04_top_k_renormalised():
    from attnlab import diagrams
    z = torch.tensor([2.0, 1.0, 0.0, -1.0], dtype=torch.float64)
    kept = z.masked_fill(z < torch.topk(z, 2).values[-1], float("-inf"))
    p = torch.softmax(kept, 0)
    drawn = _probabilities([2.0, 1.0, 0.0, -1.0], 1.0, 2)
    assert abs(drawn[1] - p[1]) < 0.005 and drawn[2:].sum() == 0
    assert diagrams.sampling_pipeline((2.0, 1.0, 0.0, -1.0), ("a", "b", "c", "d"), 1.0, 2)  # draws
    accepts("04-top-k-renormalised", p[1].item())


def test_04_parameters_2x96():
    from attnlab.blocks import count_parameters
    from attnlab.models import GPTConfig, MicroGPT
    with torch.device("meta"):
        model = MicroGPT(GPTConfig(vocab_size=103, max_len=64, n_layers=2, d_model=96, n_heads=4))
    accepts("04-parameters-2x96", count_parameters(model))


def test_04_add_alpha_smoothing():
    from attnlab.experiments.microgpt import count_bigram
    q, u, space = 7, 9, 0                                   # any three ids of a 103-character vocabulary
    ids = torch.tensor([q, u] * 98 + [q, space] * 2)
    logp = count_bigram(ids, 103, 0.5)
    accepts("04-add-alpha-smoothing", logp[q, u].exp().item())
