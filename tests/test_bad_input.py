"""Bad input gets a clear error, at every public entry point of the library.

The design notes' rule: bad input raises a ValueError or TypeError whose message names the
argument (and says what it got and what it needed); an edge input with a documented result (a
fully masked row gives zeros) gives that result, with no NaN. Never a raw error from inside torch
or Python (RuntimeError, IndexError, ZeroDivisionError, NotImplementedError, ...), never a silent NaN.

Every public function and class defined in a library module (found with ``inspect``) must be in
BAD (calls that must raise, with the argument the message must name), in EDGE (documented
results), or in EXEMPT with the reason. A new entry point without a case fails
``test_every_entry_point_is_covered``.
"""
import importlib
import inspect
import math
import pkgutil
import re

import pytest
import torch
from hypothesis import given, strategies as st
from torch import nn

import attnlab
from attnlab import (
    attention, blocks, diff_attention, flash, grokking, hybrid, hyena, icl, kernels, kv_cache, linear, mla, mod, models,
    moe, nsa, numerics, objectives, position_models, positional, quant, rglru, ring, scaling, schedules, sparse,
    s4d, speculative, ssd, ssm, tasks, tradeoff, train,
)
from attnlab import recall

# Modules that compute no tensors of their own (figures, widgets, quiz banks, timing, command-line sweeps).
EXCLUDED_MODULES = {
    "bench": "timing and peak-memory helpers for notebooks and benchmarks/",
    "diagrams": "concept diagrams drawn as SVG",
    "quiz": "quiz banks (tested in test_quiz.py)",
    "source": "shows a library object's source as HTML (tested in test_source.py)",
    "viz": "plotly figure builders",
    "widgets": "ipywidgets explorers on the viz builders",
    "experiments": "command-line training sweeps; their library calls are covered here",
}

EXEMPT = {
    "grokking.GrokkingConfig": "dataclass of settings; run_grokking is fed a bad one below",
    "grokking.GrokkingRun": "record of curves that run_grokking fills in",
    "grokking.run_to_dict": "serialises a GrokkingRun to JSON; no tensor or size argument",
    "grokking.load_full_run": "no arguments: reads package data",
    "grokking.main": "command line; argparse reports bad arguments itself",
    "hybrid.HybridConfig": "dataclass of sizes; HybridLM and the mixers it builds are fed bad input below",
    "hybrid.ModelConfig": "frozen dataclass of a published configuration; parameter_count is covered",
    "models.GPTConfig": "dataclass of sizes; MicroGPT is fed bad input below",
    "position_models.PositionConfig": "frozen dataclass of sizes; PositionLM is fed bad input below",
    "tasks.RegressionPrompts": "record made by in_context_regression (covered)",
    "tasks.ModularAddition": "record made by modular_addition (covered)",
    "tasks.RetrievalPrompts": "record made by key_value_retrieval (covered)",
    "tasks.MQARBatch": "record made by mqar (covered)",
    "tasks.SelectiveCopyBatch": "record made by selective_copying (covered)",
    "tasks.ZoologyMQARBatch": "record made by mqar_zoology (covered)",
    "tradeoff.Form": "frozen dataclass naming one benchmark form",
    "tradeoff.pivot": "reshapes result rows (dicts); no tensor or size argument",
    "tradeoff.load_precomputed": "no arguments: reads package data",
    "train.History": "dataclass record that train fills in",
    "kernels.load_triton": "no arguments: imports the optional Triton (tested in test_kernels.py)",
    "kernels.have_triton": "no arguments: reports whether Triton imports (tested in test_kernels.py)",
    "kernels.flash_forward_kernel": "the Triton kernel body, launched by triton_flash_attention (covered)",
}


def library_entry_points() -> dict[str, object]:
    """'module.name' -> every public function and class defined in (not imported into) a library module."""
    found = {}
    for info in pkgutil.iter_modules(attnlab.__path__):
        if info.name.startswith("_") or info.name in EXCLUDED_MODULES:
            continue
        module = importlib.import_module(f"attnlab.{info.name}")
        for name, obj in vars(module).items():
            if (not name.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj))
                    and obj.__module__ == module.__name__):
                found[f"{info.name}.{name}"] = obj
    return found


# ---------------------------------------------------------------------------------------------
# Small inputs
# ---------------------------------------------------------------------------------------------

g = torch.Generator().manual_seed(0)
Q = torch.randn(1, 2, 4, 8, generator=g)                  # a valid (b, h, n, d)
INT = torch.ones(1, 2, 4, 8, dtype=torch.long)            # the same shape, integer dtype
NEG = -torch.rand(1, 2, 4, 8, generator=g)                 # log decays <= 0
SCAN = dict(u=torch.randn(1, 2, 6, generator=g), delta=torch.rand(1, 2, 6, generator=g),
            A=torch.rand(2, 3, generator=g) + 0.1, B=torch.randn(1, 3, 6, generator=g), C=torch.randn(1, 3, 6, generator=g))
SSD = dict(x=torch.randn(1, 6, 4, 2, generator=g), log_a=-torch.rand(1, 6, 4, generator=g),
           B=torch.randn(1, 6, 2, 3, generator=g), C=torch.randn(1, 6, 2, 3, generator=g))
TINY_GPT = models.GPTConfig(vocab_size=10, max_len=8, n_layers=1, d_model=8, n_heads=2)


def tiny_gpt():
    torch.manual_seed(0)
    return models.MicroGPT(TINY_GPT)


def uniform(prefix):
    return torch.full((3,), 1 / 3, dtype=torch.float64)


def prompts():
    return tasks.in_context_regression(2, 5, 3)


# ---------------------------------------------------------------------------------------------
# Bad input: each call must raise ValueError or TypeError naming the argument
# ---------------------------------------------------------------------------------------------

BAD = {
    # attention
    "attention.causal_mask": [(lambda: attention.causal_mask(-1), "n")],
    "attention.repeat_kv": [(lambda: attention.repeat_kv(Q, 0), "n_rep")],
    "attention.masked_scores": [(lambda: attention.masked_scores(torch.zeros(2, 4, 5), torch.ones(3, 5).bool()), "mask")],
    "attention.scaled_dot_product_attention": [(lambda: attention.scaled_dot_product_attention(INT, INT, INT), "q"),
                                               (lambda: attention.scaled_dot_product_attention(Q, Q[..., :4], Q), "k"),
                                               (lambda: attention.scaled_dot_product_attention(Q, Q.double(), Q), "k")],
    "attention.MultiHeadAttention": [(lambda: attention.MultiHeadAttention(8, 0), "n_heads"),
                                     (lambda: attention.MultiHeadAttention(8, 2)(torch.randn(2, 5, 6)), "x"),
                                     (lambda: attention.MultiHeadAttention(8, 2)(
                                         torch.randn(2, 5, 8), context_kv=(torch.randn(2, 2, 3, 4),
                                                                           torch.randn(2, 1, 3, 4))), "context_kv"),
                                     (lambda: attention.MultiHeadAttention(8, 2).context_kv(torch.randn(2, 3, 6)),
                                      "context")],
    "attention.uniform_entropy": [(lambda: attention.uniform_entropy(0), "n")],
    # blocks
    "blocks.LayerNorm": [(lambda: blocks.LayerNorm(8)(torch.randn(2, 5)), "x"),
                         (lambda: blocks.LayerNorm(8)(torch.ones(2, 8, dtype=torch.long)), "x")],
    "blocks.RMSNorm": [(lambda: blocks.RMSNorm(8)(torch.randn(2, 5)), "x")],
    "blocks.FeedForward": [(lambda: blocks.FeedForward(8, activation="tanh"), "activation"),
                           (lambda: blocks.FeedForward(8)(torch.randn(2, 5)), "x")],
    "blocks.TransformerBlock": [(lambda: blocks.TransformerBlock(8, 2, norm_position="middle"), "norm_position")],
    "blocks.count_parameters": [(lambda: blocks.count_parameters(torch.ones(3)), "module")],
    "blocks.approx_transformer_parameters": [(lambda: blocks.approx_transformer_parameters(-1, 64), "n_layers")],
    "blocks.block_flops": [(lambda: blocks.block_flops(-1, 64), "n")],
    # diff_attention
    "diff_attention.lambda_init": [(lambda: diff_attention.lambda_init(0), "layer")],
    "diff_attention.reparameterised_lambda": [
        (lambda: diff_attention.reparameterised_lambda(torch.ones(4), torch.ones(4), torch.ones(4), torch.ones(3), 0.2),
         "lk2")],
    "diff_attention.differential_attention": [
        (lambda: diff_attention.differential_attention(Q, Q, Q[..., :3, :], Q, Q, 0.5), "q2")],
    "diff_attention.DifferentialAttention": [(lambda: diff_attention.DifferentialAttention(10, 3), "d_model"),
                                             (lambda: diff_attention.DifferentialAttention(8, 0), "n_heads"),
                                             (lambda: diff_attention.DifferentialAttention(8, 2, lambda_mode="off"),
                                              "lambda_mode")],
    "diff_attention.attention_on_target": [
        (lambda: diff_attention.attention_on_target(torch.rand(2, 2, 5), torch.zeros(3, dtype=torch.long)), "target")],
    "diff_attention.RetrievalModel": [(lambda: diff_attention.RetrievalModel(4, 4, attention="sparse"), "attention"),
                                      (lambda: diff_attention.RetrievalModel(6, 4, group_size=4), "group_size")],
    "diff_attention.retrieval_loss": [
        (lambda: diff_attention.retrieval_loss(diff_attention.RetrievalModel(4, 4, d_model=8, n_heads=2),
                                               torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, dtype=torch.long)),
         "targets")],
    # flash
    "flash.online_softmax": [(lambda: flash.online_softmax(torch.randn(3, 5), 0), "block")],
    "flash.flash_attention": [(lambda: flash.flash_attention(INT, INT, INT), "q"),
                              (lambda: flash.flash_attention(Q, Q, Q, block_q=0), "block_q"),
                              (lambda: flash.flash_attention(Q, Q, Q, block_k=2.5), "block_k")],
    "flash.flash_forward": [(lambda: flash.flash_forward(Q, Q, Q, block_k=0), "block_k"),
                            (lambda: flash.flash_forward(Q, Q[:, :1], Q[:, :1]), "k")],
    "flash.flash_trace": [(lambda: flash.flash_trace(Q, Q, Q, block_q=0), "block_q")],
    "flash.hbm_accesses_standard": [(lambda: flash.hbm_accesses_standard(-1, 64), "n")],
    "flash.hbm_accesses_flash": [(lambda: flash.hbm_accesses_flash(1024, 64, 0), "sram")],
    "flash.hbm_accesses_flash2": [(lambda: flash.hbm_accesses_flash2(1024, 0, 4096), "d"),
                                  (lambda: flash.hbm_accesses_flash2(1024, 64, 4096, block_r=0), "block_r")],
    "flash.fa1_block_sizes": [(lambda: flash.fa1_block_sizes(0, 64), "sram")],
    "flash.fa2_block_sizes": [(lambda: flash.fa2_block_sizes(4096, -1), "d")],
    # kernels (the arguments are checked before Triton is imported, so these run without it)
    "kernels.triton_flash_attention": [(lambda: kernels.triton_flash_attention(INT, INT, INT), "q"),
                                       (lambda: kernels.triton_flash_attention(Q, Q[..., :4], Q), "k"),
                                       (lambda: kernels.triton_flash_attention(*(torch.zeros(1, 1, 4, 16),) * 3, block_q=48), "block_q"),
                                       (lambda: kernels.triton_flash_attention(Q[..., :4], Q[..., :4], Q[..., :4]),
                                        "d")],
    "kernels.check_kernel_file": [(lambda: kernels.check_kernel_file("/nonexistent/kernel.py"), "path")],
    # grokking
    "grokking.ModularMLP": [(lambda: grokking.ModularMLP(7, 8, 16)(torch.zeros(3, 3, dtype=torch.long)), "pairs")],
    "grokking.fourier_power": [(lambda: grokking.fourier_power(torch.randn(7)), "embedding")],
    "grokking.fourier_sparsity": [(lambda: grokking.fourier_sparsity(torch.randn(7, 4), top=0), "top")],
    "grokking.top_share": [(lambda: grokking.top_share(torch.rand(4), 0), "top")],
    "grokking.key_frequencies": [(lambda: grokking.key_frequencies(torch.randn(7, 4), top=0), "top"),
                                 (lambda: grokking.key_frequencies(torch.randn(7, 4), top=9), "top")],
    "grokking.run_grokking": [(lambda: grokking.run_grokking(grokking.GrokkingConfig(p=1), progress=False), "p")],
    # hybrid
    "hybrid.LayerSpec": [(lambda: hybrid.LayerSpec("conv"), "mixer"), (lambda: hybrid.LayerSpec("mamba", "glu"), "ffn")],
    "hybrid.jamba_pattern": [(lambda: hybrid.jamba_pattern(attn_offset=8), "attn_offset"),
                             (lambda: hybrid.jamba_pattern(expert_period=0), "expert_period")],
    "hybrid.zamba_pattern": [(lambda: hybrid.zamba_pattern(0), "n_mamba")],
    "hybrid.zamba_shared_layers": [(lambda: hybrid.zamba_shared_layers(76, 6, offset=6), "offset"),
                                   (lambda: hybrid.zamba_shared_layers(76, 0), "shared_every")],
    "hybrid.griffin_pattern": [(lambda: hybrid.griffin_pattern(6, -1), "recurrent_per_attention"),
                               (lambda: hybrid.griffin_pattern(0), "n_layers")],
    "hybrid.striped_hyena_pattern": [(lambda: hybrid.striped_hyena_pattern(4, [7]), "attention_layers"),
                                     (lambda: hybrid.striped_hyena_pattern(0), "n_layers")],
    "hybrid.uniform_pattern": [(lambda: hybrid.uniform_pattern("conv", 2), "mixer"),
                               (lambda: hybrid.uniform_pattern("mamba", 0), "n_layers")],
    "hybrid.pattern_string": [(lambda: hybrid.pattern_string(["mamba"]), "pattern")],
    "hybrid.attention_fraction": [(lambda: hybrid.attention_fraction([]), "pattern"),
                                  (lambda: hybrid.attention_fraction([hybrid.LayerSpec("shared_attention", None)]),
                                   "pattern")],
    "hybrid.decode_state_numbers": [(lambda: hybrid.decode_state_numbers([torch.zeros(2)]), "state")],
    "hybrid.decode_state_bytes": [(lambda: hybrid.decode_state_bytes(None), "state")],
    "hybrid.ShortConv": [(lambda: hybrid.ShortConv(8)(torch.randn(1, 5, 4)), "u"),
                         (lambda: hybrid.ShortConv(8, d_conv=0), "d_conv")],
    "hybrid.CausalSelfAttention": [(lambda: hybrid.CausalSelfAttention(8, 2)(torch.randn(5, 8)), "x"),
                                   (lambda: hybrid.CausalSelfAttention(8, 2).step(
                                       torch.randn(1, 1, 8), hybrid.CausalSelfAttention(8, 2).init_state(1)), "x_t"),
                                   (lambda: hybrid.CausalSelfAttention(8, 2).init_state(0), "batch")],
    "hybrid.CausalLinearAttention": [(lambda: hybrid.CausalLinearAttention(8, 3), "d_model"),
                                     (lambda: hybrid.CausalLinearAttention(8, 2)(torch.randn(5, 8)), "x")],
    "hybrid.SharedAttentionBlock": [
        (lambda: hybrid.SharedAttentionBlock(8, 2)(torch.randn(1, 5, 8), torch.randn(1, 4, 8)), "embeddings")],
    "hybrid.build_mixer": [(lambda: hybrid.build_mixer("conv", hybrid.HybridConfig()), "kind")],
    "hybrid.HybridLayer": [(lambda: hybrid.HybridLayer(hybrid.LayerSpec("shared_attention", None), hybrid.HybridConfig()),
                            "shared")],
    "hybrid.HybridLM": [(lambda: hybrid.HybridLM([]), "pattern"),
                        (lambda: hybrid.HybridLM([hybrid.LayerSpec("attention")],
                                                 hybrid.HybridConfig(vocab=10, d_model=8, n_heads=2)).state_size(-3),
                         "seq_len"),
                        (lambda: hybrid.HybridLM([hybrid.LayerSpec("attention")],
                                                 hybrid.HybridConfig(vocab=10, d_model=8, n_heads=2))(torch.randn(1, 5)),
                         "tokens"),
                        (lambda: hybrid.HybridLM([hybrid.LayerSpec("mamba")], hybrid.HybridConfig(vocab=10, d_model=8))
                         .step(torch.tensor([[1]]), {}), "tokens_t"),
                        (lambda: hybrid.HybridLM([hybrid.LayerSpec("mamba")], hybrid.HybridConfig(vocab=10, d_model=8))
                         .step(torch.tensor([1]), {}), "state"),
                        (lambda: hybrid.HybridLM([hybrid.LayerSpec("mamba")], hybrid.HybridConfig(vocab=10, d_model=8))
                         .generate(torch.tensor([1, 2]), 3), "prompt"),
                        (lambda: hybrid.HybridLM([hybrid.LayerSpec("mamba")], hybrid.HybridConfig(vocab=10, d_model=8))
                         .generate(torch.tensor([[1, 2]]), -1), "max_new_tokens")],
    "hybrid.mamba_parameters": [(lambda: hybrid.mamba_parameters(0), "d_model")],
    "hybrid.attention_parameters": [(lambda: hybrid.attention_parameters(64, 0, 1), "n_heads")],
    "hybrid.ffn_parameters": [(lambda: hybrid.ffn_parameters(-1, 4), "d_model")],
    "hybrid.parameter_count": [(lambda: hybrid.parameter_count("Jamba-v0.1"), "config")],
    "hybrid.ssm_state_bytes": [(lambda: hybrid.ssm_state_bytes(-1, 64), "n_layers")],
    "hybrid.attention_layer_flops": [(lambda: hybrid.attention_layer_flops(-1, 64), "n")],
    "hybrid.mamba_layer_flops": [(lambda: hybrid.mamba_layer_flops(-1, 64), "n")],
    "hybrid.forward_flops": [(lambda: hybrid.forward_flops(1024, 64, 4, 1.5), "attn_fraction")],
    "hybrid.local_exponent": [(lambda: hybrid.local_exponent([1, 2], [1.0]), "flops"),
                              (lambda: hybrid.local_exponent([0, 2], [1.0, 2.0]), "ns")],
    "hybrid.mixing_matrix": [(lambda: hybrid.mixing_matrix(nn.Identity(), torch.randn(1, 4, 2)), "x")],
    "hybrid.semiseparable_matrix": [
        (lambda: hybrid.semiseparable_matrix(torch.rand(5), -torch.rand(3), torch.randn(5, 2), torch.randn(5, 3)), "B")],
    "hybrid.lower_block_rank": [(lambda: hybrid.lower_block_rank(torch.randn(4)), "matrix")],
    # hyena
    "hyena.causal_conv_direct": [(lambda: hyena.causal_conv_direct(torch.randn(1, 2, 5), torch.randn(2, 4)), "h")],
    "hyena.toeplitz": [(lambda: hyena.toeplitz(torch.tensor(1.0)), "h")],
    "hyena.ModalFilter": [(lambda: hyena.ModalFilter(2)(-1), "length")],
    "hyena.HyenaOperator": [(lambda: hyena.HyenaOperator(8, method="ssm"), "method"),
                            (lambda: hyena.HyenaOperator(8).step(torch.randn(1, 4), hyena.HyenaOperator(8).init_state(1)),
                             "u_t"),
                            (lambda: hyena.HyenaOperator(8)(torch.randn(1, 5, 4)), "u")],
    "hyena.conv_flops": [(lambda: hyena.conv_flops(16, 4, "ssm"), "method"),
                         (lambda: hyena.conv_flops(0, 4, "fft"), "length")],
    # icl
    "icl.prompt_tokens": [(lambda: icl.prompt_tokens(torch.randn(2, 3)), "prompts")],
    "icl.linear_self_attention": [(lambda: icl.linear_self_attention(torch.randn(2, 4, 3), torch.eye(4), torch.eye(4)),
                                   "w_kq")],
    "icl.gd_weights": [(lambda: icl.gd_weights(0, 0.1), "d")],
    "icl.gd_predictions": [(lambda: icl.gd_predictions(prompts(), 0.1, 0), "steps"),
                           (lambda: icl.gd_predictions(prompts(), [0.1], 2), "eta")],
    "icl.ridge_prediction": [(lambda: icl.ridge_prediction(torch.randn(2), 0.1), "prompts")],
    "icl.LinearSelfAttentionStack": [(lambda: icl.LinearSelfAttentionStack(3)(torch.randn(2, 4, 3)), "tokens")],
    "icl.effective_step_size": [(lambda: icl.effective_step_size(torch.eye(4), torch.eye(3)), "w_pv")],
    # kv_cache
    "kv_cache.LayerKVCache": [(lambda: kv_cache.LayerKVCache(0, 1, 4, 2), "batch"),
                              (lambda: kv_cache.LayerKVCache(1, 1, 4, 2).append(torch.randn(1, 1, 2, 3),
                                                                               torch.randn(1, 1, 2, 3)), "k")],
    "kv_cache.KVCache": [(lambda: kv_cache.KVCache(0, 1, 1, 4, 2), "n_layers")],
    "kv_cache.kv_cache_bytes": [(lambda: kv_cache.kv_cache_bytes(32, 8, 128, -1), "seq_len")],
    "kv_cache.mla_cache_bytes": [(lambda: kv_cache.mla_cache_bytes(-1, 512, 64, 10), "n_layers")],
    "kv_cache.CacheSpec": [(lambda: kv_cache.CacheSpec("toy", 1, 1, 1, 1).bytes(-1), "seq_len")],
    "kv_cache.variants": [(lambda: kv_cache.variants(n_heads=0), "n_heads")],
    "kv_cache.decode_flops": [(lambda: kv_cache.decode_flops(0, 4, 64, cached=True), "prompt_len")],
    # linear
    "linear.elu_feature": [(lambda: linear.elu_feature(INT), "x")],
    "linear.relu_feature": [(lambda: linear.relu_feature(INT), "x")],
    "linear.orthogonal_gaussian": [(lambda: linear.orthogonal_gaussian(0, 4), "m"),
                                   (lambda: linear.orthogonal_gaussian(4, 0), "d")],
    "linear.favor_feature": [(lambda: linear.favor_feature(torch.randn(2, 4), torch.randn(3, 5)), "omega")],
    "linear.linear_attention": [(lambda: linear.linear_attention(Q, Q, Q, causal=True, method="chunked", chunk=0), "chunk"),
                                (lambda: linear.linear_attention(INT, INT, INT), "q"),
                                (lambda: linear.linear_attention(Q[..., :0, :], Q[..., :0, :], Q[..., :0, :],
                                                                 causal=True, method="recurrent"), "q")],
    "linear.gated_linear_attention": [
        (lambda: linear.gated_linear_attention(Q, Q, Q, NEG, method="chunked", chunk=0), "chunk"),
        (lambda: linear.gated_linear_attention(Q, Q, Q, NEG, method="chunked_matmul", sub_chunk=0), "sub_chunk"),
        (lambda: linear.gated_linear_attention(Q, Q, Q, -NEG), "log_decay"),
        (lambda: linear.gated_linear_attention(Q, Q[:, :1], Q, NEG), "k")],
    # mla, mod, models, moe
    "mla.MultiHeadLatentAttention": [(lambda: mla.MultiHeadLatentAttention(16, 2, 8, 8, 3), "d_rope"),
                                     (lambda: mla.MultiHeadLatentAttention(16, 2, 8, 8, 4)(torch.randn(1, 5, 8)), "x")],
    "mla.mla_parameters": [(lambda: mla.mla_parameters(16, 2, 8, 0, 4), "d_latent")],
    "moe.moe_model_parameters": [(lambda: moe.moe_model_parameters(
        n_layers=2, n_dense_layers=0, d_model=8, d_ff_dense=16, d_ff_expert=4, n_routed=4, n_shared=0, top_k=5,
        attention_per_layer=0, vocab=10), "top_k")],
    "mod.routed_tokens": [(lambda: mod.routed_tokens(0.0, 8), "capacity")],
    "mod.top_k_route": [(lambda: mod.top_k_route(torch.randn(8), 2), "scores"),
                        (lambda: mod.top_k_route(torch.randn(1, 4), 5), "k")],
    "mod.block_flops_fraction": [(lambda: mod.block_flops_fraction(0.5, 0, 64), "length")],
    "mod.MixtureOfDepths": [(lambda: mod.MixtureOfDepths(8, 2, 1.5), "capacity"),
                            (lambda: mod.MixtureOfDepths(8, 2, 0.5)(torch.randn(5, 8)), "x")],
    "models.MicroGPT": [(lambda: models.MicroGPT({"vocab_size": 10}), "config"),
                        (lambda: tiny_gpt()(torch.randn(1, 4)), "idx")],
    "models.sample_next": [(lambda: models.sample_next(torch.randn(2, 5), temperature=0), "temperature"),
                           (lambda: models.sample_next(torch.randn(2, 5), top_k=0), "top_k")],
    "models.generate": [(lambda: models.generate(tiny_gpt(), torch.zeros(4, dtype=torch.long), 2), "idx"),
                        (lambda: models.generate(tiny_gpt(), torch.zeros(1, 2, dtype=torch.long), -1), "max_new_tokens")],
    "position_models.PositionalAttention": [
        (lambda: position_models.PositionalAttention(8, 2, "rope")(torch.randn(1, 5, 6)), "x")],
    "position_models.PositionBlock": [
        (lambda: position_models.PositionBlock(position_models.PositionConfig(10, d_model=8, n_heads=2))(
            torch.randn(1, 5, 6)), "x")],
    "position_models.PositionLM": [
        (lambda: position_models.PositionLM(position_models.PositionConfig(10, scheme="xpos")), "scheme"),
        (lambda: position_models.PositionLM(position_models.PositionConfig(10, d_model=8, n_heads=2))(
            torch.randn(1, 5)), "idx")],
    "moe.switch_load_balancing_loss": [
        (lambda: moe.switch_load_balancing_loss(torch.rand(4, 3), torch.zeros(4, 1, dtype=torch.long), 4), "probs")],
    "moe.expert_load": [(lambda: moe.expert_load(torch.zeros(4, 1), 4), "expert_index"),
                        (lambda: moe.expert_load(torch.tensor([[5]]), 4), "expert_index")],
    "moe.TopKRouter": [(lambda: moe.TopKRouter(8, 4, top_k=5), "top_k")],
    "moe.MoEFeedForward": [(lambda: moe.MoEFeedForward(8, 16, 4, top_k=0), "top_k"),
                           (lambda: moe.MoEFeedForward(8, 16, 4)(torch.randn(2, 5, 6)), "x")],
    "moe.toy_routing_run": [(lambda: moe.toy_routing_run(0.0, n_experts=0), "n_experts")],
    # nsa, numerics, objectives
    "nsa.compress": [(lambda: nsa.compress(torch.randn(1, 8, 4), 0), "block")],
    "nsa.selection_mask": [(lambda: nsa.selection_mask(torch.rand(1, 1, 8, 2), 8, 0, 2), "block"),
                           (lambda: nsa.selection_mask(torch.rand(1, 1, 8, 3), 8, 4, 2), "importance")],
    "nsa.native_sparse_attention": [(lambda: nsa.native_sparse_attention(Q, Q, Q, torch.rand(1, 2, 4, 2)), "gates"),
                                    (lambda: nsa.native_sparse_attention(INT, INT, INT, torch.rand(1, 2, 4, 3)), "q")],
    "nsa.keys_attended": [(lambda: nsa.keys_attended(64, block=0, n_selected=2, window=8), "block"),
                          (lambda: nsa.keys_attended(64, block=8, n_selected=2, window=8, compress_block=0),
                           "compress_block")],
    "numerics.max_abs_error": [(lambda: numerics.max_abs_error(torch.randn(3), torch.randn(4)), "exact")],
    "numerics.error_ratio": [(lambda: numerics.error_ratio(torch.randn(3), torch.randn(4), torch.randn(3)), "baseline")],
    "numerics.agrees": [(lambda: numerics.agrees(torch.randn(3), torch.randn(3), torch.randn(4)), "exact")],
    "objectives.mlm_corrupt": [
        (lambda: objectives.mlm_corrupt(torch.zeros(2, 5, dtype=torch.long), vocab_size=10, mask_id=9, p=0), "p")],
    "objectives.span_corrupt": [(lambda: objectives.span_corrupt(list("abcdef"), [(4, 1), (2, 1)]), "spans")],
    "objectives.random_spans": [(lambda: objectives.random_spans(1), "n")],
    # positional
    "positional.frequencies": [(lambda: positional.frequencies(0), "d")],
    "positional.sinusoidal_encoding": [(lambda: positional.sinusoidal_encoding(-1, 4), "n")],
    "positional.shift_matrix": [(lambda: positional.shift_matrix(1, 3), "d")],
    "positional.LearnedPositionalEmbedding": [(lambda: positional.LearnedPositionalEmbedding(4, 8)(torch.randn(1, 5, 8)),
                                               "max_len")],
    "positional.apply_rope": [(lambda: positional.apply_rope(torch.randn(4, 5)), "x"),
                              (lambda: positional.apply_rope(INT), "x")],
    "positional.apply_rope_complex": [(lambda: positional.apply_rope_complex(torch.randn(4, 5)), "x")],
    "positional.alibi_slopes": [(lambda: positional.alibi_slopes(0), "n_heads")],
    "positional.alibi_bias": [(lambda: positional.alibi_bias(4, -1), "n")],
    # quant
    "quant.quantize_int8": [(lambda: quant.quantize_int8(torch.randn(4, 8), 0), "block")],
    "quant.fake_fp4": [(lambda: quant.fake_fp4(torch.randn(2, 20)), "group"),
                       (lambda: quant.fake_fp4(torch.randn(2, 20), group=0), "group")],
    "quant.smooth_keys": [(lambda: quant.smooth_keys(torch.randn(4)), "k")],
    "quant.quantized_scores": [(lambda: quant.quantized_scores(Q, Q, fmt="int4"), "fmt")],
    "quant.quantized_attention": [(lambda: quant.quantized_attention(INT, INT, INT), "q")],
    # rglru, ring
    "rglru.linear_recurrence": [(lambda: rglru.linear_recurrence(torch.rand(1, 4, 2), torch.rand(1, 5, 2)), "a")],
    "rglru.rg_lru": [(lambda: rglru.rg_lru(*torch.rand(3, 1, 4, 2), -torch.rand(3)), "log_a"),
                     (lambda: rglru.rg_lru(torch.rand(1, 4, 2), torch.rand(1, 4, 3), torch.rand(1, 4, 2),
                                           -torch.rand(2)), "gate_a"),
                     (lambda: rglru.rg_lru(torch.rand(4, 2), torch.rand(4, 2), torch.rand(4, 2), -torch.rand(2)), "x")],
    "rglru.RGLRU": [(lambda: rglru.RGLRU(4)(torch.randn(1, 5, 3)), "x"),
                    (lambda: rglru.RGLRU(4).step(torch.randn(2, 4), torch.zeros(1, 4)), "h")],
    "rglru.GriffinRecurrentBlock": [(lambda: rglru.GriffinRecurrentBlock(8)(torch.randn(1, 5, 4)), "x"),
                                    (lambda: rglru.GriffinRecurrentBlock(8).step(
                                        torch.randn(1, 5, 8), rglru.GriffinRecurrentBlock(8).init_state(1)), "x_t")],
    "rglru.stationary_variance": [(lambda: rglru.stationary_variance(1.0), "a")],
    "rglru.memory_horizon": [(lambda: rglru.memory_horizon(1.0), "a"), (lambda: rglru.memory_horizon(0.5, 0.0), "eps")],
    "ring.merge_partials": [(lambda: ring.merge_partials(torch.randn(2, 3, 4), torch.randn(2, 3), torch.randn(2, 3, 4),
                                                         torch.randn(2, 4)), "lse_b")],
    "ring.ring_schedule": [(lambda: ring.ring_schedule(0), "n_devices")],
    "ring.ring_attention": [(lambda: ring.ring_attention(Q, Q, Q, 0), "n_devices"),
                            (lambda: ring.ring_attention(Q, Q, Q, 2, block=0), "block")],
    "ring.ring_costs": [(lambda: ring.ring_costs(0, 64, 4), "n")],
    # scaling, schedules
    "scaling.kaplan_loss": [(lambda: scaling.kaplan_loss(0), "n_params")],
    "scaling.ChinchillaFit": [(lambda: scaling.CHINCHILLA.compute_optimal(0.0), "flops"),
                              (lambda: scaling.CHINCHILLA.compute_optimal_search(-1.0), "flops")],
    "schedules.noam_lr": [(lambda: schedules.noam_lr(0, 512), "step")],
    "schedules.warmup_cosine_lr": [(lambda: schedules.warmup_cosine_lr(0, peak=1.0, warmup=1, total=2), "step")],
    "schedules.warmup_linear_lr": [(lambda: schedules.warmup_linear_lr(0, peak=1.0, warmup=1, total=2), "step")],
    # sparse
    "sparse.sliding_window_mask": [(lambda: sparse.sliding_window_mask(-1, 2), "n"),
                                   (lambda: sparse.sliding_window_mask(8, -2), "window")],
    "sparse.dilated_window_mask": [(lambda: sparse.dilated_window_mask(8, 2, 0), "dilation")],
    "sparse.strided_mask": [(lambda: sparse.strided_mask(8, 0), "stride")],
    "sparse.global_mask": [(lambda: sparse.global_mask(4, [4]), "global_tokens")],
    "sparse.longformer_mask": [(lambda: sparse.longformer_mask(8, -1), "window")],
    "sparse.bigbird_mask": [(lambda: sparse.bigbird_mask(8, 1, 1, -1), "n_random")],
    "sparse.block_sparse_mask": [(lambda: sparse.block_sparse_mask(8, 4, torch.ones(3, 3)), "layout"),
                                 (lambda: sparse.block_sparse_mask(8, 0, torch.ones(3, 3)), "block")],
    "sparse.keys_per_row": [(lambda: sparse.keys_per_row(torch.ones(3, 4, dtype=torch.bool)), "mask")],
    "sparse.density": [(lambda: sparse.density(torch.ones(3, dtype=torch.bool)), "mask")],
    "sparse.reach": [(lambda: sparse.reach(torch.ones(3, 3, dtype=torch.bool), 0), "layers")],
    "sparse.receptive_field": [(lambda: sparse.receptive_field(torch.ones(3, 3), 2), "mask")],
    "sparse.sliding_window_attention": [(lambda: sparse.sliding_window_attention(Q, Q, Q, -1), "window"),
                                        (lambda: sparse.sliding_window_attention(Q, Q, Q, 1, block=0), "block"),
                                        (lambda: sparse.sliding_window_attention(INT, INT, INT, 1), "q")],
    "sparse.tile_classes": [(lambda: sparse.tile_classes(torch.ones(3, 4, dtype=torch.bool), 2), "mask"),
                            (lambda: sparse.tile_classes(torch.ones(3, 3, dtype=torch.bool), 0), "block")],
    "sparse.window_tiles": [(lambda: sparse.window_tiles(0, 4, 2), "n"),
                            (lambda: sparse.window_tiles(8, 0, 2), "block"),
                            (lambda: sparse.window_tiles(8, 4, -1), "window")],
    # speculative
    "speculative.expected_tokens_per_step": [(lambda: speculative.expected_tokens_per_step(1.5, 2), "alpha")],
    "speculative.expected_speedup": [(lambda: speculative.expected_speedup(0.5, 2, -1.0), "cost_ratio")],
    "speculative.acceptance_rate": [(lambda: speculative.acceptance_rate(torch.rand(3), torch.rand(4)), "q")],
    "speculative.accept_probability": [(lambda: speculative.accept_probability(torch.tensor(0.0), torch.tensor(0.0)),
                                        "q_x")],
    "speculative.residual_distribution": [(lambda: speculative.residual_distribution(torch.rand(3), torch.rand(4)), "q")],
    "speculative.verify": [(lambda: speculative.verify(torch.rand(2, 3), torch.rand(2, 3), [0]), "q")],
    "speculative.step_distribution": [(lambda: speculative.step_distribution(uniform, uniform, (), -1), "gamma")],
    "speculative.output_distribution": [(lambda: speculative.output_distribution(uniform, uniform, (), 1, 0, 3), "length")],
    "speculative.autoregressive_distribution": [
        (lambda: speculative.autoregressive_distribution(uniform, (), -1, 3), "length")],
    "speculative.next_token_probs": [(lambda: speculative.next_token_probs(tiny_gpt(), temperature=0), "temperature")],
    "speculative.speculative_generate": [
        (lambda: speculative.speculative_generate(tiny_gpt(), tiny_gpt(), torch.zeros(2, 3, dtype=torch.long), 2),
         "prompt"),
        (lambda: speculative.speculative_generate(tiny_gpt(), tiny_gpt(), torch.zeros(1, 3, dtype=torch.long), 2,
                                                  gamma=0), "gamma")],
    # ssm
    "ssm.discretize": [(lambda: ssm.discretize(torch.ones(2), torch.ones(2), 0.0), "delta"),
                       (lambda: ssm.discretize(-torch.ones(2, 3), torch.ones(4), 0.1), "B"),
                       (lambda: ssm.discretize(-torch.ones(2, 3), torch.ones(3), torch.full((4, 1), 0.1)), "delta")],
    "ssm.ssm_kernel": [(lambda: ssm.ssm_kernel(torch.rand(2), torch.ones(2), torch.ones(2), -1), "length"),
                       (lambda: ssm.ssm_kernel(torch.rand(2, 3), torch.ones(2, 3), torch.ones(3), 5), "C"),
                       (lambda: ssm.ssm_kernel(torch.rand(2, 3), [1.0], torch.ones(2, 3), 5), "B_bar")],
    "ssm.lti_recurrence": [(lambda: ssm.lti_recurrence(torch.randn(1, 2, 5), torch.rand(3, 4), torch.ones(2, 4),
                                                      torch.ones(2, 4)), "A_bar")],
    "ssm.lti_convolution": [(lambda: ssm.lti_convolution(torch.randn(1, 2, 5), torch.randn(2, 4)), "K"),
                            (lambda: ssm.lti_convolution([[[1.0]]], torch.randn(1, 1)), "u"),
                            (lambda: ssm.lti_convolution(torch.randn(1, 2, 5), torch.randn(2, 5), torch.ones(3)), "D")],
    "ssm.s4d_real_init": [(lambda: ssm.s4d_real_init(0, 4), "d")],
    "ssm.state_size": [(lambda: ssm.state_size(0, 4), "d"), (lambda: ssm.state_size(2.5, 16, 4), "d"),
                       (lambda: ssm.state_size(8, 16, 0), "d_conv")],
    "ssm.selective_scan": [(lambda: ssm.selective_scan(**SCAN), "A"),
                           (lambda: ssm.selective_scan(**{**SCAN, "A": -SCAN["A"], "delta": -SCAN["delta"]}), "delta"),
                           (lambda: ssm.selective_scan(**{**SCAN, "A": -SCAN["A"], "u": SCAN["u"].long()}), "u")],
    "ssm.recurrence_rounding": [(lambda: ssm.recurrence_rounding(1.0, torch.randn(4), torch.float32), "a")],
    "ssm.Mamba": [(lambda: ssm.Mamba(ssm.MambaConfig(8))(torch.randn(1, 5, 4)), "u"),
                  (lambda: ssm.Mamba(ssm.MambaConfig(8)).step(torch.randn(2, 8), ssm.Mamba(ssm.MambaConfig(8))
                                                                .init_state(2)[::-1]), "state[0]"),
                  (lambda: ssm.Mamba(ssm.MambaConfig(8)).step(torch.randn(2, 8), ssm.Mamba(ssm.MambaConfig(8))
                                                                .init_state(3)), "state[0]"),
                  (lambda: ssm.Mamba(ssm.MambaConfig(8, d_state=4)).step(
                      torch.randn(1, 8), (torch.zeros(1, 16, 3), torch.zeros(1, 16, 5))), "state[1]"),
                  (lambda: ssm.Mamba(ssm.MambaConfig(8)).step(torch.randn(1, 8), torch.zeros(1, 16, 3)), "state")],
    "ssm.MambaConfig": [(lambda: ssm.MambaConfig(0), "d_model"), (lambda: ssm.MambaConfig(8, expand=0), "expand"),
                        (lambda: ssm.MambaConfig(8, d_state=0), "d_state"),
                        (lambda: ssm.MambaConfig(8, dt_rank=0), "dt_rank"),
                        (lambda: ssm.MambaConfig(8, dt_min=0.5), "dt_min"),
                        (lambda: ssm.MambaConfig(8, method="pscan"), "method")],
    "ssm.MambaLM": [(lambda: ssm.MambaLM(10, 1, ssm.MambaConfig(8))(torch.randn(1, 5)), "tokens")],
    "ssm.compute_dtype": [(lambda: ssm.compute_dtype(torch.ones(2), [1.0]), "tensors[1]"),
                          (lambda: ssm.compute_dtype(torch.ones(2, dtype=torch.long)), "tensors[0]")],
    "ssm.scan_hbm_bytes": [(lambda: ssm.scan_hbm_bytes(8, 0, 16, 4), "d"),
                           (lambda: ssm.scan_hbm_bytes(8, 4, 16, 4, io_bytes=1.5), "io_bytes")],
    # ssd
    "ssd.segsum": [(lambda: ssd.segsum(torch.ones(4, dtype=torch.long)), "log_a")],
    "ssd.ssd_matrix": [(lambda: ssd.ssd_matrix(SSD["log_a"], SSD["B"], SSD["C"][..., :2]), "B, C")],
    "ssd.ssd_recurrent": [(lambda: ssd.ssd_recurrent(**{**SSD, "log_a": -SSD["log_a"] + 1}), "log_a"),
                          (lambda: ssd.ssd_recurrent(**SSD, initial_state=torch.zeros(1, 4, 3)), "initial_state")],
    "ssd.ssd_quadratic": [(lambda: ssd.ssd_quadratic(**{**SSD, "x": SSD["x"][0]}), "x"),
                          (lambda: ssd.ssd_quadratic(**{**SSD, "B": torch.randn(1, 6, 3, 3)}), "B")],
    "ssd.ssd_chunked": [(lambda: ssd.ssd_chunked(**SSD, chunk=0), "chunk"),
                        (lambda: ssd.ssd_chunked(**{**SSD, "C": SSD["C"][:, :5]}), "C")],
    "ssd.ssd": [(lambda: ssd.ssd(**SSD, method="scan"), "method")],
    "ssd.ssd_flops": [(lambda: ssd.ssd_flops(0, 4, 4), "length"), (lambda: ssd.ssd_flops(8, 4, 4, chunk=0), "chunk")],
    # s4d
    "s4d.S4D": [(lambda: s4d.S4D(3, 7), "n"), (lambda: s4d.S4D(3, 8, init="hippo"), "init"),
                (lambda: s4d.S4D(3, 8, dt_min=0.0), "dt_min"),
                (lambda: s4d.S4D(3, 8)(torch.randn(1, 4, 5)), "u"),
                (lambda: s4d.S4D(3, 8)(torch.randn(1, 3, 5), mode="scan"), "mode"),
                (lambda: s4d.S4D(3, 8).step(torch.randn(2, 4)), "u_t"),
                (lambda: s4d.S4D(3, 8).state_after(torch.randn(1, 4, 5)), "u"),
                (lambda: s4d.S4D(3, 8)(torch.randn(1, 3, 5).long(), return_state=True), "u")],
    "s4d.s4d_lin_init": [(lambda: s4d.s4d_lin_init(2, 5), "n")],
    "s4d.hippo_legs": [(lambda: s4d.hippo_legs(0), "n")],
    "s4d.legs_memory": [(lambda: s4d.legs_memory(torch.randn(2, 3), 4), "f"),
                        (lambda: s4d.legs_memory(torch.randn(3), 0), "n")],
    "s4d.legendre_reconstruct": [(lambda: s4d.legendre_reconstruct(torch.randn(2, 0), 3), "c"),
                                 (lambda: s4d.legendre_reconstruct(torch.randn(2), -1), "length")],
    # tasks
    "tasks.in_context_regression": [(lambda: tasks.in_context_regression(0, 4, 2), "batch")],
    "tasks.modular_addition": [(lambda: tasks.modular_addition(1), "p")],
    "tasks.CharCorpus": [(lambda: tasks.char_corpus(text="abcdefghij").batch(2, 20), "length"),
                         (lambda: tasks.char_corpus(text="abcdefghij").encode("xyz"), "s")],
    "tasks.char_corpus": [(lambda: tasks.char_corpus(text="a"), "text")],
    "tasks.python_docs_text": [(lambda: tasks.python_docs_text(source="web"), "source")],
    "tasks.clean_markup": [(lambda: tasks.clean_markup(b"bytes"), "text")],
    "tasks.key_value_retrieval": [(lambda: tasks.key_value_retrieval(2, n_pairs=0), "n_pairs"),
                                  (lambda: tasks.key_value_retrieval(2, 6, n_keys=8, group_size=4), "group_size")],
    "tasks.mqar": [(lambda: tasks.mqar(0), "batch")],
    "tasks.mqar_zoology": [(lambda: tasks.mqar_zoology(2, 8, 30), "seq_len"),
                           (lambda: tasks.mqar_zoology(2, 8, 64, vocab=16), "vocab"),
                           (lambda: tasks.mqar_zoology(2, 2, 16, power_a=2.0), "power_a")],
    "tasks.selective_copying": [(lambda: tasks.selective_copying(2, n_data=9, length=8), "n_data"),
                                (lambda: tasks.selective_copying(2, n_noise=0), "n_noise")],
    "tasks.power_law_gaps": [(lambda: tasks.power_law_gaps(0), "space"),
                             (lambda: tasks.power_law_gaps(8, -1.0), "power_a")],
    # recall (chapter 13)
    "recall.as_zoology_batch": [(lambda: recall.as_zoology_batch(torch.zeros(2, 8)), "batch"),
                                (lambda: recall.as_zoology_batch(tasks.mqar(2, 4, n_queries=2)), "batch")],
    "recall.window_ceiling": [(lambda: recall.window_ceiling(0, 8), "n_pairs"),
                              (lambda: recall.window_ceiling(8, 8, n_values=0), "n_values")],
    "recall.shortcut_accuracy": [(lambda: recall.shortcut_accuracy(tasks.mqar_zoology(2, 4, 16, vocab=32)), "batch"),
                                 (lambda: recall.shortcut_accuracy(torch.zeros(2, 8)), "batch"),
                                 (lambda: recall.shortcut_accuracy(tasks.mqar(2, 4), "mode"), "rule")],
    "recall.expected_mode_accuracy": [(lambda: recall.expected_mode_accuracy(0), "n"),
                                      (lambda: recall.expected_mode_accuracy(4, n_values=2.5), "n_values")],
    "recall.shortcut_baselines": [(lambda: recall.shortcut_baselines(0), "n_pairs"),
                                  (lambda: recall.shortcut_baselines(8, n_values=0), "n_values")],
    "recall.accuracy_by_slot": [(lambda: recall.accuracy_by_slot(None, tasks.mqar(2, 4)), "model"),
                                (lambda: recall.accuracy_by_slot(torch.zeros(2, 3, dtype=torch.long),
                                                                 tasks.mqar(2, 4)), "model"),
                                (lambda: recall.accuracy_by_slot(torch.zeros(2, 16, dtype=torch.long),
                                                                 tasks.mqar_zoology(2, 4, 16, vocab=32)), "batch")],
    # tradeoff, train
    "tradeoff.forms": [(lambda: tradeoff.forms(-1), "window")],
    "tradeoff.make_inputs": [(lambda: tradeoff.make_inputs(0), "n")],
    "tradeoff.score_matrix_bytes": [(lambda: tradeoff.score_matrix_bytes(-1), "n")],
    "tradeoff.relative_error": [(lambda: tradeoff.relative_error(torch.randn(3), torch.randn(4)), "ref")],
    "tradeoff.measure": [(lambda: tradeoff.measure([64], window=-1, memory=False), "window")],
    "tradeoff.crossover_length": [(lambda: tradeoff.crossover_length([1, 2], [1.0], [1.0, 2.0]), "slow")],
    "train.next_token_loss": [(lambda: train.next_token_loss(tiny_gpt(), torch.zeros(2, 4, dtype=torch.long),
                                                             torch.zeros(2, 3, dtype=torch.long)), "targets")],
    "train.train": [(lambda: train.train(tiny_gpt(), lambda step: None, steps=0, progress=False), "steps")],
}


# ---------------------------------------------------------------------------------------------
# Edge input with a documented result: that result, and no NaN
# ---------------------------------------------------------------------------------------------

def finite(*tensors):
    return all(not torch.isnan(t).any() for t in tensors)


def edge_masked_softmax():
    weights = attention.masked_softmax(torch.tensor([[0.0, float("-inf")], [float("-inf"), float("-inf")]]))
    assert torch.equal(weights, torch.tensor([[1.0, 0.0], [0.0, 0.0]]))        # a blocked row: zeros, not NaN


def edge_fully_masked_row():
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[1] = False                                                             # query 1 may see no key
    out, weights = attention.scaled_dot_product_attention(Q, Q, Q, mask, return_weights=True)
    assert finite(out, weights) and out[..., 1, :].eq(0).all() and weights[..., 1, :].eq(0).all()


def edge_causal_more_queries_than_keys():
    """Bottom-right alignment with n > m: the first n - m queries see no key and get zeros, in every form."""
    q, k = Q, Q[..., :2, :]
    for out in (attention.scaled_dot_product_attention(q, k, k, causal=True),
                flash.flash_attention(q, k, k, causal=True, block_q=2, block_k=1),
                flash.flash_forward(q, k, k, causal=True)[0]):
        assert finite(out) and out[..., :2, :].eq(0).all() and out[..., 2:, :].ne(0).any()


def edge_entropy():
    rows = torch.tensor([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.5, 0.5, 0.0]])   # masked, one-hot, uniform over 2
    assert torch.allclose(attention.attention_entropy(rows), torch.tensor([0.0, 0.0, math.log(2)]))


def edge_jacobian():
    assert attention.softmax_jacobian(torch.tensor([0.0, 1.0, 0.0])).eq(0).all()   # it vanishes at a one-hot row


def edge_relu_rows_all_zero():
    """relu features can make a row's normaliser 0; it is guarded, so that row's output is 0, not NaN."""
    q = -Q.abs()
    for method in linear.METHODS:
        out = linear.linear_attention(q, Q.abs(), Q, feature_map="relu", causal=True, method=method, chunk=3)
        assert finite(out) and out.eq(0).all()


def edge_merge_of_two_empty_parts():
    out = torch.zeros(2, 3, 4)
    lse = torch.full((2, 3), float("inf"))                                       # +inf: no key seen
    merged, merged_lse = ring.merge_partials(out, lse, out, lse)
    assert finite(merged) and merged.eq(0).all() and torch.isinf(merged_lse).all()


def edge_load_entropy():
    assert moe.load_entropy(torch.tensor([1.0, 0.0, 0.0, 0.0])) == 0.0           # collapsed
    assert moe.load_entropy(torch.full((4,), 0.25)) == pytest.approx(2.0)       # balanced: log2 E


def edge_residual_of_equal_distributions():
    p = torch.tensor([0.2, 0.3, 0.5])
    assert torch.equal(speculative.residual_distribution(p, p.clone()), p)      # nothing to correct: p itself


def edge_growth_exponents():
    rows = [{"n": 1024, "form": "a", "ms": 1.0}, {"n": 2048, "form": "a", "ms": 4.0}, {"n": 1024, "form": "b", "ms": 1.0}]
    assert tradeoff.growth_exponents(rows) == {"a": pytest.approx(2.0)}          # "b" has one length: left out


EDGE = {
    "attention.masked_softmax": edge_masked_softmax,
    "attention.scaled_dot_product_attention": edge_fully_masked_row,
    "flash.flash_attention": edge_causal_more_queries_than_keys,
    "attention.attention_entropy": edge_entropy,
    "attention.softmax_jacobian": edge_jacobian,
    "linear.linear_attention": edge_relu_rows_all_zero,
    "ring.merge_partials": edge_merge_of_two_empty_parts,
    "moe.load_entropy": edge_load_entropy,
    "speculative.residual_distribution": edge_residual_of_equal_distributions,
    "tradeoff.growth_exponents": edge_growth_exponents,
}


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------

def assert_clear_error(call, argument):
    """``call`` raises exactly ValueError or TypeError, and the message names ``argument`` as a word."""
    with pytest.raises(Exception) as info:
        call()
    err = info.value
    assert type(err) in (ValueError, TypeError), f"raw {type(err).__name__}: {err}"
    assert re.search(rf"(?<![\w.]){re.escape(argument)}(?!\w)", str(err)), f"message does not name {argument!r}: {err}"


def test_every_entry_point_is_covered():
    found = library_entry_points()
    missing = sorted(set(found) - set(BAD) - set(EDGE) - set(EXEMPT))
    assert not missing, f"public entry points with neither a bad-input case nor an exemption: {missing}"
    stale = sorted((set(BAD) | set(EDGE) | set(EXEMPT)) - set(found))
    assert not stale, f"cases for names that are not public entry points (renamed or removed?): {stale}"
    assert not set(EXEMPT) & (set(BAD) | set(EDGE)), "an exempt entry point has cases: drop the exemption"


@pytest.mark.parametrize("key, call, argument",
                         [(key, call, argument) for key, cases in BAD.items() for call, argument in cases],
                         ids=[f"{key}-{i}" for key, cases in BAD.items() for i in range(len(cases))])
def test_bad_input_raises_naming_the_argument(key, call, argument):
    assert_clear_error(call, argument)


@pytest.mark.parametrize("key", sorted(EDGE))
def test_edge_input_gives_the_documented_result(key):
    EDGE[key]()


# The issue's cases, with their messages in full (the sixth, an unstable A in selective_scan, is the next test).
ISSUE_CASES = [
    (lambda: attention.scaled_dot_product_attention(INT, INT, INT), TypeError,
     "scaled_dot_product_attention: q must be a floating-point tensor, got torch.int64"),
    (lambda: flash.flash_attention(INT, INT, INT), TypeError,
     "flash_attention: q must be a floating-point tensor, got torch.int64"),
    (lambda: sparse.sliding_window_mask(-1, 2), ValueError,
     "sliding_window_mask: n must be a non-negative int, got -1"),
    (lambda: linear.linear_attention(Q, Q, Q, causal=True, method="chunked", chunk=0), ValueError,
     "linear_attention: chunk must be a positive int, got 0"),
    (lambda: flash.flash_attention(Q, Q, Q, block_q=0), ValueError,
     "flash_attention: block_q must be a positive int, got 0"),
]


@pytest.mark.parametrize("call, kind, message", ISSUE_CASES, ids=range(len(ISSUE_CASES)))
def test_the_issue_cases(call, kind, message):
    with pytest.raises(kind) as info:
        call()
    assert str(info.value) == message


@pytest.mark.parametrize("method", ssm.SCAN_METHODS)
def test_unstable_A_is_rejected_by_every_scan_method(method):
    """A positive entry of A makes h_t grow like e^{ΔA t}; the chunked form used to return NaN silently."""
    A = -SCAN["A"].clone()
    A[1, 2] = 0.3
    with pytest.raises(ValueError, match=r"selective_scan: A must be <= 0 .* got max A = 0\.3"):
        ssm.selective_scan(**{**SCAN, "A": A}, method=method)
    out = ssm.selective_scan(**{**SCAN, "A": A.clamp(max=0)}, method=method)    # A = 0 (no decay) is allowed
    assert finite(out)


# ---------------------------------------------------------------------------------------------
# The generic guard: random bad shapes, dtypes and sizes never reach a raw torch error
# ---------------------------------------------------------------------------------------------

ATTENTION_FORMS = {
    "scaled_dot_product_attention": lambda q, k, v: attention.scaled_dot_product_attention(q, k, v, causal=True),
    "flash_attention": lambda q, k, v: flash.flash_attention(q, k, v, causal=True, block_q=2, block_k=3),
    "flash_forward": lambda q, k, v: flash.flash_forward(q, k, v, block_q=2)[0],
    "flash_trace": lambda q, k, v: flash.flash_trace(q, k, v)[0],
    "sliding_window_attention": lambda q, k, v: sparse.sliding_window_attention(q, k, v, 1, causal=True),
    "linear_attention": lambda q, k, v: linear.linear_attention(q, k, v, causal=True, method="chunked", chunk=2),
    "gated_linear_attention": lambda q, k, v: linear.gated_linear_attention(q, k, v, torch.zeros_like(k), chunk=2,
                                                                         method="chunked"),
    "quantized_attention": lambda q, k, v: quant.quantized_attention(q, k, v, block=2),
    "ring_attention": lambda q, k, v: ring.ring_attention(q, k, v, 2, causal=True),
}

shapes = st.lists(st.integers(0, 3), min_size=0, max_size=5).map(tuple)
# (b, h, n, d), (b, h_kv, m, d), (b, h_kv, m, d_v) that fit together, with empty sizes allowed
fitting = st.builds(lambda b, h, h_kv, n, m, d, d_v: ((b, h, n, d), (b, h_kv, m, d), (b, h_kv, m, d_v)),
                    st.integers(1, 2), st.just(2), st.sampled_from([1, 2]), st.sampled_from([0, 3, 5]),
                    st.sampled_from([0, 3, 5]), st.integers(0, 3), st.integers(0, 3))
triples = st.one_of(fitting, st.tuples(shapes, shapes, shapes))
dtypes = st.sampled_from([torch.float32, torch.float64, torch.int64, torch.bool])


def tensor(shape, dtype, seed):
    t = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return t.to(dtype) if dtype != torch.bool else t > 0


@pytest.mark.parametrize("name", sorted(ATTENTION_FORMS))
@given(shapes=triples, dtype=dtypes, seed=st.integers(0, 99))
def test_attention_forms_never_raise_raw_errors(name, shapes, dtype, seed):
    """Any ranks, sizes (zero included) and dtypes: a clear ValueError/TypeError or a result without NaN."""
    q, k, v = (tensor(s, dtype, seed + i) for i, s in enumerate(shapes))
    try:
        out = ATTENTION_FORMS[name](q, k, v)
    except (ValueError, TypeError) as err:
        assert re.search(r"\b(q|k|v|log_decay)\b", str(err)), err
        return
    assert finite(out)


SIZE_FUNCTIONS = {
    "causal_mask": lambda a, b, c: attention.causal_mask(a, b),
    "uniform_entropy": lambda a, b, c: attention.uniform_entropy(a),
    "sliding_window_mask": lambda a, b, c: sparse.sliding_window_mask(a, b, causal=c > 0),
    "dilated_window_mask": lambda a, b, c: sparse.dilated_window_mask(a, b, c),
    "strided_mask": lambda a, b, c: sparse.strided_mask(a, b),
    "bigbird_mask": lambda a, b, c: sparse.bigbird_mask(a, b, 0, c),
    "block_sparse_mask": lambda a, b, c: sparse.block_sparse_mask(a, b, torch.ones(abs(c), abs(c), dtype=torch.bool)),
    "alibi_bias": lambda a, b, c: positional.alibi_bias(a, b),
    "sinusoidal_encoding": lambda a, b, c: positional.sinusoidal_encoding(a, b),
    "frequencies": lambda a, b, c: positional.frequencies(a),
    "orthogonal_gaussian": lambda a, b, c: linear.orthogonal_gaussian(a, b),
    "s4d_real_init": lambda a, b, c: ssm.s4d_real_init(a, b),
    "state_size": lambda a, b, c: ssm.state_size(a, b, c),
    "s4d_lin_init": lambda a, b, c: s4d.s4d_lin_init(a, b),
    "hippo_legs": lambda a, b, c: s4d.hippo_legs(a),
    "legendre_reconstruct": lambda a, b, c: s4d.legendre_reconstruct(torch.ones(abs(b) + 1), a),
    "ssm_kernel": lambda a, b, c: ssm.ssm_kernel(torch.full((2,), 0.5), torch.ones(2), torch.ones(2), a),
    "gd_weights": lambda a, b, c: icl.gd_weights(a, 0.1),
    "ring_schedule": lambda a, b, c: ring.ring_schedule(a),
    "ring_costs": lambda a, b, c: ring.ring_costs(a, b, c),
    "keys_attended": lambda a, b, c: nsa.keys_attended(a, block=b, n_selected=c, window=c),
    "compress": lambda a, b, c: nsa.compress(torch.randn(1, a, 2) if a >= 0 else torch.randn(1, 2), b),
    "online_softmax": lambda a, b, c: flash.online_softmax(torch.randn(2, abs(a)), b),
    "hbm_accesses_flash": lambda a, b, c: flash.hbm_accesses_flash(a, b, c),
    "hbm_accesses_flash2": lambda a, b, c: flash.hbm_accesses_flash2(a, b, c),
    "fa1_block_sizes": lambda a, b, c: flash.fa1_block_sizes(a, b),
    "fa2_block_sizes": lambda a, b, c: flash.fa2_block_sizes(a, b),
    "kv_cache_bytes": lambda a, b, c: kv_cache.kv_cache_bytes(a, b, c, a, window=None),
    "decode_flops": lambda a, b, c: kv_cache.decode_flops(a, b, c, cached=True),
    "routed_tokens": lambda a, b, c: mod.routed_tokens(0.5, a),
    "block_flops_fraction": lambda a, b, c: mod.block_flops_fraction(0.5, a, b),
    "jamba_pattern": lambda a, b, c: hybrid.jamba_pattern(a, b, c),
    "zamba_pattern": lambda a, b, c: hybrid.zamba_pattern(a, b),
    "griffin_pattern": lambda a, b, c: hybrid.griffin_pattern(a, b),
    "uniform_pattern": lambda a, b, c: hybrid.uniform_pattern("mamba", a),
    "attention_parameters": lambda a, b, c: hybrid.attention_parameters(a, b, c),
    "conv_flops": lambda a, b, c: hyena.conv_flops(a, b, "fft"),
    "make_inputs": lambda a, b, c: tradeoff.make_inputs(a, heads=b, d=c),
    "in_context_regression": lambda a, b, c: tasks.in_context_regression(a, b, c),
    "mqar": lambda a, b, c: tasks.mqar(a, b, n_queries=c),
    "mqar_zoology": lambda a, b, c: tasks.mqar_zoology(a, b, 4 * c),
    "noam_lr": lambda a, b, c: schedules.noam_lr(a, b, c),
}
sizes = st.integers(-3, 6)


@pytest.mark.parametrize("name", sorted(SIZE_FUNCTIONS))
@given(a=sizes, b=sizes, c=sizes)
def test_size_arguments_never_raise_raw_errors(name, a, b, c):
    """Zero and negative sizes and counts: a clear ValueError/TypeError or a result without NaN."""
    try:
        out = SIZE_FUNCTIONS[name](a, b, c)
    except (ValueError, TypeError) as err:
        assert "range()" not in str(err) and "unpack" not in str(err), f"a raw Python error: {err}"
        return
    for t in out if isinstance(out, (tuple, list)) else [out]:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            assert finite(t)
        elif isinstance(t, float):
            assert not math.isnan(t)
