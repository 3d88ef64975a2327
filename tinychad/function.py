"""Autograd on the primitives: each Function has its forward and its backward side by side.

in: LazyBuffers (from Tensor.lazydata)  ->  out: a LazyBuffer, and in backward the gradients of the inputs.
The Tensor front end (tensor.py) composes every other op from these, so these are all the backward
rules the framework has. This module sits below the front end and imports nothing from it: apply()
makes its result with the inputs' own class (Tensor), and gradients are added up on LazyBuffers.
"""
from __future__ import annotations
import itertools
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, replace
import numpy as np
from tinychad.dtype import dtypes
from tinychad.helpers import getenv, inverse_permutation
from tinychad.host import simd_bytes
from tinychad.lazy import LazyBuffer
from tinychad.ops import AttentionArg, UnaryOps, BinaryOps, TernaryOps, ReduceOps, LoadOps


class Function:
  requires_grad: bool | None   # True if an input requires grad, else None if one might (tinygrad's "not decided")
  parents: tuple               # the input tensors, kept where a backward pass may come through
  # where nothing will differentiate the result (no_grad, or no input that may need a gradient), a Function with a
  # `one_node` records its forward as that one node (LazyBuffer.subgraph) instead of the ops it is made of: the
  # scheduler builds those ops only for a graph it hasn't scheduled before, so a decoding loop that repeats
  # itself records a layer's few nodes per token, not its dozens of ops. A movement op's forward is one view
  # already: its one_node is that view, made without the node for backward (~0.5 us less per view)
  one_node: Callable[..., LazyBuffer] | None = None

  @property
  def needs_input_grad(self) -> list[bool]:
    """Which inputs get a gradient (requires_grad True or None); asked in backward only, so forward pays nothing."""
    return [t.requires_grad is not False for t in self.parents]

  def backward(self, *args, **kwargs): raise RuntimeError(f"{type(self).__name__} has no gradient")

  @classmethod
  def apply(cls, *tensors, **kwargs):
    """forward() on the tensors' LazyBuffers; the result is a tensor of the first input's class (Tensor),
    linked to this node for backward unless gradients are off (Tensor.no_grad)."""
    # requires_grad: a loop, not lists, and the node made without an __init__ call: every recorded op runs this
    requires_grad = False
    for t in tensors:
      needs = t.requires_grad
      if needs:
        requires_grad = True
        break
      if needs is None: requires_grad = None
    tensor_type = type(tensors[0])
    if cls.one_node is not None and (requires_grad is False or tensor_type.no_grad):
      return tensor_type.from_lazy(cls.one_node(*map(_lazydata, tensors), **kwargs), False)
    ctx = object.__new__(cls)
    ctx.requires_grad = requires_grad
    # None records the graph too: a backward pass that reaches a None leaf gives it a grad
    if requires_grad is not False: ctx.parents = tensors
    # a call through *map(...) and **kwargs costs ~0.2 us more than one with its arguments spelled out, and most
    # ops have one or two inputs and no keywords
    if kwargs or len(tensors) > 2: result = ctx.forward(*map(_lazydata, tensors), **kwargs)
    elif len(tensors) == 2: result = ctx.forward(tensors[0].lazydata, tensors[1].lazydata)
    else: result = ctx.forward(tensors[0].lazydata)
    if tensor_type.no_grad: return tensor_type.from_lazy(result, False)
    out = tensor_type.from_lazy(result, ctx.requires_grad)
    if ctx.requires_grad is not False: out._ctx = ctx
    return out


_lazydata = operator.attrgetter("lazydata")


def _bool_to(x: LazyBuffer, like: LazyBuffer) -> LazyBuffer: return x.cast(like.dtype)


# ---- load-like ----
class Contiguous(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer: return x.contiguous()
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad


class Clone(Function):
  """Tensor.clone: a copy kernel even where contiguous() would hand back the same buffer."""
  def forward(self, x: LazyBuffer) -> LazyBuffer: return x._copy()
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad


class Gather(Function):
  """table[indices]: the rows of table (rows, *row) that integer indices pick."""
  def forward(self, table: LazyBuffer, indices: LazyBuffer) -> LazyBuffer:
    self.indices, self.rows = indices, table.shape[0]
    return table.gather(indices)
  def backward(self, grad: LazyBuffer):
    # each row of the table gets the sum of the gradient rows whose index picked it
    picks = math.prod(self.indices.shape)
    row = grad.shape[len(self.indices.shape):]
    table_grad = grad.reshape((picks,) + row).scatter_add(self.indices.reshape((picks,)), self.rows)
    return table_grad, None


class Cat(Function):
  """The pieces (one dtype, equal shapes outside `axis`) one after another along `axis`."""
  def forward(self, *pieces: LazyBuffer, axis: int) -> LazyBuffer:
    self.windows, start = [], 0
    for piece in pieces:
      end = start + piece.shape[axis]
      self.windows.append(tuple((start, end) if d == axis else (0, s) for d, s in enumerate(piece.shape)))
      start = end
    return cat(pieces, axis)
  def backward(self, grad: LazyBuffer) -> tuple[LazyBuffer | None, ...]:
    return tuple(grad.shrink(window) if needed else None for window, needed in zip(self.windows, self.needs_input_grad))

  @staticmethod
  def one_node(*pieces: LazyBuffer, axis: int) -> LazyBuffer:
    total = sum(piece.shape[axis] for piece in pieces)
    shape = tuple(total if d == axis else s for d, s in enumerate(pieces[0].shape))
    return LazyBuffer.subgraph(pieces, _cat_graph, (axis,), shape, pieces[0].dtype)


def _cat_graph(srcs: tuple[LazyBuffer, ...], axis: int) -> LazyBuffer: return cat(srcs, axis)


CAT_MAX_PIECES = 16  # a cat of more pieces goes in two steps


def cat(pieces: tuple[LazyBuffer, ...] | list[LazyBuffer], axis: int) -> LazyBuffer:
  """Each piece padded with zeros to the full size along `axis`, and the padded views added (OR for bools)."""
  if len(pieces) > CAT_MAX_PIECES:
    # every piece is a padded view read by each output element: n pieces cost n reads per element.
    # Groups of ~sqrt(n) are concatenated first (each its own kernel: the scheduler realizes a
    # padded input), then the groups: 2*sqrt(n) reads (an LSTM's 150 steps: 150 -> 25)
    size = math.isqrt(len(pieces) - 1) + 1
    return cat([cat(pieces[i:i + size], axis) for i in range(0, len(pieces), size)], axis)
  total = sum(piece.shape[axis] for piece in pieces)
  combine = BinaryOps.OR if pieces[0].dtype == dtypes.bool else BinaryOps.ADD
  out, start = None, 0
  for piece in pieces:
    size = piece.shape[axis]
    padded = piece.pad(tuple((start, total - start - size) if d == axis else (0, 0) for d in range(len(piece.shape))))
    out = padded if out is None else out.e(combine, padded)
    start += size
  return out


class Copy(Function):
  def forward(self, x: LazyBuffer, device: str) -> LazyBuffer:
    self.input_device = x.device
    return x.copy_to_device(device)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.copy_to_device(self.input_device)


class Cast(Function):
  def forward(self, x: LazyBuffer, dtype) -> LazyBuffer:
    self.input_dtype = x.dtype
    return x.cast(dtype)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.cast(self.input_dtype)


# ---- unary ----
class Neg(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer: return x.e(UnaryOps.NEG)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.e(UnaryOps.NEG)


class Reciprocal(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.ret = x.e(UnaryOps.RECIP)
    return self.ret
  def backward(self, grad: LazyBuffer) -> LazyBuffer:
    return grad.e(UnaryOps.NEG).e(BinaryOps.MUL, self.ret).e(BinaryOps.MUL, self.ret)


class Sin(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.x = x
    return x.e(UnaryOps.SIN)
  def backward(self, grad: LazyBuffer) -> LazyBuffer:
    cos = self.x.const_like(math.pi / 2).e(BinaryOps.SUB, self.x).e(UnaryOps.SIN)
    return cos.e(BinaryOps.MUL, grad)


class Relu(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.ret = x.e(BinaryOps.MAX, x.const_like(0))
    return self.ret
  def backward(self, grad: LazyBuffer) -> LazyBuffer:
    return _bool_to(self.ret.const_like(0).e(BinaryOps.CMPLT, self.ret), grad).e(BinaryOps.MUL, grad)


class Log(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.x = x
    return x.e(UnaryOps.LOG2).e(BinaryOps.MUL, x.const_like(math.log(2)))
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.e(BinaryOps.DIV, self.x)


class Exp(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.ret = x.e(BinaryOps.MUL, x.const_like(1 / math.log(2))).e(UnaryOps.EXP2)
    return self.ret
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return self.ret.e(BinaryOps.MUL, grad)


class Sqrt(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.ret = x.e(UnaryOps.SQRT)
    return self.ret
  def backward(self, grad: LazyBuffer) -> LazyBuffer:
    return grad.e(BinaryOps.DIV, self.ret.e(BinaryOps.MUL, self.ret.const_like(2)))


class Sigmoid(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    exp_neg = x.e(BinaryOps.MUL, x.const_like(-1 / math.log(2))).e(UnaryOps.EXP2)
    self.ret = x.const_like(1).e(BinaryOps.DIV, x.const_like(1).e(BinaryOps.ADD, exp_neg))
    return self.ret
  def backward(self, grad: LazyBuffer) -> LazyBuffer:
    one_minus = self.ret.const_like(1).e(BinaryOps.SUB, self.ret)
    return self.ret.e(BinaryOps.MUL, one_minus).e(BinaryOps.MUL, grad)


class Trunc(Function):
  """Rounds toward zero; its gradient is zero almost everywhere, as in PyTorch."""
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.x = x
    return x.e(UnaryOps.TRUNC)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.const_like(0)


class Erf(Function):
  """One node of the lazy graph, which the scheduler expands into erf's series (engine/erf.py). The gradient is
  erf's own, 2/sqrt(pi) exp(-x^2): autograd through the series would keep every Horner step's value for backward."""
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.x = x
    return x.e(UnaryOps.ERF)
  def backward(self, grad: LazyBuffer) -> LazyBuffer:
    x = self.x
    gaussian = x.e(BinaryOps.MUL, x).e(UnaryOps.NEG).e(BinaryOps.MUL, x.const_like(1 / math.log(2))).e(UnaryOps.EXP2)
    return gaussian.e(BinaryOps.MUL, x.const_like(2 / math.sqrt(math.pi))).e(BinaryOps.MUL, grad)


class Gelu(Function):
  """PyTorch's exact GELU, x times the normal distribution's CDF: (x / 2) (1 + erf(x / sqrt 2)), one Function instead of
  the five ops it records (a transformer's MLP has one per layer and decoding step). The gradient is the CDF plus x
  times the density: (1 + erf(x / sqrt 2)) / 2 + x exp(-x^2 / 2) / sqrt(2 pi)."""
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.x = x
    scaled = x.e(BinaryOps.MUL, x.const_like(1 / math.sqrt(2)))
    self.erf_plus_one = scaled.e(UnaryOps.ERF).e(BinaryOps.ADD, x.const_like(1.0))
    return x.e(BinaryOps.MUL, x.const_like(0.5)).e(BinaryOps.MUL, self.erf_plus_one)

  def backward(self, grad: LazyBuffer) -> LazyBuffer:
    x = self.x
    # exp(-x^2 / 2) as exp2(-x^2 / (2 ln 2)), the exponential the kernels have
    density = x.e(BinaryOps.MUL, x).e(BinaryOps.MUL, x.const_like(-0.5 / math.log(2))).e(UnaryOps.EXP2)
    density = density.e(BinaryOps.MUL, x.const_like(1 / math.sqrt(2 * math.pi)))
    slope = self.erf_plus_one.e(BinaryOps.MUL, x.const_like(0.5)).e(BinaryOps.ADD, x.e(BinaryOps.MUL, density))
    return grad.e(BinaryOps.MUL, slope)

  @staticmethod
  def one_node(x: LazyBuffer) -> LazyBuffer: return LazyBuffer.subgraph((x,), _gelu_graph, (), x.shape, x.dtype)


def _gelu_graph(srcs: tuple[LazyBuffer, ...]) -> LazyBuffer: return object.__new__(Gelu).forward(*srcs)


# ---- binary (inputs already broadcast to one shape and cast to one dtype) ----
class Add(Function):
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer: return x.e(BinaryOps.ADD, y)
  def backward(self, grad: LazyBuffer):
    return grad if self.needs_input_grad[0] else None, grad if self.needs_input_grad[1] else None


class Sub(Function):
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer: return x.e(BinaryOps.SUB, y)
  def backward(self, grad: LazyBuffer):
    return grad if self.needs_input_grad[0] else None, grad.e(UnaryOps.NEG) if self.needs_input_grad[1] else None


class Mul(Function):
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    self.x, self.y = x, y
    return x.e(BinaryOps.MUL, y)
  def backward(self, grad: LazyBuffer):
    return (self.y.e(BinaryOps.MUL, grad) if self.needs_input_grad[0] else None,
            self.x.e(BinaryOps.MUL, grad) if self.needs_input_grad[1] else None)


class Div(Function):
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    self.x, self.y = x, y
    return x.e(BinaryOps.DIV, y)
  def backward(self, grad: LazyBuffer):
    grad_x = grad.e(BinaryOps.DIV, self.y) if self.needs_input_grad[0] else None
    grad_y = None
    if self.needs_input_grad[1]:
      grad_y = grad.e(UnaryOps.NEG).e(BinaryOps.MUL, self.x).e(BinaryOps.DIV, self.y.e(BinaryOps.MUL, self.y))
    return grad_x, grad_y


class Maximum(Function):
  """Ties split the gradient in half between the inputs, as PyTorch does."""
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    self.x, self.y = x, y
    return x.e(BinaryOps.MAX, y)
  def backward(self, grad: LazyBuffer):
    x_wins = _bool_to(self.y.e(BinaryOps.CMPLT, self.x), grad)
    tie = _bool_to(self.x.e(BinaryOps.CMPEQ, self.y), grad).e(BinaryOps.MUL, grad.const_like(0.5))
    share_x = x_wins.e(BinaryOps.ADD, tie)
    share_y = grad.const_like(1).e(BinaryOps.SUB, share_x)
    return (share_x.e(BinaryOps.MUL, grad) if self.needs_input_grad[0] else None,
            share_y.e(BinaryOps.MUL, grad) if self.needs_input_grad[1] else None)


class Remainder(Function):
  """PyTorch's (and Python's) remainder: C's fmod moved into the divisor's sign, for floats and integers.
  d/dx = 1, d/dy = -floor(x / y)."""
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    self.x, self.y = x, y
    rem = x.e(BinaryOps.MOD, y)
    zero = rem.const_like(0)
    signs_differ = rem.e(BinaryOps.CMPLT, zero).e(BinaryOps.CMPNE, y.e(BinaryOps.CMPLT, y.const_like(0)))
    adjust = rem.e(BinaryOps.CMPNE, zero).e(BinaryOps.AND, signs_differ)
    return adjust.e(TernaryOps.WHERE, rem.e(BinaryOps.ADD, y), rem)
  def backward(self, grad: LazyBuffer):
    grad_y = None
    if self.needs_input_grad[1]:
      quotient = self.x.e(BinaryOps.DIV, self.y)
      truncated = quotient.e(UnaryOps.TRUNC)
      floor = quotient.e(BinaryOps.CMPLT, truncated).e(TernaryOps.WHERE, truncated.e(BinaryOps.SUB, truncated.const_like(1)), truncated)
      grad_y = floor.e(UnaryOps.NEG).e(BinaryOps.MUL, grad)
    return grad if self.needs_input_grad[0] else None, grad_y


class NoGradBinary(Function):
  """Comparisons, integer division, remainder and bitwise ops: piecewise constant, no gradient."""
  def forward(self, x: LazyBuffer, y: LazyBuffer, op: BinaryOps) -> LazyBuffer: return x.e(op, y)
  def backward(self, grad: LazyBuffer): return None, None


class Where(Function):
  def forward(self, cond: LazyBuffer, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    self.cond = cond
    return cond.e(TernaryOps.WHERE, x, y)
  def backward(self, grad: LazyBuffer):
    zero = grad.const_like(0)
    return (None,
            self.cond.e(TernaryOps.WHERE, grad, zero) if self.needs_input_grad[1] else None,
            self.cond.e(TernaryOps.WHERE, zero, grad) if self.needs_input_grad[2] else None)


# ---- reduce ----
# The reduces take the result's `shape`, the reduced axes kept as 1s or dropped (keepdim=False): the reshape
# that drops them is part of the op, not a recorded op of its own (one Function, Tensor and LazyBuffer less)
class ArgMax(Function):
  """The index of the first maximum along `axis`, as PyTorch's argmax: where x equals its maximum, the largest of
  `countdown` (n, n-1, ..., 1: an int64 input), taken from n; a NaN counts as the maximum (the max is NaN then), as in
  PyTorch. One Function, so that a decoding step's greedy pick is one node (one_node, which it always takes: an index
  has no gradient), not its nine ops."""
  def forward(self, x: LazyBuffer, countdown: LazyBuffer, axis: int) -> LazyBuffer:
    """The index with `axis` kept as 1 (the node's shape: one_node drops the axis for keepdim=False)."""
    n = x.shape[axis]
    is_max = x.e(BinaryOps.CMPEQ, x.r(ReduceOps.MAX, (axis,)).expand(x.shape))
    if x.dtype.is_float: is_max = is_max.e(BinaryOps.OR, x.e(BinaryOps.CMPNE, x))
    ranks = countdown.reshape(tuple(n if d == axis else 1 for d in range(len(x.shape)))).expand(x.shape)
    first = is_max.cast(countdown.dtype).e(BinaryOps.MUL, ranks).r(ReduceOps.MAX, (axis,))
    return first.const_like(n).e(BinaryOps.SUB, first)

  @staticmethod
  def one_node(x: LazyBuffer, countdown: LazyBuffer, axis: int, keepdim: bool) -> LazyBuffer:
    kept = tuple(1 if d == axis else s for d, s in enumerate(x.shape))
    node = LazyBuffer.subgraph((x, countdown), _argmax_graph, (axis,), kept, countdown.dtype)
    return node if keepdim else node.reshape(kept[:axis] + kept[axis + 1:])


def _argmax_graph(srcs: tuple[LazyBuffer, ...], axis: int) -> LazyBuffer:
  return object.__new__(ArgMax).forward(*srcs, axis=axis)


class Sum(Function):
  def forward(self, x: LazyBuffer, axis: tuple[int, ...], shape: tuple[int, ...]) -> LazyBuffer:
    self.input_shape = x.shape
    out = x.r(ReduceOps.SUM, axis)
    self.kept_shape = out.shape
    return out.reshape(shape)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.reshape(self.kept_shape).expand(self.input_shape)


class Max(Function):
  """Ties share the gradient evenly, as PyTorch's amax does."""
  def forward(self, x: LazyBuffer, axis: tuple[int, ...], shape: tuple[int, ...]) -> LazyBuffer:
    self.x, self.axis = x, axis
    self.ret = x.r(ReduceOps.MAX, axis)
    return self.ret.reshape(shape)
  def backward(self, grad: LazyBuffer) -> LazyBuffer:
    grad = grad.reshape(self.ret.shape)
    is_max = _bool_to(self.x.e(BinaryOps.CMPEQ, self.ret.expand(self.x.shape)), grad)
    count = is_max.r(ReduceOps.SUM, self.axis).expand(self.x.shape)
    return is_max.e(BinaryOps.DIV, count).e(BinaryOps.MUL, grad.expand(self.x.shape))


# ---- normalization ----
class LayerNorm(Function):
  """(x - mean) / sqrt(var + eps) over `axes` (biased variance, as PyTorch), then times weight and plus bias where
  given (`affine` says which of the two follow x; both have the shape of the trailing `axes`). One Function rather
  than the ~18 ops it records (a decoding step has nine): each would cost a Python call forward and one back. The
  backward is the closed form: dx = (dxhat - mean(dxhat) - xhat mean(dxhat xhat)) / std, dxhat = grad weight."""
  def forward(self, x: LazyBuffer, *params: LazyBuffer, axes: tuple[int, ...], eps: float,
              affine: tuple[bool, bool]) -> LazyBuffer:
    """params: the weight if affine[0], then the bias if affine[1]."""
    self.axes, self.count = axes, math.prod(x.shape[a] for a in axes)
    centered = x.e(BinaryOps.SUB, self._mean(x).expand(x.shape))
    variance = self._mean(centered.e(BinaryOps.MUL, centered))
    eps_operand = LazyBuffer.operand(float(eps), variance.shape, variance.dtype, variance.device)
    self.inv_std = variance.e(BinaryOps.ADD, eps_operand).e(UnaryOps.SQRT).e(UnaryOps.RECIP).expand(x.shape)
    self.normalized = out = centered.e(BinaryOps.MUL, self.inv_std)
    self.weight = self.bias = None
    if affine[0]: self.weight, params = _trailing(params[0], x.shape), params[1:]
    if affine[1]: self.bias = _trailing(params[0], x.shape)
    if self.weight is not None: out = out.e(BinaryOps.MUL, self.weight)
    return out.e(BinaryOps.ADD, self.bias) if self.bias is not None else out

  @staticmethod
  def one_node(x: LazyBuffer, *params: LazyBuffer, axes: tuple[int, ...], eps: float, affine: tuple[bool, bool]) -> LazyBuffer:
    return LazyBuffer.subgraph((x,) + params, _layer_norm_graph, (axes, eps, affine), x.shape, x.dtype)

  def backward(self, grad: LazyBuffer):
    shape, normalized = grad.shape, self.normalized
    lead = tuple(a for a in range(len(shape)) if a not in self.axes)     # what a weight's gradient sums over
    grads: list[LazyBuffer | None] = [None]
    if self.weight is not None:
      wanted = self.needs_input_grad[len(grads)]
      grads.append(_sum_to(grad.e(BinaryOps.MUL, normalized), lead) if wanted else None)
    if self.bias is not None: grads.append(_sum_to(grad, lead) if self.needs_input_grad[len(grads)] else None)
    if self.needs_input_grad[0]:
      dnormalized = grad.e(BinaryOps.MUL, self.weight) if self.weight is not None else grad
      mean_d = self._mean(dnormalized).expand(shape)
      mean_dn = self._mean(dnormalized.e(BinaryOps.MUL, normalized)).expand(shape)
      centered = dnormalized.e(BinaryOps.SUB, mean_d).e(BinaryOps.SUB, normalized.e(BinaryOps.MUL, mean_dn))
      grads[0] = centered.e(BinaryOps.MUL, self.inv_std)
    return tuple(grads)

  def _mean(self, x: LazyBuffer) -> LazyBuffer:
    """x's mean over the axes, kept as size 1 (a sum divided by the count, as Tensor.mean)."""
    total = x.r(ReduceOps.SUM, self.axes)
    return total.e(BinaryOps.DIV, LazyBuffer.operand(float(self.count), total.shape, total.dtype, total.device))


def _layer_norm_graph(srcs: tuple[LazyBuffer, ...], axes: tuple[int, ...], eps: float, affine: tuple[bool, bool]) -> LazyBuffer:
  return object.__new__(LayerNorm).forward(*srcs, axes=axes, eps=eps, affine=affine)


def _trailing(param: LazyBuffer, shape: tuple[int, ...]) -> LazyBuffer:
  """A parameter shaped like the trailing axes of `shape`, seen at `shape`."""
  return param.reshape((1,) * (len(shape) - len(param.shape)) + param.shape).expand(shape)


def _sum_to(x: LazyBuffer, lead: tuple[int, ...]) -> LazyBuffer:
  """x summed over the leading axes `lead`, shaped as the trailing rest (a weight's or bias's gradient)."""
  return x.r(ReduceOps.SUM, lead).reshape(tuple(s for a, s in enumerate(x.shape) if a not in lead)) if lead else x


# ---- matrix product ----
class Matmul(Function):
  """x (..., n, k) @ w (..., k, m), equal batch axes (the caller broadcasts them):
  out[..., i, j] = sum over r of x[..., i, r] * w[..., r, j].
  Both are seen as (..., n, m, k) through broadcast views (no copies), multiplied, and summed over the
  last axis, so the reduce runs along k and SIMD lanes along m (codegen/opt.py's register tile). One
  Function rather than the eight movement and arithmetic ops it records: a matmul is recorded often
  enough that their Python (~20 us a call) is worth saving. Integers are summed as int64 and cast back to
  their own dtype, which wraps as PyTorch's integer matmul does (sums modulo 2^bits agree either way)."""
  def forward(self, x: LazyBuffer, w: LazyBuffer, transposed: bool = False) -> LazyBuffer:
    """transposed: w is given as (..., m, k), and gets its gradient so (Linear's weight)."""
    self.transposed = transposed
    out, self.rows, self.columns, self.lead, self.full = _matmul(x, w, transposed)
    return out

  def backward(self, grad: LazyBuffer):
    # as for the broadcast multiply and sum it is: each operand's gradient is the other one times the
    # output's gradient, summed over the axis that operand was broadcast along (m for x, n for w).
    # That is grad @ w^T, and x^T @ grad computed as (grad^T @ x)^T: a Linear layer's weight (out, in),
    # used as w = weight.T, gets its gradient in its own layout, so the optimizer's update reads it in order.
    *_, n, m, k = self.full
    n_axis, m_axis = len(self.lead), len(self.lead) + 1
    spread = grad.reshape(grad.shape + (1,)).expand(self.full)
    grad_x = grad_w = None
    if self.needs_input_grad[0]:
      grad_x = self.columns.e(BinaryOps.MUL, spread).r(ReduceOps.SUM, (m_axis,)).reshape(self.lead + (n, k))
    if self.needs_input_grad[1]:
      grad_w = self.rows.e(BinaryOps.MUL, spread).r(ReduceOps.SUM, (n_axis,)).reshape(self.lead + (m, k))
      if not self.transposed: grad_w = _swap_last(grad_w)
    return grad_x, grad_w


class Linear(Matmul):
  """PyTorch's linear, x (..., k) @ weight (m, k).T + bias (m,): Matmul's forward and backward on the rows of x as
  one (rows, k) matrix, in one Function instead of the six ops (reshapes, the transpose, the bias's broadcast, the
  add) a layer records otherwise: the same lazy graph, one Python call."""
  def forward(self, x: LazyBuffer, weight: LazyBuffer, *bias: LazyBuffer) -> LazyBuffer:
    self.input_shape, self.has_bias, k, m = x.shape, bool(bias), x.shape[-1], weight.shape[0]
    out = super().forward(x.reshape((math.prod(x.shape[:-1]), k)), weight, transposed=True)
    if bias: out = out.e(BinaryOps.ADD, bias[0].reshape((1, m)).expand(out.shape))
    return out.reshape(x.shape[:-1] + (m,))

  @staticmethod
  def one_node(x: LazyBuffer, weight: LazyBuffer, *bias: LazyBuffer) -> LazyBuffer:
    # the node is the base the forward computes: the sum with its bias added, or the matmul's sum (whose last axis,
    # the one summed, is kept as 1), seen at x's shape outside the node
    rows, m = math.prod(x.shape[:-1]), weight.shape[0]
    shape = (rows, m) if bias else (rows, m, 1)
    node = LazyBuffer.subgraph((x.reshape((rows, x.shape[-1])), weight) + bias, _linear_graph, (shape,), shape, x.dtype)
    return node.reshape(x.shape[:-1] + (m,))

  def backward(self, grad: LazyBuffer):
    rows = grad.reshape((math.prod(grad.shape[:-1]), grad.shape[-1]))
    grad_x, grad_w = super().backward(rows)
    grads = (grad_x.reshape(self.input_shape) if grad_x is not None else None, grad_w)
    if not self.has_bias: return grads
    return grads + (rows.r(ReduceOps.SUM, (0,)).reshape(rows.shape[1:]) if self.needs_input_grad[2] else None,)


def _linear_graph(srcs: tuple[LazyBuffer, ...], shape: tuple[int, ...]) -> LazyBuffer:
  return object.__new__(Linear).forward(*srcs).reshape(shape)


def _matmul(x: LazyBuffer, w: LazyBuffer, transposed: bool = False):
  """x @ w (see Matmul), or x @ w^T if `transposed`, with the broadcast views it multiplied and their shapes:
  (out, rows, columns, lead, full)."""
  *batch, n, k = x.shape
  columns = w if transposed else _swap_last(w)
  m, lead = columns.shape[-2], tuple(batch)
  full = lead + (n, m, k)
  rows = x.reshape(lead + (n, 1, k)).expand(full)
  columns = columns.reshape(lead + (1, m, k)).expand(full)
  product = rows.e(BinaryOps.MUL, columns)
  if product.dtype.is_float: out = product.r(ReduceOps.SUM, (len(full) - 1,))
  else: out = product.cast(dtypes.int64).r(ReduceOps.SUM, (len(full) - 1,)).cast(x.dtype)
  return out.reshape(lead + (n, m)), rows, columns, lead, full


def _swap_last(x: LazyBuffer) -> LazyBuffer:
  order = tuple(range(len(x.shape) - 2)) + (len(x.shape) - 1, len(x.shape) - 2)
  return x.permute(order)


# ---- movement ----
class Reshape(Function):
  def forward(self, x: LazyBuffer, shape: tuple[int, ...]) -> LazyBuffer:
    self.input_shape = x.shape
    return x.reshape(shape)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.reshape(self.input_shape)
  @staticmethod
  def one_node(x: LazyBuffer, shape: tuple[int, ...]) -> LazyBuffer: return x.reshape(shape)


class Permute(Function):
  def forward(self, x: LazyBuffer, order: tuple[int, ...]) -> LazyBuffer:
    self.order = order
    return x.permute(order)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.permute(inverse_permutation(self.order))
  @staticmethod
  def one_node(x: LazyBuffer, order: tuple[int, ...]) -> LazyBuffer: return x.permute(order)


class Expand(Function):
  """x broadcast to `shape`, which may have more dims (x's shape is padded with leading 1s first: a reshape inside
  the op, not one of its own)."""
  def forward(self, x: LazyBuffer, shape: tuple[int, ...]) -> LazyBuffer:
    self.input_shape = x.shape
    self.padded = (1,) * (len(shape) - len(x.shape)) + x.shape
    return x.reshape(self.padded).expand(shape)
  def backward(self, grad: LazyBuffer) -> LazyBuffer:
    axes = tuple(i for i, (a, b) in enumerate(zip(self.padded, grad.shape)) if a != b)
    return (grad.r(ReduceOps.SUM, axes) if axes else grad).reshape(self.input_shape)


class Pad(Function):
  def forward(self, x: LazyBuffer, arg: tuple[tuple[int, int], ...]) -> LazyBuffer:
    self.window = tuple((b, b + s) for s, (b, _) in zip(x.shape, arg))
    return x.pad(arg)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.shrink(self.window)
  @staticmethod
  def one_node(x: LazyBuffer, arg: tuple[tuple[int, int], ...]) -> LazyBuffer: return x.pad(arg)


class Shrink(Function):
  def forward(self, x: LazyBuffer, arg: tuple[tuple[int, int], ...]) -> LazyBuffer:
    self.input_shape, self.window = x.shape, arg
    return x.shrink(arg)
  def backward(self, grad: LazyBuffer) -> SliceGradient:
    return SliceGradient(grad, tuple((start, s - end) for s, (start, end) in zip(self.input_shape, self.window)))
  @staticmethod
  def one_node(x: LazyBuffer, arg: tuple[tuple[int, int], ...]) -> LazyBuffer: return x.shrink(arg)


# ---- adding up the gradients a tensor gets from its several users ----
SLICES_AS_CAT = 8   # this many slices' gradients (or more) are put together as a cat, not summed


@dataclass(frozen=True)
class SliceGradient:
  """Shrink's gradient, its padding left to do until sum_gradients adds up the gradients of the tensor
  that was sliced: many slices of one tensor (an RNN's x[t] at every step) fit together as one cat,
  where a sum of full-size padded views would read every one of them at every element (150 steps:
  150 reads per element, against ~2*sqrt(150) for a cat)."""
  grad: LazyBuffer
  padding: tuple[tuple[int, int], ...]

  @property
  def shape(self) -> tuple[int, ...]: return tuple(s + before + after for s, (before, after) in zip(self.grad.shape, self.padding))

  def padded(self) -> LazyBuffer: return self.grad.pad(self.padding)


def sum_gradients(parts: list[LazyBuffer | SliceGradient]) -> LazyBuffer:
  """The total of the gradients a tensor got from its users, in the order they came."""
  slices = [part for part in parts if isinstance(part, SliceGradient)]
  assembled = _slices_as_cat(slices) if len(slices) >= SLICES_AS_CAT else None
  if assembled is not None: parts = [part for part in parts if not isinstance(part, SliceGradient)] + [assembled]
  total = None
  for part in parts:
    grad = part.padded() if isinstance(part, SliceGradient) else part
    total = grad if total is None else total.e(BinaryOps.ADD, grad)
  return total


def _slices_as_cat(slices: list[SliceGradient]) -> LazyBuffer | None:
  """Slices along one axis that don't overlap, put together with zeros in the gaps; None otherwise."""
  axes = {axis for part in slices for axis, pads in enumerate(part.padding) if pads != (0, 0)}
  if len(axes) != 1: return None
  axis = axes.pop()
  first = slices[0].grad
  size = slices[0].shape[axis]
  pieces, end = [], 0
  for part in sorted(slices, key=lambda part: part.padding[axis][0]):
    start = part.padding[axis][0]
    if start < end: return None       # overlapping slices add up: left to the sum
    if start > end: pieces.append(LazyBuffer.full(0, _with(first.shape, axis, start - end), first.dtype, first.device))
    pieces.append(part.grad)
    end = start + part.grad.shape[axis]
  if end < size: pieces.append(LazyBuffer.full(0, _with(first.shape, axis, size - end), first.dtype, first.device))
  return cat(pieces, axis)


def _with(shape: tuple[int, ...], axis: int, size: int) -> tuple[int, ...]: return shape[:axis] + (size,) + shape[axis + 1:]


class Flip(Function):
  def forward(self, x: LazyBuffer, axes: tuple[bool, ...]) -> LazyBuffer:
    self.axes = axes
    return x.flip(axes)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.flip(self.axes)
  @staticmethod
  def one_node(x: LazyBuffer, axes: tuple[bool, ...]) -> LazyBuffer: return x.flip(axes)


# ---- convolution ----
# A convolution is a windowed view of the input (movement ops only: pool_windows) multiplied by the
# weight and summed: one reduce kernel, no im2col copy. Conv is one autograd node whose backward is two
# more such window sums (or, for the input gradient of a small image with a wide kernel or of a strided
# convolution, a matmul, or for a depthwise one a product, and a sum of shifted views), so no gradient
# scatters overlapping windows. ConvTranspose is Conv's input gradient as a forward, so its backward is
# Conv's forward and weight gradient. The helpers below record on LazyBuffers the ops Tensor methods
# would (a broadcast multiply expands both sides; an integer sum is an int64 sum).

@dataclass(frozen=True)
class ConvGeometry:
  stride: tuple[int, ...]
  pads: tuple[tuple[int, int], ...]      # (before, after) per spatial dim
  dilation: tuple[int, ...]
  groups: int


def pool_windows(x, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]):
  """(..., *spatial) -> (..., *out, *kernel): every window of the last len(kernel) dims, as a view.
  Movement ops only, which a Tensor (pooling, with autograd) and a LazyBuffer (Conv) spell alike."""
  n = len(kernel)
  lead, spatial = x.shape[:-n], x.shape[-n:]
  outs = [(i - d * (k - 1) - 1) // s + 1 for i, k, s, d in zip(spatial, kernel, stride, dilation)]
  nl = len(lead)
  if all(k == s for k, s in zip(kernel, stride)) and all(d == 1 for d in dilation):
    # non-overlapping windows: crop to whole windows, split each dim into (out, kernel)
    x = x.shrink(tuple((0, s) for s in lead) + tuple((0, o * k) for o, k in zip(outs, kernel)))
    x = x.reshape(lead + tuple(v for o, k in zip(outs, kernel) for v in (o, k)))
    return x.permute(tuple(range(nl)) + tuple(nl + 2 * i for i in range(n)) + tuple(nl + 2 * i + 1 for i in range(n)))
  # overlapping windows: repeat each dim e times, so that the row r of a (kernel, i+d) reshape starts
  # r*d further into the input; a stride s step is then every s-th column
  repeats = (1,) * nl + tuple(math.ceil(k * (i + d) / i) for i, k, d in zip(spatial, kernel, dilation))
  x = x.reshape(tuple(v for s in x.shape for v in (1, s)))
  x = x.expand(tuple(v for r, s in zip(repeats, lead + spatial) for v in (r, s)))
  x = x.reshape(tuple(r * s for r, s in zip(repeats, lead + spatial)))
  x = x.shrink(tuple((0, s) for s in lead) + tuple((0, k * (i + d)) for i, k, d in zip(spatial, kernel, dilation)))
  x = x.reshape(lead + tuple(v for i, k, d in zip(spatial, kernel, dilation) for v in (k, i + d)))
  # fit each row to o*s columns: cropped where it is longer, zero-padded where shorter
  fit = tuple(p for i, d, o, s in zip(spatial, dilation, outs, stride) for p in ((0, 0), (0, o * s - (i + d))))
  x = _pad(x, ((0, 0),) * nl + fit)
  x = x.reshape(lead + tuple(v for k, o, s in zip(kernel, outs, stride) for v in (k, o, s)))
  x = x.shrink(tuple((0, s) for s in lead) + tuple(w for k, o in zip(kernel, outs) for w in ((0, k), (0, o), (0, 1))))
  x = x.reshape(lead + tuple(v for k, o in zip(kernel, outs) for v in (k, o)))
  return x.permute(tuple(range(nl)) + tuple(nl + 2 * i + 1 for i in range(n)) + tuple(nl + 2 * i for i in range(n)))


def _pad(x, pairs: tuple[tuple[int, int], ...]):
  """x (a Tensor or a LazyBuffer) padded with zeros by (before, after) per dim; a negative amount crops."""
  if any(before < 0 or after < 0 for before, after in pairs):
    x = x.shrink(tuple((max(0, -before), s - max(0, -after)) for (before, after), s in zip(pairs, x.shape)))
    pairs = tuple((max(0, before), max(0, after)) for before, after in pairs)
  return x.pad(pairs)


def _mul(x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
  """x * y broadcast against each other (numpy's rules)."""
  ndim = max(len(x.shape), len(y.shape))
  x, y = (t.reshape((1,) * (ndim - len(t.shape)) + t.shape) for t in (x, y))
  shape = tuple(b if a == 1 else a for a, b in zip(x.shape, y.shape))
  return x.expand(shape).e(BinaryOps.MUL, y.expand(shape))


def _sum(x: LazyBuffer, axes: tuple[int, ...]) -> LazyBuffer:
  """x summed over `axes` (negative ones count from the end), which are dropped."""
  axes = tuple(a % len(x.shape) for a in axes)
  if not x.dtype.is_float: x = x.cast(dtypes.int64)
  return x.r(ReduceOps.SUM, axes).reshape(tuple(s for i, s in enumerate(x.shape) if i not in axes))


def _dense(x: LazyBuffer) -> LazyBuffer:
  """x in its own contiguous buffer, unless it is a view of a constant (the gradient of a sum): a
  kernel reads a constant through any view, padding included, without memory."""
  base = x.base
  return x if base.op is LoadOps.CONST and base.realized is None else x.contiguous()


def _padded(x: LazyBuffer, pads: tuple[tuple[int, int], ...]) -> LazyBuffer:
  """(bs, c, *spatial) zero-padded by `pads`, in its own buffer: a padded read is a masked load, which the
  code generator can only do lane by lane (and whose window view needs div/mod index math); a dense
  padded copy costs one pass over the input and lets every window reduction over it run in SIMD."""
  if all(p == (0, 0) for p in pads): return x
  return _dense(_pad(x, ((0, 0), (0, 0)) + pads))


# output channels per group below which a convolution's sum is laid out NCHW, SIMD lanes along the
# output width, instead of channels-last: a channels-last sum runs its lanes over the output channels of
# one group, and with too few of them (a depthwise convolution has one) the lanes gather the input from
# channel planes apart, one element at a time. 8 (half an AVX-512 vector) still fill lanes along the
# channels for any image width, where the width may divide no vector (NCHW would then be scalar)
CHANNELS_LAST_MIN_OUT_GROUP = 8


def _window_product(x: LazyBuffer, weight: LazyBuffer, geo: ConvGeometry) -> LazyBuffer:
  """The convolution itself: windows of the padded input times the weight, summed. (bs, cin, *in) -> (bs, cout, *out)

  With at least CHANNELS_LAST_MIN_OUT_GROUP output channels per group, the sum is laid out
  channels-last, (bs, *out, cout), and returned as an NCHW view of it: output channels are the
  contiguous axis of both the sum and a (channels-last) copy of the weight, while the input is the same
  along it, so SIMD lanes run over output channels for any image width, and each weight vector is
  reused across neighbouring output positions (the same register tile as a matmul). With fewer (a
  depthwise convolution), it is laid out NCHW: the input's windows and the sum are both contiguous
  along the output width (at stride 1), the lanes run there, and the weight is one value per lane.
  """
  n, bs = len(geo.stride), x.shape[0]
  cout, cin_group = weight.shape[:2]
  kernel = weight.shape[2:]
  x = _padded(x, geo.pads)
  windows = pool_windows(x, kernel, geo.stride, geo.dilation)                 # (bs, cin, *out, *kernel)
  outs = windows.shape[2:2 + n]
  out_group = cout // geo.groups
  windows = windows.reshape((bs, geo.groups, cin_group) + outs + kernel)
  w = weight.reshape((geo.groups, out_group, cin_group) + kernel)
  spatial, taps = tuple(3 + i for i in range(n)), tuple(3 + n + i for i in range(n))
  if out_group < CHANNELS_LAST_MIN_OUT_GROUP:
    # windows as (bs, groups, 1, *out, cin_group, *kernel), weight as (1, groups, out_group, *1, cin_group, *kernel)
    windows = windows.permute((0, 1) + spatial + (2,) + taps).reshape((bs, geo.groups, 1) + outs + (cin_group,) + kernel)
    w = w.reshape((1, geo.groups, out_group) + (1,) * n + (cin_group,) + kernel)
    return _sum(_mul(windows, w), tuple(range(-1 - n, 0))).reshape((bs, cout) + outs)
  # windows as (bs, *out, groups, 1, cin_group, *kernel), weight as (1, *1, groups, out_group, cin_group, *kernel)
  windows = windows.permute((0,) + spatial + (1, 2) + taps).reshape((bs,) + outs + (geo.groups, 1, cin_group) + kernel)
  w = w.permute((0, 2) + tuple(3 + i for i in range(n)) + (1,))    # (groups, cin_group, *kernel, out_group)
  # a weight in its own buffer (a parameter) is read through the permutation: the scheduler packs it into panels
  # (or the kernel stages it) straight from there. Any other view (the input gradient's flipped weight) is
  # copied channels-last first, as packing through a flip would read it lane by lane
  if not weight.st.contiguous: w = w.contiguous()
  w = w.permute((0, 2 + n, 1) + tuple(2 + i for i in range(n))).reshape((1,) * (1 + n) + (geo.groups, out_group, cin_group) + kernel)
  out = _sum(_mul(windows, w), tuple(range(-1 - n, 0))).reshape((bs,) + outs + (cout,))
  # (bs, cout, *out) as a view of the channels-last sum: elementwise ops and reductions on it (bias,
  # ReLU, pooling) keep that layout (lazy.py), with SIMD lanes along the channels
  return out.permute((0, n + 1) + tuple(1 + i for i in range(n)))


def _spread(x: LazyBuffer, stride: tuple[int, ...]) -> LazyBuffer:
  """(bs, c, *spatial) with stride-1 zeros between neighbours: the input of a transposed convolution."""
  if all(s == 1 for s in stride): return x
  bs, c, spatial = x.shape[0], x.shape[1], x.shape[2:]
  x = x.reshape((bs, c) + tuple(v for i in spatial for v in (i, 1)))
  x = x.pad(((0, 0), (0, 0)) + tuple(p for s in stride for p in ((0, 0), (0, s - 1))))
  x = x.reshape((bs, c) + tuple(i * s for i, s in zip(spatial, stride)))
  return x.shrink(((0, bs), (0, c)) + tuple((0, (i - 1) * s + 1) for i, s in zip(spatial, stride)))


def _flipped_transposed(weight: LazyBuffer, groups: int) -> LazyBuffer:
  """(cout, cin/groups, *k) -> (cin, cout/groups, *k) with every kernel flipped: the weight of the transposed convolution."""
  cout, cin_group = weight.shape[:2]
  kernel = weight.shape[2:]
  w = weight.reshape((groups, cout // groups, cin_group) + kernel).permute((0, 2, 1) + tuple(range(3, 3 + len(kernel))))
  return w.flip((False,) * 3 + (True,) * len(kernel)).reshape((groups * cin_group, cout // groups) + kernel)


# a channels-last copy of the output gradient pays for itself when each of its elements feeds this
# many multiply-adds of the weight gradient (cin/groups * kernel size); below, the copy costs more
CHANNELS_LAST_GRAD_MIN_WORK = 128
# the weight gradient re-reads the whole output gradient once per register tile of weights: from L2 when
# it is at most this big (half of a 2 MiB L2), else the batch is summed in parts that fit
WEIGHT_GRAD_PART_BYTES = 1 << 20


def _weight_gradient_is_channels_last(weight: LazyBuffer, grad: LazyBuffer) -> bool:
  """Whether the weight gradient reads a channels-last copy of the output gradient (see below)."""
  # a gradient that is channels-last already (the ops after the convolution kept its layout) needs no
  # copy for that path, and an NCHW copy of it is a transposing kernel that doesn't vectorize (3.7 ms
  # of a 24 ms CNN step): it always takes that path
  return weight.size // weight.shape[0] >= CHANNELS_LAST_GRAD_MIN_WORK or grad.st.permuted_order is not None


def _weight_gradient(windows: LazyBuffer, grad: LazyBuffer, groups: int, out_group: int,
                     grad_cl: LazyBuffer | None) -> LazyBuffer:
  """Windows (bs, groups, cin_group, *out, *kernel) times the output gradient (bs, cout, *out), summed over
  batch and positions: (groups, out_group, cin_group, *kernel), as a view. `grad_cl` is the gradient's
  channels-last copy when the caller has made one."""
  bs, cin_group = windows.shape[0], windows.shape[2]
  n = (len(windows.shape) - 3) // 2
  outs, kernel = windows.shape[3:3 + n], windows.shape[3 + n:]
  # (bs, *out) go last, to be reduced
  windows = windows.permute((1, 2) + tuple(3 + n + i for i in range(n)) + (0,) + tuple(3 + i for i in range(n)))
  parts = _batch_parts(bs, math.prod(outs) * groups * out_group * grad.dtype.itemsize)
  if grad_cl is None:
    # outputs (groups, out_group, cin_group, *kernel): SIMD lanes run along the output width, a reduce axis
    # summed over the batch in parts that fit L2, as below
    windows = windows.reshape((groups, 1, cin_group) + kernel + (parts, bs // parts) + outs)
    windows = windows.permute((3 + n,) + tuple(i for i in range(len(windows.shape)) if i != 3 + n))
    grad_r = grad.reshape((bs, groups, out_group) + outs).permute((1, 2, 0) + tuple(3 + i for i in range(n)))
    grad_r = grad_r.reshape((groups, out_group, parts, bs // parts) + outs).permute((2, 0, 1) + tuple(range(3, 4 + n)))
    grad_r = grad_r.reshape((parts, groups, out_group, 1) + (1,) * n + (bs // parts,) + outs)
    return _sum(_sum(_mul(windows, grad_r), tuple(range(-1 - n, 0))), (0,))
  # outputs (groups, cin_group, *kernel, out_group): like the forward, SIMD lanes run over output channels,
  # contiguous in a channels-last copy of the gradient, and each gradient vector serves several weights
  # the batch is cut into `parts` (an outer, parallel axis) whose weight gradients are summed after:
  # each part's gradient then stays in L2 while every register tile of weights streams over it
  windows = windows.reshape((groups, cin_group) + kernel + (parts, bs // parts) + outs)
  windows = windows.permute((2 + n,) + tuple(i for i in range(len(windows.shape)) if i != 2 + n))
  windows = windows.reshape((parts, groups, cin_group) + kernel + (1, bs // parts) + outs)
  grad_cl = grad_cl.reshape((bs,) + outs + (groups, out_group))
  grad_cl = grad_cl.permute((1 + n, 2 + n, 0) + tuple(1 + i for i in range(n)))      # (groups, out_group, bs, *outs)
  grad_cl = grad_cl.reshape((groups, out_group, parts, bs // parts) + outs).permute((2, 0, 1) + tuple(range(3, 4 + n)))
  grad_cl = grad_cl.reshape((parts, groups, 1) + (1,) * n + (out_group, bs // parts) + outs)
  out = _sum(_sum(_mul(windows, grad_cl), tuple(range(-1 - n, 0))), (0,))
  return out.permute((0, 2 + n, 1) + tuple(2 + i for i in range(n)))


# the input gradient as one convolution over the zero-padded (and, with a stride, spread) output
# gradient multiplies every tap at every input position; for a small image and a wide kernel most of
# those land in the padding (5x5 on 8x8 outputs: 144 positions x 25 taps where 64 x 25 are real), and
# with stride 2 three in four land between the strides. At this much waste it is computed tap by tap
# instead (_input_gradient_by_taps), which does only the real products but writes a buffer of every
# output position times every tap and input channel, so it is capped
TAPWISE_MIN_WASTE = 1.5
TAPWISE_MAX_BYTES = 256 << 20


def _channels_last(grad: LazyBuffer) -> LazyBuffer:
  """(bs, c, *spatial) -> (bs, *spatial, c), contiguous (a constant gradient stays a view: no memory)."""
  n = len(grad.shape) - 2
  return _dense(grad.permute((0,) + tuple(2 + i for i in range(n)) + (1,)))


def _tapwise_pays(x_shape: tuple[int, ...], weight: LazyBuffer, grad: LazyBuffer, geo: ConvGeometry) -> bool:
  """Whether the input gradient should go tap by tap: a one-group or depthwise (one output channel per
  group) convolution whose full-correlation form (over every input position, the gradient spread by
  the stride) would waste TAPWISE_MIN_WASTE times the needed work, with a product buffer under
  TAPWISE_MAX_BYTES."""
  if geo.groups != 1 and weight.shape[0] != geo.groups: return False
  ins, outs = x_shape[2:], grad.shape[2:]
  products = x_shape[0] * math.prod(outs) * weight.size // weight.shape[0]
  return math.prod(ins) >= TAPWISE_MIN_WASTE * math.prod(outs) and products * grad.dtype.itemsize <= TAPWISE_MAX_BYTES


TapProducts = Callable[[tuple[int, ...]], tuple[LazyBuffer, LazyBuffer | None]]


def _tap_products(grad_cl: LazyBuffer, weight: LazyBuffer, groups: int) -> TapProducts:
  """For a tap, every output position's contribution through it to every input channel, from the
  channels-last output gradient (bs, *out, cout):
  products[b, *o, ci] = sum over the co of ci's group of grad[b, *o, co] * weight[co, ci % cin_group, *tap],
  as tap -> (values (bs, *out, cin), factor (cin,) or None): products = values * factor."""
  n = len(grad_cl.shape) - 2
  lead = grad_cl.shape[:-1]
  cout, cin_group = weight.shape[:2]
  kernel = weight.shape[2:]
  if groups == 1:
    # one matmul for all taps: (cout, *kernel, cin), a product row over taps, then input channels (SIMD
    # lanes of the tap sum); copied, as the matmul's lanes need them contiguous
    weight_rows = weight.permute((0,) + tuple(2 + i for i in range(n)) + (1,)).contiguous()
    weight_rows = weight_rows.reshape((cout, weight.size // cout))
    products = _matmul(grad_cl.reshape((math.prod(lead), cout)), weight_rows)[0].reshape(lead + kernel + (cin_group,))
    def tap_slice(tap: tuple[int, ...]) -> tuple[LazyBuffer, LazyBuffer | None]:
      piece = products.shrink(tuple((0, size) for size in lead) + tuple((k, k + 1) for k in tap) + ((0, cin_group),))
      return piece.reshape(lead + (cin_group,)), None
    return tap_slice
  # depthwise (one output channel per group): nothing to sum, each channel's gradient times its tap
  # weight. The factor stays apart so the tap sum shifts the gradient itself, a view of memory, and
  # multiplies as it reads (a product per tap would be a buffer as big as the gradient)
  spread_over_group = grad_cl.reshape(lead + (cout, 1)).expand(lead + (cout, cin_group)).reshape(lead + (cout * cin_group,))
  # (*kernel, cin): each tap's factors contiguous, like the SIMD lanes that read them
  taps = weight.permute(tuple(2 + i for i in range(n)) + (0, 1)).contiguous().reshape(kernel + (cout * cin_group,))
  def tap_factor(tap: tuple[int, ...]) -> tuple[LazyBuffer, LazyBuffer | None]:
    factor = taps.shrink(tuple((k, k + 1) for k in tap) + ((0, cout * cin_group),)).reshape((cout * cin_group,))
    return spread_over_group, factor
  return tap_factor


def _taps_reaching_input(kernel, outs, dilation, pads, stride, rows):
  """Each tap of a window (kernel positions) that reaches the input, with where its values go in the input's
  (q, r) layout, y = q*stride + r (rows: q's extent per axis): yields (tap, keep, pads), keep the (lo, hi) range of
  output positions per axis whose window reaches an input position through the tap, pads the two (before,
  after) paddings per axis, of q and of r, that put those positions' values where they land. A tap reaches one
  r only, and moves q one step per output position; taps that reach only padding are left out."""
  for tap in itertools.product(*(range(k) for k in kernel)):
    keep, places = [], []
    for o, k, d, (before, _), s, q_size in zip(outs, tap, dilation, pads, stride, rows):
      r = (k * d - before) % s
      shift = (k * d - before - r) // s       # the q that output position 0 reaches
      lo, hi = max(0, -shift), min(o, q_size - shift)
      keep.append((lo, hi))
      places += [(lo + shift, q_size - hi - shift), (r, s - 1 - r)]
    if all(lo < hi for lo, hi in keep): yield tap, tuple(keep), tuple(places)


def _input_gradient_by_taps(grad_cl: LazyBuffer, weight: LazyBuffer, geo: ConvGeometry,
                            x_shape: tuple[int, ...]) -> LazyBuffer:
  """The input gradient of a one-group or depthwise convolution from its channels-last output gradient (bs, *out, cout).

  _tap_products gives every output position's contribution through every tap (one matmul with one
  group, a broadcast product for a depthwise convolution), and each input position
  y = o*stride + k*dilation - pad_before sums the products that reach it. Each input axis is seen as
  (q, r) with y = q*stride + r: a tap reaches one r only, and moves q one step per output position, so
  its products are one shifted, zero-padded view, and all taps add up in one elementwise kernel.
  Returns (bs, cin, *in), a view of channels-last memory."""
  n, bs, cin = len(geo.stride), x_shape[0], x_shape[1]
  ins, outs = x_shape[2:], grad_cl.shape[1:1 + n]
  kernel = weight.shape[2:]
  products_at = _tap_products(grad_cl, weight, geo.groups)
  rows = [-(-size // s) for size, s in zip(ins, geo.stride)]      # q's extent per axis
  total = None
  for tap, keep, pads in _taps_reaching_input(kernel, outs, geo.dilation, geo.pads, geo.stride, rows):
    values, factor = products_at(tap)
    piece = values.shrink(((0, bs),) + tuple(keep) + ((0, cin),))
    piece = piece.reshape((bs,) + tuple(v for lo, hi in keep for v in (hi - lo, 1)) + (cin,))
    piece = piece.pad(((0, 0),) + tuple(pads) + ((0, 0),))
    if factor is not None: piece = _mul(piece, factor)
    total = piece if total is None else total.e(BinaryOps.ADD, piece)
  if total is None:     # every window lies in the padding (or between the strides): no gradient reaches x
    return LazyBuffer.full(0, (bs, cin) + ins, grad_cl.dtype, grad_cl.device)
  total = total.reshape((bs,) + tuple(q * s for q, s in zip(rows, geo.stride)) + (cin,))
  total = total.shrink(((0, bs),) + tuple((0, size) for size in ins) + ((0, cin),))
  return total.permute((0, n + 1) + tuple(1 + i for i in range(n)))


def _batch_parts(bs: int, sample_bytes: int) -> int:
  """The fewest parts (a divisor of bs) whose share of the output gradient fits WEIGHT_GRAD_PART_BYTES."""
  return next((p for p in range(1, bs + 1) if bs % p == 0 and bs // p * sample_bytes <= WEIGHT_GRAD_PART_BYTES), bs)


def _conv_forward(x: LazyBuffer, weight: LazyBuffer, geo: ConvGeometry) -> tuple[LazyBuffer, LazyBuffer]:
  """(the convolution, the padded input its windows read): the weight gradient reads the same copy."""
  # a channels-last input (the previous convolution's output, kept in its layout through ReLU) is
  # copied to NCHW once: both window sums of this convolution read it many times over
  if x.st.permuted_order is not None: x = x.contiguous()
  x_padded = _padded(x, geo.pads)
  unpadded = ConvGeometry(geo.stride, ((0, 0),) * len(geo.stride), geo.dilation, geo.groups)
  return _window_product(x_padded, weight, unpadded), x_padded


def _conv_input_gradient(grad: LazyBuffer, grad_cl: LazyBuffer | None, weight: LazyBuffer, geo: ConvGeometry,
                         x_shape: tuple[int, ...]) -> LazyBuffer:
  """d(conv)/dx: tap by tap from the channels-last gradient grad_cl when the caller made one for that
  (_tapwise_pays), else the gradient spread by the stride, convolved with the flipped weight."""
  if grad_cl is not None: return _input_gradient_by_taps(grad_cl, weight, geo, x_shape)
  kernel, outs = weight.shape[2:], grad.shape[2:]
  # pad the spread gradient so the "full" correlation lands exactly on the unpadded input
  pads = []
  for size, k, d, (before, after), o, s in zip(x_shape[2:], kernel, geo.dilation, geo.pads, outs, geo.stride):
    uncovered = size + before + after - ((o - 1) * s + d * (k - 1) + 1)     # trailing rows no window reached
    pads.append((d * (k - 1) - before, d * (k - 1) - after + uncovered))
  return _window_product(_spread(grad, geo.stride), _flipped_transposed(weight, geo.groups),
                         ConvGeometry((1,) * len(geo.stride), tuple(pads), geo.dilation, geo.groups))


def _conv_weight_gradient(x_padded: LazyBuffer, grad: LazyBuffer, grad_cl: LazyBuffer | None, weight_shape: tuple[int, ...],
                          geo: ConvGeometry) -> LazyBuffer:
  """d(conv)/dweight from the padded input and the output gradient (bs, cout, *out); `grad_cl` is its
  channels-last copy when the weight gradient reads that one (_weight_gradient_is_channels_last)."""
  bs, outs = x_padded.shape[0], grad.shape[2:]
  cout, cin_group = weight_shape[:2]
  kernel = weight_shape[2:]
  windows = pool_windows(x_padded, kernel, geo.stride, geo.dilation)
  # positions past the last output row (a transposed convolution's output_padding) reach no output
  lead = tuple((0, s) for s in windows.shape[:2])
  windows = windows.shrink(lead + tuple((0, o) for o in outs) + tuple((0, k) for k in kernel))
  windows = windows.reshape((bs, geo.groups, cin_group) + outs + kernel)
  return _weight_gradient(windows, grad, geo.groups, cout // geo.groups, grad_cl).reshape(weight_shape)


class MaxPool(Function):
  """The max of every window of the last len(kernel) dims of x padded by `pads` with `fill`, windows overlapping
  (a stride below the kernel, or a dilation), as one autograd node. The gradient is Max's (every element equal
  to its window's max gets the window's gradient, ties share it evenly), summed over the windows that hold it.
  Left to the movement ops of pool_windows, that sum scatter-adds the windows back through stacked views, one
  reduce with div/mod index math over repeated axes (ResNet-18's 3x3 stride 2 pool at batch 8: 52 ms; PyTorch's
  ~1 ms). Here, as in _input_gradient_by_taps, each input axis is seen as (q, r) with y = q*stride + r: a tap of
  the window reaches one r and moves q with the output position, so its part of the gradient is a shifted view
  of the per-window values, and all taps add up in one elementwise kernel over x's own positions."""
  def forward(self, x: LazyBuffer, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...],
              pads: tuple[tuple[int, int], ...], fill) -> LazyBuffer:
    self.x, self.kernel, self.stride, self.dilation, self.pads = x, kernel, stride, dilation, pads
    # the per-window values are laid out as x is (a convolution's channels-last output): the gradient's taps
    # then read them along x's contiguous axis, in SIMD
    self.order = x.st.permuted_order or tuple(range(len(x.shape)))
    physical_pads = tuple((((0, 0),) * (len(x.shape) - len(kernel)) + pads)[axis] for axis in self.order)
    physical = x.permute(self.order)
    padded = physical.pad(physical_pads)
    inside = LazyBuffer.full(True, physical.shape, dtypes.bool, x.device).pad(physical_pads)
    filled = inside.e(TernaryOps.WHERE, padded, LazyBuffer.full(fill, padded.shape, x.dtype, x.device))
    self.windows = pool_windows(filled.permute(inverse_permutation(self.order)), kernel, stride, dilation)
    self.top = self._physical(self.windows).r(ReduceOps.MAX, self._taps())
    return self._logical(self.top)

  def _taps(self) -> tuple[int, ...]: return tuple(range(len(self.order), len(self.order) + len(self.kernel)))
  def _physical(self, windows: LazyBuffer) -> LazyBuffer: return windows.permute(self.order + self._taps())
  def _logical(self, v: LazyBuffer) -> LazyBuffer:
    return v.reshape(v.shape[:len(self.order)]).permute(inverse_permutation(self.order))

  def backward(self, grad: LazyBuffer) -> LazyBuffer:
    x, n = self.x, len(self.kernel)
    lead, spatial = x.shape[:-n], x.shape[-n:]
    windows = self._physical(self.windows)
    outs = self.windows.shape[len(lead):len(lead) + n]
    count = _bool_to(windows.e(BinaryOps.CMPEQ, self.top.expand(windows.shape)), grad).r(ReduceOps.SUM, self._taps())
    # each maximum's part of its window's gradient, in the kernel of the count (built first, it takes that
    # reduce): a gradient made by a convolution would otherwise take the division into its own kernel, stored
    # in this layout where it reads the rest of the gradient in another, and lose its SIMD lanes (4 ms -> 37)
    share = self._logical(count.e(UnaryOps.RECIP).e(BinaryOps.MUL, grad.permute(self.order).reshape(count.shape)))
    top = self._logical(self.top)
    rows = [-(-size // s) for size, s in zip(spatial, self.stride)]            # q's extent per axis
    none = ((0, 0),) * len(lead)
    grid = lead + tuple(v for q, s in zip(rows, self.stride) for v in (q, s))
    x_grid = x.pad(none + tuple((0, q * s - size) for q, s, size in zip(rows, self.stride, spatial))).reshape(grid)
    total = None
    for _, keep, pads in _taps_reaching_input(self.kernel, outs, self.dilation, self.pads, self.stride, rows):
      def at_tap(v: LazyBuffer) -> LazyBuffer:
        v = v.shrink(tuple((0, size) for size in lead) + tuple(keep))
        return v.reshape(lead + tuple(u for lo, hi in keep for u in (hi - lo, 1))).pad(none + tuple(pads))
      # where the tap reaches no window both views read the padding's zeros: the product is 0
      piece = _bool_to(x_grid.e(BinaryOps.CMPEQ, at_tap(top)), grad).e(BinaryOps.MUL, at_tap(share))
      total = piece if total is None else total.e(BinaryOps.ADD, piece)
    if total is None: return x.const_like(0)
    total = total.reshape(lead + tuple(q * s for q, s in zip(rows, self.stride)))
    return total.shrink(tuple((0, size) for size in lead + spatial))


class Conv(Function):
  """A convolution as one autograd node, so that its backward is made of convolutions too (as in PyTorch).

  Left to the movement ops' own rules, the input gradient would scatter-add overlapping windows back
  into place, a kernel whose index math (div/mod through stacked views) can't be vectorized. Here:
    input gradient  = the output gradient, spread by the stride, convolved with the flipped weight;
    weight gradient = the input's windows times the output gradient, summed over batch and positions.
  Both are window reductions like the forward. Where most of the input gradient's products would fall
  in the zero padding or between the strides, it is computed tap by tap instead (_input_gradient_by_taps).
  (No second derivatives: backward builds no graph.)
  """
  def forward(self, x: LazyBuffer, weight: LazyBuffer, geo: ConvGeometry) -> LazyBuffer:
    self.x_shape, self.weight, self.geo = x.shape, weight, geo
    out, self.x_padded = _conv_forward(x, weight, geo)
    return out

  def backward(self, grad: LazyBuffer) -> tuple[LazyBuffer | None, LazyBuffer | None]:
    tapwise = self.needs_input_grad[0] and _tapwise_pays(self.x_shape, self.weight, grad, self.geo)
    weight_reads_cl = self.needs_input_grad[1] and _weight_gradient_is_channels_last(self.weight, grad)
    # both gradients may read a channels-last copy of the output gradient: it is made once
    grad_cl = _channels_last(grad) if tapwise or weight_reads_cl else None
    grad_x = grad_w = None
    if self.needs_input_grad[0]:
      grad_x = _conv_input_gradient(grad, grad_cl if tapwise else None, self.weight, self.geo, self.x_shape)
    if self.needs_input_grad[1]:
      grad_w = _conv_weight_gradient(self.x_padded, grad, grad_cl if weight_reads_cl else None, self.weight.shape, self.geo)
    return grad_x, grad_w


class ConvTranspose(Function):
  """The transposed convolution of x (bs, cin, *in) by weight (cin, cout/groups, *k): the input gradient
  of the convolution `geo` from out_shape to x's shape, with x as its output gradient. Where that
  convolution would mostly multiply the zeros between the strides (stride 2: three in four products in
  2-D), it goes tap by tap (64 -> 32 channels, 28x28 -> 56x56, batch 32, forward and backward:
  103 -> 47-50 ms, PyTorch 36-44 ms). Its gradients are that convolution's forward (for x) and weight
  gradient (for the weight)."""
  def forward(self, x: LazyBuffer, weight: LazyBuffer, geo: ConvGeometry, out_shape: tuple[int, ...]) -> LazyBuffer:
    self.x, self.weight, self.geo = x, weight, geo
    tapwise = _tapwise_pays(out_shape, weight, x, geo)
    return _conv_input_gradient(x, _channels_last(x) if tapwise else None, weight, geo, out_shape)

  def backward(self, grad: LazyBuffer) -> tuple[LazyBuffer | None, LazyBuffer | None]:
    out, grad_padded = _conv_forward(grad, self.weight, self.geo)
    grad_x = grad_w = None
    if self.needs_input_grad[0]:
      # output positions past x's (an output_padding wider than the stride) reach no x
      grad_x = out.shrink(tuple((0, s) for s in self.x.shape))
    if self.needs_input_grad[1]:
      weight_reads_cl = _weight_gradient_is_channels_last(self.weight, self.x)
      x_cl = _channels_last(self.x) if weight_reads_cl else None
      grad_w = _conv_weight_gradient(grad_padded, self.x, x_cl, self.weight.shape, self.geo)
    return grad_x, grad_w


# ---- attention ----
# SIMD vectors of keys per step (block) of an attention kernel's loop. A decoding step (one query row) takes blocks of
# 4 vectors (64 float32 keys with AVX-512), or fewer for a short cache: its keys are padded to whole blocks so that a
# growing cache compiles a new kernel once per block, and a KV cache allocated in whole blocks is read as it is. Other
# kernels choose per length (_block_vectors), up to 6 vectors: a tile's scores stay in registers beside its sums.
ATTENTION_BLOCK_VECTORS = 4
MAX_BLOCK_VECTORS = 6


class Attention(Function):
  """softmax(q k^T * scale + mask) v on (batch, heads, length, dim) inputs, flash-style: each kernel
  (codegen/attention.py, its buffers in ops.AttentionArg) runs an online softmax over blocks of keys, so no
  score matrix is ever stored. Forward keeps the output and each query row's log-sum-exp; backward recomputes
  the scores blockwise from them, in a dq kernel (over query rows) and a dkv kernel (over key rows). Only a float
  mask that needs a gradient gets a score-sized buffer: the gradient of the mask is one."""
  def forward(self, q: LazyBuffer, k: LazyBuffer, v: LazyBuffer, mask: LazyBuffer | None = None, *, scale: float,
              causal: bool, window: int) -> LazyBuffer:
    batch, heads, length, dim = q.shape
    kv_heads, source, vdim = k.shape[1], k.shape[2], v.shape[3]
    lanes, block = _lanes_and_block(length, source, q.dtype, bool(causal or window))
    self.arg = AttentionArg("forward", batch, heads, kv_heads, length, source, dim, vdim, scale, causal, window,
                            "" if mask is None else "bool" if mask.dtype == dtypes.bool else "add", (0, 0, 0, 0), lanes,
                            block)
    self.q, self.k, self.v, self.mask = q, k, v, mask
    self.kT = _padded_to(k.permute((0, 1, 3, 2)), block)
    masks, strides = _mask_lanes(mask, block, transposed=False)
    rows = batch * heads * length
    self.out = q.attention((self.kT, _padded_to(v, block, axis=2)) + masks, _arg(self.arg, "forward", strides),
                           rows * (vdim + 1))
    return self.out.shrink(((0, rows * vdim),)).reshape((batch, heads, length, vdim))

  @staticmethod
  def one_node(q: LazyBuffer, k: LazyBuffer, v: LazyBuffer, *mask: LazyBuffer, scale: float, causal: bool,
               window: int) -> LazyBuffer:
    # the node is the kernel's whole output (the rows, then their log-sum-exps); forward's view of it outside the node
    batch, heads, length, _ = q.shape
    padded = 0
    if length == 1 and not (mask or causal or window):
      # a decoding step: its graph pads the keys to whole blocks, and this mask hides the padding (_attention_graph)
      mask = (_padding_mask(k.shape[2], q.dtype, q.device),)
      padded = mask[0].shape[3]
    rows, vdim = batch * heads * length, v.shape[3]
    node = LazyBuffer.subgraph((q, k, v) + mask, _attention_graph, (scale, causal, window, padded), (rows * (vdim + 1),),
                               q.dtype)
    return node.shrink(((0, rows * vdim),)).reshape((batch, heads, length, vdim))

  def backward(self, grad: LazyBuffer) -> tuple[LazyBuffer | None, ...]:
    a, q, k, v = self.arg, self.q, self.k, self.v
    rows, block = a.batch * a.heads * a.length, a.block
    out = self.out.shrink(((0, rows * a.vdim),)).reshape(grad.shape)
    lse2 = _padded_to(self.out.shrink(((rows * a.vdim, rows * (a.vdim + 1)),)).reshape(grad.shape[:3]), block)
    delta = _padded_to(grad.e(BinaryOps.MUL, out).r(ReduceOps.SUM, (3,)).reshape(grad.shape[:3]), block)
    needs = self.needs_input_grad + [False] * (4 - len(self.needs_input_grad))
    dq = dk = dv = dmask = None
    query_side = (self.kT, _padded_to(k, block, axis=2), _padded_to(v.permute((0, 1, 3, 2)), block), grad, lse2, delta)
    masks, strides = _mask_lanes(self.mask, block, transposed=False)
    if needs[0]:
      dq = q.attention(query_side + masks, _arg(a, "dq", strides), q.size).reshape(q.shape)
    if needs[1] or needs[2]:
      masks_t, strides_t = _mask_lanes(self.mask, block, transposed=True)
      key_side = (v, _padded_to(q.permute((0, 1, 3, 2)), block), _padded_to(q, block, axis=2),
                  _padded_to(grad.permute((0, 1, 3, 2)), block), _padded_to(grad, block, axis=2), lse2, delta)
      both = k.attention(key_side + masks_t, _arg(a, "dkv", strides_t), k.size + v.size)
      dk = both.shrink(((0, k.size),)).reshape(k.shape) if needs[1] else None
      dv = both.shrink(((k.size, k.size + v.size),)).reshape(v.shape) if needs[2] else None
    if self.mask is not None and a.mask == "add" and needs[3]:
      padded = -(-a.source // block) * block
      scores = q.attention(query_side + masks, _arg(a, "dmask", strides), rows * padded)
      scores = scores.reshape((a.batch, a.heads, a.length, padded))
      scores = scores.shrink(((0, a.batch), (0, a.heads), (0, a.length), (0, a.source)))
      broadcast = tuple(i for i, n in enumerate(self.mask.shape) if n == 1 and scores.shape[i] != 1)
      dmask = scores.r(ReduceOps.SUM, broadcast) if broadcast else scores
    return (dq, dk, dv, dmask)[:len(self.needs_input_grad)]


def _attention_graph(srcs: tuple[LazyBuffer, ...], scale: float, causal: bool, window: int, padded: int) -> LazyBuffer:
  q, k, v, *mask = srcs
  if padded:
    # a decoding step's keys and values padded with zeros to whole blocks of the kernel's lane axis; the mask (0, then
    # -inf over the padding) hides the padding. The kernel then depends on the padded length alone: a KV cache that
    # grows by one key per token compiles a new attention kernel once per block of keys (32 float32 keys with AVX2),
    # not at every token. A hidden key's score is -inf either way, so the results are the same. The padded keys get a
    # buffer of their own: the kernel reads them transposed, and a transposing copy from the padded buffer depends on
    # the padded length alone (compiled once per block), where one from the cache itself would be a new kernel at
    # every token; the padding copies themselves are the generic copy (engine/realize.py), which compiles nothing
    rows = ((0, 0), (0, 0), (0, padded - k.shape[2]), (0, 0))
    k, v = k.pad(rows).contiguous(), v.pad(rows)
  ctx = object.__new__(Attention)
  ctx.forward(q, k, v, *mask, scale=scale, causal=causal, window=window)
  return ctx.out


def _arg(arg: AttentionArg, mode: str, mask_strides: tuple[int, int, int, int]) -> AttentionArg:
  return replace(arg, mode=mode, mask_strides=mask_strides)


def _lanes_and_block(length: int, source: int, dtype, skips_blocks: bool = False) -> tuple[int, int]:
  """An attention kernel's SIMD width and its lane axis's step (ops.AttentionArg's lanes and block). skips_blocks:
  causal or windowed, where a tile of rows skips the blocks none of its rows sees."""
  lanes = 1 if getenv("NOOPT", 0) else max(1, simd_bytes() // dtype.itemsize)
  vectors = -(-max(length, source) // lanes)
  if length == 1: return lanes, lanes * min(ATTENTION_BLOCK_VECTORS, vectors)
  return lanes, lanes * _block_vectors(vectors, skips_blocks)


def _block_vectors(vectors: int, skips_blocks: bool) -> int:
  """How many vectors of keys a block holds, for a lane axis of `vectors` vectors. First the fewest padded vectors:
  a padded key costs what a real one does (65 keys in blocks of 4 x 16 lanes took twice the time of one block of 5).
  Then the least bookkeeping: each block's maximum and rescaling cost about a quarter of a vector's work, and a tile
  that skips blocks wastes about half a block on its diagonal (measured: bench/README.md, "Eighth pass")."""
  def cost(per_block: int) -> tuple[int, float]:
    blocks = -(-vectors // per_block)
    return blocks * per_block, blocks / 4 + (per_block / 2 if skips_blocks else 0)
  return min(range(1, MAX_BLOCK_VECTORS + 1), key=cost)


# _padding_mask's masks, computed (nothing writes them) and shared: every layer of every decoding step reads one
_padding_masks: dict[tuple, LazyBuffer] = {}
MAX_PADDING_MASKS = 256


def _padding_mask(source: int, dtype, device: str) -> LazyBuffer:
  """(1, 1, 1, padded): `source` keys padded to whole blocks of an attention kernel's lane axis, 0 over the first
  `source` lanes, -inf after. A whole number of blocks gets one too, all zeros, so that it runs the same kernel as the
  lengths just below it. Keyed by the block too, which NOOPT changes: a mask made under the other setting would give
  the same results but a padded length of its own, so kernels that a step would otherwise share."""
  block = _lanes_and_block(1, source, dtype)[1]
  key = (source, dtype, device, block)
  mask = _padding_masks.get(key)
  if mask is None:
    if len(_padding_masks) >= MAX_PADDING_MASKS: _padding_masks.clear()
    padded = -(-source // block) * block
    hide = np.zeros((1, 1, 1, padded), dtype=dtype.np)
    hide[..., source:] = -np.inf
    mask = _padding_masks[key] = LazyBuffer.from_numpy(hide, device)
  return mask


def _padded_to(x: LazyBuffer, block: int, axis: int = -1) -> LazyBuffer:
  """x with `axis` padded with zeros to a multiple of `block` (an attention kernel's lane axis)."""
  axis = axis % len(x.shape)
  extra = -x.shape[axis] % block
  return x.pad(tuple((0, extra if i == axis else 0) for i in range(len(x.shape)))) if extra else x


def _mask_lanes(mask: LazyBuffer | None, block: int,
                transposed: bool) -> tuple[tuple[LazyBuffer, ...], tuple[int, int, int, int]]:
  """The mask as an attention kernel reads it: (batch, head, row, lane) with the lane axis (keys, or queries when
  `transposed`) last and padded, and its strides in elements (0 along a broadcast axis)."""
  if mask is None: return (), (0, 0, 0, 0)
  if transposed: mask = mask.permute((0, 1, 3, 2))
  if mask.shape[3] > 1: mask = _padded_to(mask, block)
  shape, strides, step = mask.shape, [0, 0, 0, 0], 1
  for i in reversed(range(4)):
    if shape[i] > 1: strides[i] = step
    step *= shape[i]
  return (mask,), tuple(strides)
