"""`selective_scan` against a port of the Mamba authors' reference, `selective_scan_ref`.

The port below is written for this project from the documented behaviour of
`mamba_ssm.ops.selective_scan_interface.selective_scan_ref` (state-spaces/mamba, Apache-2.0);
no code is copied. What it does, in order:

* inputs: u, delta (b, d, L); A (d, n), real; B and C each either (d, n) (time-invariant),
  (b, n, L) (shared by the channels) or (b, g, n, L) (g groups, channel c reads group
  c // (d / g)); D (d,); z (b, d, L); delta_bias (d,);
* everything is cast to float32 first (the input dtype is remembered);
* delta_bias is added to delta *before* the softplus (``delta_softplus``);
* the state x (b, d, n) starts at zero and runs x_t = exp(delta_t A) * x_{t-1} + delta_t B_t u_t,
  y_t = C_t . x_t, one step per position;
* out = y + u * D, then out * silu(z); out is cast back to the input dtype;
* the last state is returned in float32 when asked for.

Complex A (the reference allows it) is not ported: the library is real-only. ``upcast`` is the
port's one knob: float32 is the reference; float64 lets the tests compare at 1e-12.
"""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.ssm import SCAN_METHODS, Mamba, MambaConfig, compute_dtype, selective_scan

F64 = torch.float64


def selective_scan_ref_port(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                            return_last_state=False, *, upcast=torch.float32):
    dtype_in = u.dtype
    up = lambda t: None if t is None else t.to(upcast)                       # noqa: E731
    u, delta, A, B, C, D, z, delta_bias = map(up, (u, delta, A, B, C, D, z, delta_bias))
    if delta_bias is not None:
        delta = delta + delta_bias[:, None]
    if delta_softplus:
        delta = F.softplus(delta)
    batch, dim, length = u.shape

    def per_step(M, t):
        """B or C at step t, as (b, d, n) (or broadcastable to it)."""
        if M.dim() == 2:                                       # (d, n): the same at every step
            return M[None]
        if M.dim() == 3:                                       # (b, n, L): one for all channels
            return M[:, None, :, t]
        return M[..., t].repeat_interleave(dim // M.shape[1], dim=1)   # (b, g, n, L) -> (b, d, n)

    x = torch.zeros(batch, dim, A.shape[1], dtype=upcast)
    ys = []
    for t in range(length):
        decay = torch.exp(delta[:, :, t, None] * A)                       # (b, d, n)
        x = decay * x + (delta[:, :, t] * u[:, :, t])[..., None] * per_step(B, t)
        ys.append((x * per_step(C, t)).sum(-1))
    out = torch.stack(ys, dim=2)
    if D is not None:
        out = out + u * D[:, None]
    if z is not None:
        out = out * F.silu(z)
    out = out.to(dtype_in)
    return (out, x) if return_last_state else out


def make(b, d, n, length, *, layout_B="shared", layout_C="shared", groups=1, seed=0, dtype=F64,
         with_D=True, with_z=True, with_bias=True, softplus=True):
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g, dtype=F64)                # noqa: E731
    shapes = {"time-invariant": (d, n), "shared": (b, n, length), "grouped": (b, groups, n, length)}
    u, z = rand(b, d, length), rand(b, d, length)
    delta = rand(b, d, length) if softplus else rand(b, d, length).abs() * 0.3
    A = -(torch.rand(d, n, generator=g, dtype=F64) * n + 0.5)
    B, C = rand(*shapes[layout_B]), rand(*shapes[layout_C])
    bias = (torch.full((d,), math.log(math.expm1(0.1)), dtype=F64) + 0.1 * rand(d) if softplus
            else 0.05 * rand(d).abs())                                     # Δ stays >= 0 without softplus
    kw = dict(D=rand(d) if with_D else None, z=z if with_z else None, delta_bias=bias if with_bias else None,
              delta_softplus=softplus)
    cast = lambda t: t if t is None or not torch.is_tensor(t) else t.to(dtype)   # noqa: E731
    return [cast(t) for t in (u, delta, A, B, C)], {k: cast(v) for k, v in kw.items()}


LAYOUTS = ["time-invariant", "shared", "grouped"]


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 3), d_per_group=st.integers(1, 3), groups=st.integers(1, 3), n=st.integers(1, 7),
       length=st.integers(1, 41).map(lambda v: 2 * v - 1), layout_B=st.sampled_from(LAYOUTS),
       layout_C=st.sampled_from(LAYOUTS), with_D=st.booleans(), with_z=st.booleans(),
       with_bias=st.booleans(), softplus=st.booleans(), method=st.sampled_from(SCAN_METHODS),
       chunk=st.one_of(st.none(), st.integers(1, 12)), seed=st.integers(0, 2**16))
def test_every_method_equals_the_reference_port(b, d_per_group, groups, n, length, layout_B, layout_C, with_D,
                                                with_z, with_bias, softplus, method, chunk, seed):
    """Odd lengths, odd n and d, every B/C layout and every optional argument, values and last state."""
    d = d_per_group * groups
    args, kw = make(b, d, n, length, layout_B=layout_B, layout_C=layout_C, groups=groups, seed=seed,
                    with_D=with_D, with_z=with_z, with_bias=with_bias, softplus=softplus)
    ref, ref_last = selective_scan_ref_port(*args, **kw, return_last_state=True, upcast=F64)
    out, last = selective_scan(*args, **kw, method=method, chunk=chunk, return_last_state=True)
    scale = 1 + ref.abs().max().item()
    assert out.shape == ref.shape == (b, d, length) and last.shape == ref_last.shape == (b, d, n)
    assert (out - ref).abs().max().item() < 1e-10 * scale
    assert (last - ref_last).abs().max().item() < 1e-10 * (1 + ref_last.abs().max().item())


def _gradients(fn, tensors, **extra):
    """Gradients of every input of ``fn`` (u, delta, A, B, C, D, z, delta_bias) for a fixed weighting
    of the output plus the last state's squared norm."""
    leaves = [t.clone().requires_grad_() for t in tensors]
    out, last = fn(*leaves[:5], D=leaves[5], z=leaves[6], delta_bias=leaves[7], delta_softplus=True,
                   return_last_state=True, **extra)
    weight = torch.linspace(-1, 1, out.numel(), dtype=F64).view(out.shape)
    ((out * weight).sum() + last.square().sum()).backward()
    return [t.grad for t in leaves]


@settings(max_examples=12, deadline=None)
@given(b=st.integers(1, 2), d_per_group=st.integers(1, 3), groups=st.integers(1, 3), n=st.integers(1, 5),
       length=st.integers(1, 15).map(lambda v: 2 * v - 1), layout_B=st.sampled_from(LAYOUTS),
       layout_C=st.sampled_from(LAYOUTS), method=st.sampled_from(SCAN_METHODS),
       chunk=st.one_of(st.none(), st.integers(1, 8)), seed=st.integers(0, 2**16))
def test_every_method_has_the_gradients_of_the_reference_port(b, d_per_group, groups, n, length, layout_B,
                                                              layout_C, method, chunk, seed):
    """Odd shapes again, fewer draws: all eight gradients (and the last state's) against autograd through the port."""
    d = d_per_group * groups
    args, kw = make(b, d, n, length, layout_B=layout_B, layout_C=layout_C, groups=groups, seed=seed)
    tensors = [*args, kw["D"], kw["z"], kw["delta_bias"]]

    ref = _gradients(selective_scan_ref_port, tensors, upcast=F64)
    got = _gradients(selective_scan, tensors, method=method, chunk=chunk)
    for name, g, r in zip("u delta A B C D z delta_bias".split(), got, ref):
        assert g.shape == r.shape and (g - r).abs().max().item() < 1e-9 * (1 + r.abs().max().item()), name


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("method", ["sequential", "chunked"])
def test_gradients_equal_the_reference_port_for_every_layout(layout, method):
    """The chunked form's hand-written backward, for each B/C layout, against autograd through the port."""
    args, kw = make(2, 6, 5, 23, layout_B=layout, layout_C=layout, groups=3, seed=11)
    tensors = [*args, kw["D"], kw["z"], kw["delta_bias"]]

    ref = _gradients(selective_scan_ref_port, tensors, upcast=F64)
    got = _gradients(selective_scan, tensors, method=method, chunk=4)
    for name, g, r in zip("u delta A B C D z delta_bias".split(), got, ref):
        assert g.shape == r.shape and (g - r).abs().max().item() < 1e-9 * (1 + r.abs().max().item()), name


@pytest.mark.parametrize("method", SCAN_METHODS)
def test_float32_agrees_with_the_float32_reference(method):
    """The reference as it is (float32 inside): the library in float32 agrees to float32 rounding."""
    args, kw = make(2, 8, 16, 64, seed=5, dtype=torch.float32)
    ref, ref_last = selective_scan_ref_port(*args, **kw, return_last_state=True)
    exact = selective_scan_ref_port(*[t.double() for t in args],
                                    **{k: v.double() if torch.is_tensor(v) else v for k, v in kw.items()},
                                    upcast=F64)
    out, last = selective_scan(*args, **kw, method=method, chunk=8, return_last_state=True)
    assert out.dtype == torch.float32 and ref_last.dtype == last.dtype == torch.float32
    scale = exact.abs().max().item()
    assert (out.double() - exact).abs().max().item() < 1e-5 * scale
    assert (out - ref).abs().max().item() < 1e-5 * scale
    assert (last - ref_last).abs().max().item() < 1e-5 * (1 + ref_last.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("method", ["sequential", "chunked"])
def test_low_precision_inputs_compute_in_float32_and_return_their_dtype(dtype, method):
    """The dtype rule: bf16/fp16 in, float32 inside (as the reference), the input dtype out."""
    args, kw = make(2, 4, 8, 33, seed=2, dtype=dtype)
    out, last = selective_scan(*args, **kw, method=method, return_last_state=True)
    assert out.dtype == dtype and last.dtype == torch.float32
    assert compute_dtype(*args) == torch.float32
    # the same as computing on the float32 values of those inputs, then rounding once
    wide = selective_scan(*[t.float() for t in args],
                          **{k: v.float() if torch.is_tensor(v) else v for k, v in kw.items()}, method=method)
    assert torch.equal(out, wide.to(dtype))
    ref, ref_last = selective_scan_ref_port(*args, **kw, return_last_state=True)
    assert ref.dtype == dtype
    ulp = torch.finfo(dtype).eps * (1 + ref.float().abs())
    assert ((out.float() - ref.float()).abs() <= ulp).all()        # at most one rounding apart
    assert (last - ref_last).abs().max().item() < 1e-4 * (1 + ref_last.abs().max().item())


def test_float64_stays_float64():
    """The one place the library departs from the reference: float64 is not narrowed to float32."""
    args, kw = make(1, 3, 4, 9, seed=4)
    out, last = selective_scan(*args, **kw, return_last_state=True)
    assert out.dtype == last.dtype == F64 and compute_dtype(args[0].float(), args[2]) == F64


def test_bf16_mamba_block_keeps_its_state_in_float32():
    """The block follows the rule too: bf16 weights, a float32 SSM state in step(), bf16 outputs."""
    torch.manual_seed(0)
    block = Mamba(MambaConfig(d_model=8, d_state=4)).bfloat16()
    x = torch.randn(2, 11, 8).bfloat16()
    full = block(x)
    state, outs = block.init_state(2), []
    assert state[1].dtype == torch.float32 and state[0].dtype == torch.bfloat16
    for t in range(11):
        y, state = block.step(x[:, t], state)
        outs.append(y)
    steps = torch.stack(outs, 1)
    assert full.dtype == steps.dtype == torch.bfloat16 and state[1].dtype == torch.float32
    assert (steps.float() - full.float()).abs().max().item() < 0.05 * (1 + full.float().abs().max().item())


def test_layouts_are_the_same_system_written_three_ways():
    """(d, n) repeated over batch and time is the grouped layout with g = d; (b, n, L) is g = 1."""
    args, kw = make(2, 4, 3, 10, layout_B="time-invariant", layout_C="time-invariant", seed=8)
    u, delta, A, B, C = args
    b, d, length = u.shape
    as_groups = [t[None, :, :, None].expand(b, d, -1, length) for t in (B, C)]
    assert (selective_scan(u, delta, A, *as_groups, **kw) - selective_scan(*args, **kw)).abs().max() < 1e-13
    shared = [torch.randn(b, 3, length, dtype=F64) for _ in range(2)]
    one_group = [t.unsqueeze(1) for t in shared]
    assert (selective_scan(u, delta, A, *one_group, **kw) - selective_scan(u, delta, A, *shared, **kw)).abs().max() < 1e-13
    with pytest.raises(ValueError, match=r"B must have shape \(b, n, L\) = \(2, 3, 10\)"):
        selective_scan(u, delta, A, B.T, C, **kw)
    with pytest.raises(ValueError, match=r"g dividing d = 4"):
        selective_scan(u, delta, A, torch.randn(b, 3, 3, length, dtype=F64), C, **kw)
