"""Autograd on the primitives: each Function has its forward and its backward side by side.

in: LazyBuffers (from Tensor.lazydata)  ->  out: a LazyBuffer, and in backward the gradients of the inputs.
The Tensor front end (tensor.py) composes every other op from these, so these are all the backward
rules the framework has.
"""
from __future__ import annotations
import math
from dataclasses import dataclass
import tinychad.tensor as tensor_module   # tensor.py imports this module: Tensor is looked up at call time
from tinychad.dtype import dtypes
from tinychad.helpers import inverse_permutation
from tinychad.lazy import LazyBuffer
from tinychad.ops import UnaryOps, BinaryOps, TernaryOps, ReduceOps


class Function:
  def __init__(self, *tensors):
    self.needs_input_grad = needs = [t.requires_grad for t in tensors]
    self.requires_grad = True if True in needs else None if None in needs else False
    if self.requires_grad: self.parents = tensors

  def backward(self, *args, **kwargs): raise RuntimeError(f"{type(self).__name__} has no gradient")

  @classmethod
  def apply(cls, *tensors, **kwargs):
    no_grad = tensor_module.Tensor.no_grad
    ctx = cls(*tensors)
    result = ctx.forward(*[t.lazydata for t in tensors], **kwargs)
    out = tensor_module.Tensor.from_lazy(result, False if no_grad else ctx.requires_grad)
    if ctx.requires_grad and not no_grad: out._ctx = ctx
    return out


def _bool_to(x: LazyBuffer, like: LazyBuffer) -> LazyBuffer: return x.cast(like.dtype)


# ---- load-like ----
class Contiguous(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer: return x.contiguous()
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
class Sum(Function):
  def forward(self, x: LazyBuffer, axis: tuple[int, ...]) -> LazyBuffer:
    self.input_shape = x.shape
    return x.r(ReduceOps.SUM, axis)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.expand(self.input_shape)


class Max(Function):
  """Ties share the gradient evenly, as PyTorch's amax does."""
  def forward(self, x: LazyBuffer, axis: tuple[int, ...]) -> LazyBuffer:
    self.x, self.axis = x, axis
    self.ret = x.r(ReduceOps.MAX, axis)
    return self.ret
  def backward(self, grad: LazyBuffer) -> LazyBuffer:
    is_max = _bool_to(self.x.e(BinaryOps.CMPEQ, self.ret.expand(self.x.shape)), grad)
    count = is_max.r(ReduceOps.SUM, self.axis).expand(self.x.shape)
    return is_max.e(BinaryOps.DIV, count).e(BinaryOps.MUL, grad.expand(self.x.shape))


# ---- matrix product ----
class Matmul(Function):
  """x (..., n, k) @ w (..., k, m), equal batch axes (the caller broadcasts them):
  out[..., i, j] = sum over r of x[..., i, r] * w[..., r, j].
  Both are seen as (..., n, m, k) through broadcast views (no copies), multiplied, and summed over the
  last axis, so the reduce runs along k and SIMD lanes along m (codegen/opt.py's register tile). One
  Function rather than the eight movement and arithmetic ops it records: a matmul is recorded often
  enough that their Python (~20 us a call) is worth saving. Integers are summed as int64 and cast back to
  their own dtype, which wraps as PyTorch's integer matmul does (sums modulo 2^bits agree either way)."""
  def forward(self, x: LazyBuffer, w: LazyBuffer) -> LazyBuffer:
    *batch, n, k = x.shape
    m, self.lead = w.shape[-1], tuple(batch)
    self.full = self.lead + (n, m, k)
    self.rows = x.reshape(self.lead + (n, 1, k)).expand(self.full)
    self.columns = _swap_last(w).reshape(self.lead + (1, m, k)).expand(self.full)
    product = self.rows.e(BinaryOps.MUL, self.columns)
    if product.dtype.is_float: return product.r(ReduceOps.SUM, (len(self.full) - 1,)).reshape(self.lead + (n, m))
    total = product.cast(dtypes.int64).r(ReduceOps.SUM, (len(self.full) - 1,))
    return total.cast(x.dtype).reshape(self.lead + (n, m))

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
      grad_w = _swap_last(self.rows.e(BinaryOps.MUL, spread).r(ReduceOps.SUM, (n_axis,)).reshape(self.lead + (m, k)))
    return grad_x, grad_w


def _swap_last(x: LazyBuffer) -> LazyBuffer:
  order = tuple(range(len(x.shape) - 2)) + (len(x.shape) - 1, len(x.shape) - 2)
  return x.permute(order)


# ---- movement ----
class Reshape(Function):
  def forward(self, x: LazyBuffer, shape: tuple[int, ...]) -> LazyBuffer:
    self.input_shape = x.shape
    return x.reshape(shape)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.reshape(self.input_shape)


class Permute(Function):
  def forward(self, x: LazyBuffer, order: tuple[int, ...]) -> LazyBuffer:
    self.order = order
    return x.permute(order)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.permute(inverse_permutation(self.order))


class Expand(Function):
  def forward(self, x: LazyBuffer, shape: tuple[int, ...]) -> LazyBuffer:
    self.input_shape = x.shape
    return x.expand(shape)
  def backward(self, grad: LazyBuffer) -> LazyBuffer:
    axes = tuple(i for i, (a, b) in enumerate(zip(self.input_shape, grad.shape)) if a != b)
    return grad.r(ReduceOps.SUM, axes) if axes else grad


class Pad(Function):
  def forward(self, x: LazyBuffer, arg: tuple[tuple[int, int], ...]) -> LazyBuffer:
    self.window = tuple((b, b + s) for s, (b, _) in zip(x.shape, arg))
    return x.pad(arg)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.shrink(self.window)


class Shrink(Function):
  def forward(self, x: LazyBuffer, arg: tuple[tuple[int, int], ...]) -> LazyBuffer:
    self.padding = tuple((start, s - end) for s, (start, end) in zip(x.shape, arg))
    return x.shrink(arg)
  def backward(self, grad: LazyBuffer) -> SliceGradient: return SliceGradient(grad, self.padding)


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
  first = slices[0]
  size = first.shape[axis]
  Tensor = tensor_module.Tensor
  pieces, end = [], 0
  for part in sorted(slices, key=lambda part: part.padding[axis][0]):
    start = part.padding[axis][0]
    if start < end: return None       # overlapping slices add up: left to the sum
    if start > end: pieces.append(Tensor.zeros(_with(first.grad.shape, axis, start - end), dtype=first.grad.dtype, device=first.grad.device))
    pieces.append(Tensor(part.grad, requires_grad=False))
    end = start + part.grad.shape[axis]
  if end < size: pieces.append(Tensor.zeros(_with(first.grad.shape, axis, size - end), dtype=first.grad.dtype, device=first.grad.device))
  return Tensor.cat(*pieces, dim=axis).lazydata


def _with(shape: tuple[int, ...], axis: int, size: int) -> tuple[int, ...]: return shape[:axis] + (size,) + shape[axis + 1:]


class Flip(Function):
  def forward(self, x: LazyBuffer, axes: tuple[bool, ...]) -> LazyBuffer:
    self.axes = axes
    return x.flip(axes)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.flip(self.axes)

