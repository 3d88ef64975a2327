"""nn.LSTM and nn.LSTMCell, PyTorch's names, shapes and options, and the fused recurrence they run on.

in: a sequence (L, N, input_size) (or batch_first, or unbatched) and optional (h0, c0)
out: the last layer's outputs and (h_n, c_n), as torch.nn.LSTM returns them.
Each layer runs as:
  - the input projection of every time step at once: one matmul (x @ W_ih^T + b_ih + b_hh) over L*N rows,
    recorded as ordinary Tensor ops, so autograd gives W_ih, the biases and x their gradients in one
    matmul each;
  - the recurrence, one autograd Function (LSTMRecurrence) whose forward and backward are one node each in the
    lazy graph (LazyBuffer.subgraph): a training loop records a few ops per layer, not thousands, and the
    scheduler builds the time steps' ops (_forward_graph, _backward_graph) only for a graph it hasn't seen.
    Each time step is two kernels forward and two backward (counted by test/test_lstm.py):
      forward  1. gates = xproj[t] + h @ W_hh^T, activated in the matmul's kernel: the four gates go
                  through one formula, m * sigmoid(m * z) - (m - 1) with m = 2 on the cell gate g
                  (tanh(z) = 2 sigmoid(2z) - 1) and 1 on i, f, o, so the reduce's consumer is one
                  elementwise expression;
               2. c' = f * c + i * g and h' = o * tanh(c') in one kernel writing the step's state (N, SLOTS, H):
                  c at [:, 0], h at [:, 1], and the activations i, f, g, o at [:, 2:] (the backward pass reads them);
      backward 1. dh = dout[t] + dgates[t+1] @ W_hh (a matmul with the incoming gradient in its kernel);
               2. dc and the four gates' gradients in one kernel writing (N, 5, H): the gates'
                  pre-activation gradients at [:, :4], dc at [:, 4];
    then W_hh's gradient is one matmul over all steps' gate gradients and previous h.
The states of every step are stacked into (L+1, N, SLOTS, H) (index 0: the initial state): the Function's
one output, from which the outputs and (h_n, c_n) are views. On the CPU each step's state kernel writes its
stretch of it in place, and each step's gradient kernel its stretch of the gradients (engine/schedule.py).
"""
from __future__ import annotations
import math
from tinychad.dtype import dtypes
from tinychad.function import Function, cat
from tinychad.lazy import LazyBuffer
from tinychad.nn import functional as F
from tinychad.nn.module import Module, Parameter
from tinychad.ops import BinaryOps, ReduceOps, TernaryOps, UnaryOps
from tinychad.tensor import Tensor


def _uniform(*shape: int, bound: float) -> Parameter:
  return Parameter(Tensor.uniform(*shape, low=-bound, high=bound))


# ---- LazyBuffer arithmetic the recurrence is written in (one recorded op each, no Tensor on the way) ----
def _add(a: LazyBuffer, b: LazyBuffer) -> LazyBuffer: return a.e(BinaryOps.ADD, b)
def _sub(a: LazyBuffer, b: LazyBuffer) -> LazyBuffer: return a.e(BinaryOps.SUB, b)
def _mul(a: LazyBuffer, b: LazyBuffer) -> LazyBuffer: return a.e(BinaryOps.MUL, b)
def _where(cond: LazyBuffer, a: LazyBuffer, b: LazyBuffer) -> LazyBuffer: return cond.e(TernaryOps.WHERE, a, b)


class _Constants:
  """Constant LazyBuffers by (value, shape), made once per forward or backward instead of once per use:
  a time step reads the same few constants at the same shapes, and each made costs two LazyBuffers."""
  def __init__(self): self.made: dict[tuple[float, tuple[int, ...]], LazyBuffer] = {}

  def __call__(self, value: float, like: LazyBuffer) -> LazyBuffer:
    key = (value, like.shape)
    if key not in self.made: self.made[key] = like.const_like(value)
    return self.made[key]


def _sigmoid(x: LazyBuffer, const: _Constants) -> LazyBuffer:
  one = const(1, x)
  return one.e(BinaryOps.DIV, _add(one, _mul(x, const(-1 / math.log(2), x)).e(UnaryOps.EXP2)))


def _tanh(x: LazyBuffer, const: _Constants) -> LazyBuffer:
  return _sub(_mul(_sigmoid(_mul(x, const(2, x)), const), const(2, x)), const(1, x))


def _matmul_t(a: LazyBuffer, b: LazyBuffer) -> LazyBuffer:
  """a (n, k) @ b (m, k)^T -> (n, m): both broadcast to (n, m, k), multiplied and summed over k."""
  (n, k), m = a.shape, b.shape[0]
  rows, columns = a.reshape((n, 1, k)).expand((n, m, k)), b.reshape((1, m, k)).expand((n, m, k))
  return _mul(rows, columns).r(ReduceOps.SUM, (2,)).reshape((n, m))


def _slot(x: LazyBuffer, index: int, size: int) -> LazyBuffer:
  """x (N, k, H) at [:, index] (N, 1, H), read expanded over `size` slots."""
  n, _, hidden = x.shape
  return x.shrink(((0, n), (index, index + 1), (0, hidden))).expand((n, size, hidden))


def _one_slot(like: LazyBuffer, index: int, size: int, value: float | bool) -> LazyBuffer:
  """A constant (N, size, H) like `like`'s (N, ., H): `value` at slot `index`, zero (False) elsewhere.
  A masked view of a constant, so it is no buffer: each kernel has it inline."""
  n, _, hidden = like.shape
  dtype = dtypes.bool if isinstance(value, bool) else like.dtype
  return LazyBuffer.full(value, (n, 1, hidden), dtype, like.device).pad(((0, 0), (index, size - index - 1), (0, 0)))


SLOTS = 6   # a step's state (N, SLOTS, H): c, h, then the gate activations i, f, g, o the backward pass reads


def _forward_graph(srcs: tuple[LazyBuffer, ...], steps: int, n: int, hidden: int) -> LazyBuffer:
  """The recurrence's forward graph (LazyBuffer.subgraph builds it): xproj (L, N, 4H), h0 and c0 (N, H), w_hh (4H, H)
  -> every step's state stacked, (L+1, N, SLOTS, H), step 0 the initial state (its activations zero)."""
  xproj, h0, c0, w_hh = srcs
  gates = 4 * hidden
  const = _Constants()
  # m - 1 of the module docstring: 1 on the g gate's quarter of the gate axis, 0 elsewhere
  g_quarter = LazyBuffer.full(1.0, (n, hidden), xproj.dtype, xproj.device).pad(((0, 0), (2 * hidden, hidden)))
  m = _add(g_quarter, const(1, g_quarter))
  zeros = LazyBuffer.full(0.0, (n, SLOTS, hidden), xproj.dtype, xproj.device)
  is_c, is_h = _one_slot(zeros, 0, SLOTS, True), _one_slot(zeros, 1, SLOTS, True)
  # the initial state as one elementwise base, not a cat padded with zeros: then every step's state fills its
  # stretch of the stacked states whole, so each step's kernel writes it there in place (engine/schedule.py)
  c_slot, h_slot = (_slot(x.reshape((n, 1, hidden)), 0, SLOTS) for x in (c0, h0))
  state = _where(is_c, c_slot, _where(is_h, h_slot, zeros))
  # W_hh^T stored once per forward (H, 4H): each step's matmul then reads its rows of gate columns
  # contiguously and keeps whole vectors of gates as accumulators; read through w_hh's own (4H, H) layout,
  # its kernel summed each gate across vector lanes (batch 16, hidden 256: 241 -> 91 us a step)
  w_rows = w_hh.permute((1, 0)).contiguous().permute((1, 0))
  states = [state]
  for t in range(steps):
    h = state.shrink(((0, n), (1, 2), (0, hidden))).reshape((n, hidden))
    z = _add(xproj.shrink(((t, t + 1), (0, n), (0, gates))).reshape((n, gates)), _matmul_t(h, w_rows))
    act = _sub(_mul(m, _sigmoid(_mul(m, z), const)), g_quarter).reshape((n, 4, hidden))
    c = _add(_mul(_slot(act, 1, SLOTS), _slot(state, 0, SLOTS)), _mul(_slot(act, 0, SLOTS), _slot(act, 2, SLOTS)))
    h = _mul(_slot(act, 3, SLOTS), _tanh(c, const))
    state = _where(is_c, c, _where(is_h, h, act.pad(((0, 0), (2, 0), (0, 0)))))
    states.append(state)
  return cat([s.reshape((1, n, SLOTS, hidden)) for s in states], 0)


def _backward_graph(srcs: tuple[LazyBuffer, ...], steps: int, n: int, hidden: int) -> LazyBuffer:
  """The recurrence's backward graph: the gradient of the stacked states and the states themselves (L+1, N, SLOTS, H),
  and w_hh -> per step t = 1..L (L, N, 5, H): the gates' pre-activation gradients at [:, :, :4], dc_t at [:, :, 4]."""
  grad, stacked, w_hh = srcs
  w_hh_t = w_hh.permute((1, 0))
  const = _Constants()
  def step(t: int, index: tuple[int, int]) -> LazyBuffer:
    return stacked.shrink(((t, t + 1), (0, n), index, (0, hidden))).reshape((n, index[1] - index[0], hidden))
  states = [step(t, (0, SLOTS)) for t in range(steps + 1)]
  acts = [step(t, (2, SLOTS)) for t in range(1, steps + 1)]
  dstate = [grad.shrink(((t, t + 1), (0, n), (0, 2), (0, hidden))).reshape((n, 2, hidden)) for t in range(steps + 1)]
  like = states[0].shrink(((0, n), (0, 1), (0, hidden))).expand((n, 5, hidden))   # the (N, 5, H) constants' template
  slot = [_one_slot(like, k, 5, True) for k in range(5)]
  m = _add(_one_slot(like, 2, 5, 1.0), const(1, like))
  derivative_scale = _mul(m, m)
  dgcs: list[LazyBuffer] = []
  dgc: LazyBuffer | None = None    # the later step's (N, 5, H): its gates' gradients and dc
  for t in range(steps, 0, -1):
    act, state = acts[t - 1], states[t]
    dh = dstate[t].shrink(((0, n), (1, 2), (0, hidden))).reshape((n, hidden))
    if dgc is not None: dh = _add(dh, _matmul_t(dgc.shrink(((0, n), (0, 4), (0, hidden))).reshape((n, 4 * hidden)), w_hh_t))
    dh5 = dh.reshape((n, 1, hidden)).expand((n, 5, hidden))
    tanh_c = _tanh(_slot(state, 0, 5), const)
    one = const(1, tanh_c)
    dc = _add(_slot(dstate[t], 0, 5), _mul(_mul(dh5, _slot(act, 3, 5)), _sub(one, _mul(tanh_c, tanh_c))))
    if dgc is not None: dc = _add(dc, _mul(_slot(dgc, 4, 5), _slot(acts[t], 1, 5)))
    partner = _where(slot[0], _slot(act, 2, 5), _where(slot[1], _slot(states[t - 1], 0, 5), _slot(act, 0, 5)))
    dact = _where(slot[3], _mul(dh5, tanh_c), _mul(dc, partner))
    # each activation's derivative from its value a: m^2 s (1 - s) with s = (a + m - 1) / m
    a = act.pad(((0, 0), (0, 1), (0, 0)))
    s = _add(a, _sub(m, one)).e(BinaryOps.DIV, m)
    dgc = _where(slot[4], dc, _mul(dact, _mul(derivative_scale, _mul(s, _sub(one, s)))))
    dgcs.append(dgc)
  dgcs.reverse()
  return cat([d.reshape((1, n, 5, hidden)) for d in dgcs], 0)


class LSTMRecurrence(Function):
  """One LSTM layer's recurrence over precomputed input projections (see the module docstring).

  xproj (L, N, 4H) = x @ W_ih^T + biases, h0 and c0 (N, H), w_hh (4H, H) -> states (L+1, N, SLOTS, H):
  states[t, :, 0] is c_t, states[t, :, 1] is h_t, t = 0 the initial state. The time steps are one node each way
  (LazyBuffer.subgraph): _forward_graph and _backward_graph record their thousands of ops only when the
  scheduler meets a graph it hasn't scheduled before, so a training loop records a few ops per layer."""
  def forward(self, xproj: LazyBuffer, h0: LazyBuffer, c0: LazyBuffer, w_hh: LazyBuffer) -> LazyBuffer:
    steps, n, gates = xproj.shape
    self.w_hh, self.sizes = w_hh, (steps, n, gates // 4)
    self.stacked = LazyBuffer.subgraph((xproj, h0, c0, w_hh), _forward_graph, self.sizes,
                                       (steps + 1, n, SLOTS, gates // 4), xproj.dtype)
    return self.stacked

  def backward(self, grad: LazyBuffer):
    steps, n, hidden = self.sizes
    dgcs = LazyBuffer.subgraph((grad, self.stacked, self.w_hh), _backward_graph, self.sizes, (steps, n, 5, hidden), grad.dtype)
    dxproj = dgcs.shrink(((0, steps), (0, n), (0, 4), (0, hidden))).reshape((steps, n, 4 * hidden))
    grad_h0 = grad_c0 = grad_w = None
    if self.needs_input_grad[1]:
      dgates0 = dxproj.shrink(((0, 1), (0, n), (0, 4 * hidden))).reshape((n, 4 * hidden))
      dh0 = grad.shrink(((0, 1), (0, n), (1, 2), (0, hidden))).reshape((n, hidden))
      grad_h0 = _add(dh0, _matmul_t(dgates0, self.w_hh.permute((1, 0))))
    if self.needs_input_grad[2]:
      # dc_0 = the initial state's own gradient + dc_1 * f_1
      dc0 = grad.shrink(((0, 1), (0, n), (0, 1), (0, hidden))).reshape((n, hidden))
      dc1 = dgcs.shrink(((0, 1), (0, n), (4, 5), (0, hidden))).reshape((n, hidden))
      f1 = self.stacked.shrink(((1, 2), (0, n), (3, 4), (0, hidden))).reshape((n, hidden))
      grad_c0 = _add(dc0, _mul(dc1, f1))
    if self.needs_input_grad[3]:
      # one matmul over every step: dW_hh = sum over t of dgates_t^T @ h_(t-1)
      rows = steps * n
      h_prev = self.stacked.shrink(((0, steps), (0, n), (1, 2), (0, hidden))).reshape((rows, hidden))
      grad_w = _matmul_t(dxproj.reshape((rows, 4 * hidden)).permute((1, 0)), h_prev.permute((1, 0)))
    return dxproj, grad_h0, grad_c0, grad_w


def _check_sizes(layer: str, **sizes: int) -> None:
  for name, size in sizes.items():
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
      raise ValueError(f"{layer}: {name} must be a positive int, got {size!r}")


def _check_input(layer: str, x: Tensor, features: int, ndims: tuple[int, int]) -> None:
  if not isinstance(x, Tensor): raise TypeError(f"{layer}: input must be a Tensor, got {type(x).__name__}")
  if x.ndim not in ndims or x.shape[-1] != features:
    raise ValueError(f"{layer}: input of shape {tuple(x.shape)}, expected {ndims[0]} or {ndims[1]} dimensions "
                     f"with {features} features last")
  if not x.dtype.is_float: raise TypeError(f"{layer}: input must be floating point, got {x.dtype.name}")


def _check_state(layer: str, hx, shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
  if not isinstance(hx, (tuple, list)) or len(hx) != 2 or not all(isinstance(t, Tensor) for t in hx):
    raise TypeError(f"{layer}: the state must be a tuple (h, c) of two Tensors, got {type(hx).__name__}")
  for name, t in zip(("h", "c"), hx):
    if tuple(t.shape) != shape: raise ValueError(f"{layer}: {name} has shape {tuple(t.shape)}, expected {shape}")
  return hx[0], hx[1]


class LSTMCell(Module):
  """One LSTM step: (x (N, input_size), (h, c) (N, hidden_size)) -> (h', c'). Gates in PyTorch's order i, f, g, o;
  weight_ih (4*hidden, input), weight_hh (4*hidden, hidden), all init uniform(+-1/sqrt(hidden))."""
  def __init__(self, input_size: int, hidden_size: int, bias: bool = True):
    _check_sizes("LSTMCell", input_size=input_size, hidden_size=hidden_size)
    self.input_size, self.hidden_size = input_size, hidden_size
    bound = 1 / math.sqrt(hidden_size)
    self.weight_ih = _uniform(4 * hidden_size, input_size, bound=bound)
    self.weight_hh = _uniform(4 * hidden_size, hidden_size, bound=bound)
    self.bias_ih = _uniform(4 * hidden_size, bound=bound) if bias else None
    self.bias_hh = _uniform(4 * hidden_size, bound=bound) if bias else None

  def forward(self, x: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    _check_input("LSTMCell", x, self.input_size, (1, 2))
    unbatched = x.ndim == 1
    if unbatched: x = x.unsqueeze(0)
    shape = (x.shape[0], self.hidden_size)
    if hx is None: h, c = Tensor.zeros(*shape, requires_grad=False), Tensor.zeros(*shape, requires_grad=False)
    else: h, c = _check_state("LSTMCell", hx, shape[1:] if unbatched else shape)
    if unbatched: h, c = h.unsqueeze(0), c.unsqueeze(0)
    gates = F.linear(x, self.weight_ih, self.bias_ih) + F.linear(h, self.weight_hh, self.bias_hh)
    i, f, g, o = gates.chunk(4, dim=1)
    c = f.sigmoid() * c + i.sigmoid() * g.tanh()
    h = o.sigmoid() * c.tanh()
    return (h.squeeze(0), c.squeeze(0)) if unbatched else (h, c)


class LSTM(Module):
  """A stack of LSTM layers over a sequence, with PyTorch's parameter names (weight_ih_l0, ..., *_reverse).

  x (L, N, input_size), or (N, L, input_size) with batch_first, or unbatched (L, input_size), and optional
  (h_0, c_0) each (D*num_layers, N, hidden_size) (D = 2 when bidirectional)
  -> output (.., D*hidden_size) from the last layer, and (h_n, c_n) each (D*num_layers, N, hidden_size).
  Between layers, dropout applies to the outputs while training, as in PyTorch. How a layer runs: the
  module docstring.
  """
  def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True, batch_first: bool = False,
               dropout: float = 0.0, bidirectional: bool = False):
    _check_sizes("LSTM", input_size=input_size, hidden_size=hidden_size, num_layers=num_layers)
    if not 0 <= dropout <= 1: raise ValueError(f"LSTM: dropout must be in [0, 1], got {dropout}")
    self.input_size, self.hidden_size, self.num_layers, self.bias = input_size, hidden_size, num_layers, bias
    self.batch_first, self.dropout, self.bidirectional = batch_first, dropout, bidirectional
    bound = 1 / math.sqrt(hidden_size)
    directions = 2 if bidirectional else 1
    for layer in range(num_layers):
      layer_input = input_size if layer == 0 else hidden_size * directions
      for suffix in ("", "_reverse")[:directions]:
        setattr(self, f"weight_ih_l{layer}{suffix}", _uniform(4 * hidden_size, layer_input, bound=bound))
        setattr(self, f"weight_hh_l{layer}{suffix}", _uniform(4 * hidden_size, hidden_size, bound=bound))
        if bias:
          setattr(self, f"bias_ih_l{layer}{suffix}", _uniform(4 * hidden_size, bound=bound))
          setattr(self, f"bias_hh_l{layer}{suffix}", _uniform(4 * hidden_size, bound=bound))

  def _weights(self, name: str) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    return (getattr(self, f"weight_ih_{name}"), getattr(self, f"weight_hh_{name}"),
            getattr(self, f"bias_ih_{name}", None), getattr(self, f"bias_hh_{name}", None))

  def forward(self, x: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    _check_input("LSTM", x, self.input_size, (2, 3))
    unbatched = x.ndim == 2
    if unbatched: x = x.unsqueeze(1)
    elif self.batch_first: x = x.transpose(0, 1)
    steps, batch = x.shape[0], x.shape[1]
    if steps == 0 or batch == 0: raise ValueError(f"LSTM: input of shape {tuple(x.shape)} has no time step or no sequence")
    directions = 2 if self.bidirectional else 1
    shape = (self.num_layers * directions, batch, self.hidden_size)
    if hx is None: h0 = c0 = Tensor.zeros(*shape, dtype=x.dtype, requires_grad=False)
    else:
      h0, c0 = _check_state("LSTM", hx, (shape[0], shape[2]) if unbatched else shape)
      if unbatched: h0, c0 = h0.unsqueeze(1), c0.unsqueeze(1)
    h_n, c_n = [], []
    for layer in range(self.num_layers):
      outputs = []
      for d, suffix in enumerate(("", "_reverse")[:directions]):
        w_ih, w_hh, b_ih, b_hh = self._weights(f"l{layer}{suffix}")
        bias = b_ih + b_hh if b_ih is not None else None
        xproj = F.linear(x.reshape(steps * batch, x.shape[2]), w_ih, bias).reshape(steps, batch, 4 * self.hidden_size)
        if d == 1: xproj = xproj.flip(0)
        states = LSTMRecurrence.apply(xproj, h0[layer * directions + d], c0[layer * directions + d], w_hh)
        out = states[1:, :, 1]
        outputs.append(out if d == 0 else out.flip(0))
        h_n.append(states[steps, :, 1])
        c_n.append(states[steps, :, 0])
      x = outputs[0] if directions == 1 else outputs[0].cat(outputs[1], dim=-1)
      if self.dropout and layer < self.num_layers - 1: x = x.dropout(self.dropout, self.training)
    h_n_t, c_n_t = Tensor.stack(*h_n), Tensor.stack(*c_n)
    if unbatched: return x.squeeze(1), (h_n_t.squeeze(1), c_n_t.squeeze(1))
    return (x.transpose(0, 1) if self.batch_first else x), (h_n_t, c_n_t)
