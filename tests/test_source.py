"""show_source: the library's version of a function, highlighted and collapsed."""
import html
import re

import pytest

import attnlab
from attnlab.attention import MultiHeadAttention, scaled_dot_product_attention


def plain(markup: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


def test_shows_the_whole_function_collapsed_with_its_place():
    shown = attnlab.show_source(scaled_dot_product_attention)
    markup = shown._repr_html_()
    assert markup.startswith('<details class="attnlab-source">')  # collapsed: no 'open'
    assert "attnlab.attention.scaled_dot_product_attention" in markup and "attention.py" in markup
    text = plain(markup)
    for line in shown.code.splitlines():
        assert line.strip() in text
    assert 'class="highlight"' not in markup  # the theme's dark code colours must not apply


def test_open_classes_and_plain_text():
    markup = attnlab.show_source(MultiHeadAttention.forward, open=True)._repr_html_()
    assert markup.startswith('<details class="attnlab-source" open>')
    assert repr(attnlab.show_source(MultiHeadAttention)).startswith("# attnlab.attention.MultiHeadAttention")


def test_objects_without_source_are_refused_by_name():
    with pytest.raises(TypeError, match="show_source: no Python source for <built-in function len>"):
        attnlab.show_source(len)
