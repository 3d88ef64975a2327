"""Views: how a tensor's elements sit in a flat buffer. Movement ops only change views, never data.

in: a shape and a movement op (reshape, permute, expand, pad, shrink, flip)
out: a new View (shape, strides, offset, validity mask) or, when one view can't express the access,
     a ShapeTracker holding a stack of views, where each view indexes the contiguous layout of the one below.
`ShapeTracker.expr_idxs` turns an index per dimension into (buffer index, valid); it works on plain
ints, numpy index arrays (the numpy device) and symbolic nodes (the code generators) alike.
`read_view(flat, st, dtype)` reads the elements a tracker selects from a flat numpy buffer (for
Tensor.numpy and the numpy device).
"""
from __future__ import annotations
from dataclasses import dataclass
import functools
from typing import Any, Callable
import numpy as np
from tinychad.dtype import DType
from tinychad.helpers import prod

Shape = tuple[int, ...]


def strides_for_shape(shape: Shape) -> tuple[int, ...]:
  """C-contiguous strides, with 0 for size-1 axes (so equal views compare equal)."""
  strides, acc = [], 1
  for size in reversed(shape):
    strides.append(acc if size != 1 else 0)
    acc *= size
  return tuple(reversed(strides))


@dataclass(frozen=True)
class View:
  # hashed often (kernel trees are dict keys): compute it once
  def __hash__(self) -> int:
    cached = self.__dict__.get("_hash")
    if cached is None:
      cached = hash((self.shape, self.strides, self.offset, self.mask))
      object.__setattr__(self, "_hash", cached)
    return cached

  # every recorded op compares its new view with the old one: the same object is the common answer
  def __eq__(self, other) -> bool:
    if self is other: return True
    return isinstance(other, View) and (self.shape, self.strides, self.offset, self.mask) == (other.shape, other.strides, other.offset, other.mask)

  shape: Shape
  strides: tuple[int, ...]
  offset: int
  mask: tuple[tuple[int, int], ...] | None

  @staticmethod
  def create(shape: Shape, strides: tuple[int, ...] | None = None, offset: int = 0,
             mask: tuple[tuple[int, int], ...] | None = None) -> View:
    shape = tuple(shape)
    strides = strides_for_shape(shape) if strides is None else tuple(st if s != 1 else 0 for s, st in zip(shape, strides))
    if mask is not None:
      mask = tuple((max(0, lo), min(s, hi)) for (lo, hi), s in zip(mask, shape))
      if any(lo >= hi for lo, hi in mask):
        # nothing is valid: a view of zeros, reading nothing
        return View(shape, (0,) * len(shape), 0, ((0, 0),) * len(shape))
      if all(m == (0, s) for m, s in zip(mask, shape)): mask = None
    return View(shape, strides, offset, mask)

  @property
  def contiguous(self) -> bool:
    # cached by hand: functools.cached_property takes a lock on each first read (before Python 3.12),
    # and every new view of every recorded op is asked this once
    cached = self.__dict__.get("_contiguous")
    if cached is None:
      cached = self.offset == 0 and self.mask is None and self.strides == strides_for_shape(self.shape)
      object.__setattr__(self, "_contiguous", cached)
    return cached

  # ---- movement ops: each returns a new View ----
  def permute(self, order: tuple[int, ...]) -> View:
    mask = tuple(self.mask[i] for i in order) if self.mask else None
    return View.create(tuple(self.shape[i] for i in order), tuple(self.strides[i] for i in order), self.offset, mask)

  def expand(self, new_shape: Shape) -> View:
    if 0 in self.shape: return View.create(new_shape)
    strides = tuple(st if s == ns else 0 for s, ns, st in zip(self.shape, new_shape, self.strides))
    mask = None
    if self.mask:
      mask = tuple(m if s == ns else ((0, ns) if m != (0, 0) else (0, 0)) for m, s, ns in zip(self.mask, self.shape, new_shape))
    return View.create(new_shape, strides, self.offset, mask)

  def shrink(self, arg: tuple[tuple[int, int], ...]) -> View:
    offset = self.offset + sum(start * st for (start, _), st in zip(arg, self.strides))
    mask = None
    if self.mask:
      mask = tuple((max(lo, start) - start, min(hi, end) - start) for (lo, hi), (start, end) in zip(self.mask, arg))
    return View.create(tuple(end - start for start, end in arg), self.strides, offset, mask)

  def pad(self, arg: tuple[tuple[int, int], ...]) -> View:
    if all(b == 0 and a == 0 for b, a in arg): return self
    # padding is a shrink that starts before 0 and ends after the end; the new area is masked out
    old_mask = self.mask or tuple((0, s) for s in self.shape)
    mask = tuple((lo + b, hi + b) for (lo, hi), (b, _) in zip(old_mask, arg))
    shape = tuple(s + b + a for s, (b, a) in zip(self.shape, arg))
    offset = self.offset - sum(b * st for (b, _), st in zip(arg, self.strides))
    return View.create(shape, self.strides, offset, mask)

  def flip(self, axes: tuple[bool, ...]) -> View:
    offset = self.offset + sum((s - 1) * st for s, st, f in zip(self.shape, self.strides, axes) if f and s > 0)
    strides = tuple(-st if f else st for st, f in zip(self.strides, axes))
    mask = None
    if self.mask:
      mask = tuple((s - hi, s - lo) if f else (lo, hi) for (lo, hi), s, f in zip(self.mask, self.shape, axes))
    return View.create(self.shape, strides, offset, mask)

  def reshape(self, new_shape: Shape) -> View | None:
    """The same elements in a new shape as one view, or None when that needs a second view."""
    if new_shape == self.shape: return self
    if 0 in self.shape or 0 in new_shape: return View.create(new_shape)
    if self.contiguous: return View.create(new_shape)
    if self.mask is not None: return self._reshape_masked(new_shape)
    strides = _nocopy_strides(self.shape, self.strides, new_shape)
    return None if strides is None else View.create(new_shape, strides, self.offset)

  def _reshape_masked(self, new_shape: Shape) -> View | None:
    """A masked view in a new shape: size-1 axes inserted or removed, and an axis split where its mask's bounds
    fall on the split (a cat's piece of 64 along an axis of 192, read as (3, 4, 16): axis 0 masked, the others
    whole); axes merged only where the mask covers them whole. None where the mask needs a second view."""
    old = [(s, st, m) for s, st, m in zip(self.shape, self.strides, self.mask) if s != 1 or m != (0, 1)]
    if any(s == 1 for s, _, _ in old): return None
    new = [s for s in new_shape if s != 1]
    strides = _nocopy_strides(tuple(s for s, _, _ in old), tuple(st for _, st, _ in old), tuple(new))
    if strides is None: return None
    masks: list[tuple[int, int]] = []
    oi = ni = 0
    while oi < len(old):
      # the next group: old axes oi..oj-1 hold the same elements as new axes ni..nj-1
      oj, nj, old_size, new_size = oi + 1, ni + 1, old[oi][0], new[ni]
      while old_size != new_size:
        if old_size < new_size: old_size *= old[oj][0]; oj += 1
        else: new_size *= new[nj]; nj += 1
      group = [m for _, _, m in old[oi:oj]]
      if oj - oi == 1 and group[0] != (0, old_size):
        inner = prod(new[ni + 1:nj])
        lo, hi = group[0]
        if lo % inner or hi % inner: return None
        masks += [(lo // inner, hi // inner)] + [(0, s) for s in new[ni + 1:nj]]
      elif all(m == (0, s) for m, (s, _, _) in zip(group, old[oi:oj])): masks += [(0, s) for s in new[ni:nj]]
      else: return None
      oi, ni = oj, nj
    it = iter(zip(strides, masks))
    out_strides, out_mask = [], []
    for s in new_shape:
      st, m = (0, (0, 1)) if s == 1 else next(it)
      out_strides.append(st); out_mask.append(m)
    return View.create(new_shape, tuple(out_strides), self.offset, tuple(out_mask))

  # ---- indexing ----
  def expr(self, idxs: list):
    """Buffer index and validity for one index per axis (valid is None when always valid)."""
    index = self.offset
    for i, s, st in zip(idxs, self.shape, self.strides):
      if st != 0 and s != 1: index = i * st + index
    valid = None
    if self.mask is not None:
      for i, (lo, hi), s in zip(idxs, self.mask, self.shape):
        if lo == 0 and hi == s: continue
        if lo == hi: return index, False
        conds = ([i >= lo] if lo > 0 else []) + ([i < hi] if hi < s else [])
        for c in conds: valid = c if valid is None else valid & c
    return index, valid


def _nocopy_strides(old_shape: Shape, old_strides: tuple[int, ...], new_shape: Shape) -> tuple[int, ...] | None:
  """Strides that give `new_shape` over the same memory, merging and splitting axes (numpy's rule)."""
  old = [(s, st) for s, st in zip(old_shape, old_strides) if s != 1]
  new = list(new_shape)
  new_strides = [0] * len(new)
  oi, oj, ni, nj = 0, 1, 0, 1
  while ni < len(new) and oi < len(old):
    np_, op = new[ni], old[oi][0]
    while np_ != op:
      if np_ < op: np_ *= new[nj]; nj += 1
      else: op *= old[oj][0]; oj += 1
    for k in range(oi, oj - 1):
      if old[k][1] != old[k + 1][0] * old[k + 1][1]: return None
    new_strides[nj - 1] = old[oj - 1][1]
    for k in range(nj - 1, ni, -1): new_strides[k - 1] = new_strides[k] * new[k]
    ni, nj, oi, oj = nj, nj + 1, oj, oj + 1
  return tuple(new_strides)


def _pairs(arg) -> tuple[tuple[int, int], ...]: return tuple((lo, hi) for lo, hi in arg)


def _remembered(normalize: Callable[[Any], tuple]) -> Callable:
  """Decorate a ShapeTracker method `f(self, arg)` with a bounded cache of its results, keyed by
  (self, normalize(arg))."""
  def decorate(method: Callable) -> Callable:
    cached = functools.lru_cache(maxsize=8192)(method)
    @functools.wraps(method)
    def remembered(self, arg): return cached(self, normalize(arg))
    return remembered
  return decorate


@dataclass(frozen=True)
class ShapeTracker:
  views: tuple[View, ...]

  def __eq__(self, other) -> bool: return self is other or (isinstance(other, ShapeTracker) and self.views == other.views)

  # every tracker is hashed (the movement caches and the schedule cache key on it): once, when it is made
  def __hash__(self) -> int: return self._hash

  @staticmethod
  def from_shape(shape: Shape) -> ShapeTracker:
    return _contiguous_tracker(tuple(shape))

  def __post_init__(self):
    # every LazyBuffer made reads its tracker's shape and size, and every recorded op asks whether its inputs are
    # contiguous: plain attributes, worked out once per tracker (trackers are shared: from_shape and the movements
    # cache them)
    shape = self.views[-1].shape
    object.__setattr__(self, "shape", shape)
    object.__setattr__(self, "size", prod(shape))
    object.__setattr__(self, "contiguous", len(self.views) == 1 and self.views[0].contiguous)
    object.__setattr__(self, "_hash", hash(self.views))

  @property
  def has_mask(self) -> bool: return any(v.mask is not None for v in self.views)

  @property
  def permuted_order(self) -> tuple[int, ...] | None:
    """The axis order in which this tracker walks a contiguous buffer (outermost first), when that
    order isn't the natural one: x.permute(order) is then contiguous. None for anything else (a mask,
    an offset, broadcasting, several views, or already contiguous)."""
    if len(self.views) != 1 or self.contiguous: return None
    view = self.views[0]
    if view.mask is not None or view.offset != 0: return None
    if any(stride == 0 and size != 1 for stride, size in zip(view.strides, view.shape)): return None
    # size-1 axes (stride 0) go last; any position would do
    order = tuple(sorted(range(len(view.shape)), key=lambda axis: -view.strides[axis]))
    return order if view.permute(order).contiguous else None

  def _replace_top(self, view: View) -> ShapeTracker:
    # a moved top view may now merge into the one below (e.g. a reshape that undoes the lower split)
    if len(self.views) == 1: return ShapeTracker((view,))
    return ShapeTracker(self.views[:-1] + (view,)).simplify()

  # A movement is a pure function of the tracker and its argument, and a model records the same
  # movements of the same views on every step: each op remembers its answers (bounded), the argument
  # made a hashable tuple first.
  @_remembered(tuple)
  def permute(self, order: tuple[int, ...]) -> ShapeTracker: return self._replace_top(self.views[-1].permute(order))
  @_remembered(tuple)
  def expand(self, shape: Shape) -> ShapeTracker: return self._replace_top(self.views[-1].expand(shape))
  @_remembered(_pairs)
  def shrink(self, arg) -> ShapeTracker: return self._replace_top(self.views[-1].shrink(arg))
  @_remembered(_pairs)
  def pad(self, arg) -> ShapeTracker: return self._replace_top(self.views[-1].pad(arg))
  @_remembered(tuple)
  def flip(self, axes: tuple[bool, ...]) -> ShapeTracker: return self._replace_top(self.views[-1].flip(axes))

  @_remembered(tuple)
  def reshape(self, new_shape: Shape) -> ShapeTracker:
    view = self.views[-1].reshape(new_shape)
    if view is not None: return self._replace_top(view)
    return ShapeTracker(self.views + (View.create(new_shape),)).simplify()

  @functools.lru_cache(maxsize=8192)   # pure, and a model composes the same views every step
  def __add__(self, other: ShapeTracker) -> ShapeTracker:
    """Compose: `other` describes an access into a contiguous tensor of shape self.shape."""
    st = self
    for view in other.views:
      st = ShapeTracker(st.views + (view,)).simplify()
    return st

  def simplify(self) -> ShapeTracker:
    views = list(self.views)
    while len(views) >= 2:
      below, top = views[-2], views[-1]
      if below.contiguous:
        views.pop(-2)                         # an identity map on flat indices
      elif (merged := merge_views(below, top)) is not None:
        views[-2:] = [merged]
      else: break
    return ShapeTracker(tuple(views))

  def expr_idxs(self, idxs: list):
    """(buffer index, valid) for one index per axis of self.shape; valid is None when always valid."""
    index, valid = self.views[-1].expr(idxs)
    for view in reversed(self.views[:-1]):
      sub, acc = [], 1
      for pos, size in enumerate(reversed(view.shape)):
        if size == 1: sub.append(0)
        else:
          part = index if acc == 1 else index // acc
          # the outermost axis needs no modulo: the flat index never exceeds the buffer
          sub.append(part if pos == len(view.shape) - 1 else part % size)
        acc *= size
      index, more_valid = view.expr(list(reversed(sub)))
      if more_valid is False or valid is False: return index, False
      if more_valid is not None: valid = more_valid if valid is None else valid & more_valid
    return index, valid


def _ceil_div(a: int, b: int) -> int: return -(-a // b)


def _digits(flat: int, shape: Shape) -> list[int] | None:
  """`flat` as one digit per axis of `shape` (mixed radix, sign carried by every digit), or None if too big."""
  sign, rest, digits = (-1 if flat < 0 else 1), abs(flat), []
  for size in reversed(shape):
    digits.append(sign * (rest % size))
    rest //= size
  return None if rest else digits[::-1]


@functools.lru_cache(maxsize=8192)
def merge_views(below: View, top: View) -> View | None:
  """One view that reads what `top` reads from the contiguous layout of `below`, or None.

  Each axis of `top` moves the flat index by its stride; written as digits of below's shape, that is a
  step in below's multi-index. If, over every valid index of `top`, those steps keep each digit inside
  its axis (no carries), below's multi-index is affine in top's index, so the strides compose. below's
  mask then becomes a range on the one top axis that moves each masked axis (two movers: no merge).
  """
  if 0 in top.shape: return View.create(top.shape)
  if 0 in below.shape: return None
  box = top.mask or tuple((0, s) for s in top.shape)
  if any(lo >= hi for lo, hi in box): return View.create(top.shape, mask=box)
  corner = top.offset + sum(lo * st for (lo, _), st in zip(box, top.strides))
  origin = _digits(corner, below.shape)
  if corner < 0 or origin is None: return None
  steps = []
  for (lo, hi), st in zip(box, top.strides):
    step = _digits(st, below.shape) if hi - lo > 1 else [0] * len(below.shape)
    if step is None: return None
    steps.append(step)
  for j, size in enumerate(below.shape):
    low = origin[j] + sum(min(0, (hi - lo - 1) * step[j]) for (lo, hi), step in zip(box, steps))
    high = origin[j] + sum(max(0, (hi - lo - 1) * step[j]) for (lo, hi), step in zip(box, steps))
    if low < 0 or high >= size: return None
  strides = [sum(d * bst for d, bst in zip(step, below.strides)) for step in steps]
  offset = below.offset + sum(o * bst for o, bst in zip(origin, below.strides)) - sum(lo * st for (lo, _), st in zip(box, strides))
  mask = [list(m) for m in box]
  for j, (blo, bhi) in enumerate(below.mask or ()):
    if (blo, bhi) == (0, below.shape[j]): continue
    movers = [k for k, step in enumerate(steps) if step[j] != 0]
    if not movers:
      if not blo <= origin[j] < bhi: return View.create(top.shape, mask=((0, 0),) * len(top.shape))
      continue
    if len(movers) > 1: return None
    k, d, base = movers[0], steps[movers[0]][j], box[movers[0]][0]
    # digit j is origin[j] + (i - base) * d; keep the i where it lies in [blo, bhi)
    if d > 0: first, end = _ceil_div(blo - origin[j], d), _ceil_div(bhi - origin[j], d)
    else: first, end = (origin[j] - bhi) // -d + 1, (origin[j] - blo) // -d + 1
    mask[k] = [max(mask[k][0], base + first), min(mask[k][1], base + end)]
  return View.create(top.shape, tuple(strides), offset, tuple(tuple(m) for m in mask))


@functools.lru_cache(maxsize=4096)
def _contiguous_tracker(shape: Shape) -> ShapeTracker:
  # trackers are immutable, so every contiguous tensor of one shape can share one (and its hash)
  return ShapeTracker((View.create(shape),))


def _strided(flat: np.ndarray, view: View) -> np.ndarray:
  itemsize = flat.itemsize
  return np.lib.stride_tricks.as_strided(flat[view.offset:], view.shape, tuple(st * itemsize for st in view.strides), writeable=False)


def read_view(flat: np.ndarray, st: ShapeTracker, dtype: DType) -> np.ndarray:
  """The elements `st` selects from the flat buffer, as an array of st.shape (a read-only view when one
  view without a mask suffices; masked elements read zero)."""
  shape = st.shape
  if 0 in shape: return np.zeros(shape, dtype=dtype.np)
  if len(st.views) == 1:
    view = st.views[0]
    if view.contiguous:
      # the common read (Tensor.numpy() of a computed tensor, an index checked on the host): a reshape is ~4x
      # cheaper than as_strided
      out = flat[:prod(shape)].reshape(shape)
      out.flags.writeable = False
      return out
    if view.mask is None: return _strided(flat, view)
    out = np.zeros(shape, dtype=dtype.np)
    if any(lo >= hi for lo, hi in view.mask): return out
    out[tuple(slice(lo, hi) for lo, hi in view.mask)] = _strided(flat, view.shrink(view.mask))
    return out
  grids = [np.arange(s).reshape([-1 if i == d else 1 for i in range(len(shape))]) for d, s in enumerate(shape)]
  index, valid = st.expr_idxs(grids)
  index = np.broadcast_to(np.asarray(index), shape)
  if valid is False: return np.zeros(shape, dtype=dtype.np)
  if valid is None: return flat[index]
  valid = np.broadcast_to(valid, shape)
  return np.where(valid, flat[np.where(valid, index, 0)], np.zeros((), dtype=dtype.np))
