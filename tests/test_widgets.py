"""The live explorers build, and redraw when a slider moves."""
import pytest
import torch

from attnlab.widgets import attention_explorer, memory_explorer


def test_attention_explorer_redraws():
    box = attention_explorer(torch.randn(2, 5, 5), list("abcde"))
    beta, head = box.children[0].children
    beta.value, head.value = 3.0, 1
    assert head.max == 1
    with pytest.raises(ValueError, match=r"scores must have shape \(h, n, m\)"):
        attention_explorer(torch.randn(5, 5))


def test_memory_explorer_redraws():
    box = memory_explorer([16, 32])
    box.children[0].children[1].value = 4


def test_positional_explorer_redraws():
    from attnlab.widgets import positional_explorer
    box = positional_explorer(16)
    box.children[0].children[0].value = 8
