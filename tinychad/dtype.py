"""Data types and PyTorch's type-promotion rules.

in: Python values, numpy dtypes, DType objects  ->  out: a DType, or the promoted DType of an op.
"""
from __future__ import annotations
from dataclasses import dataclass
import numpy as np


# eq=False: each dtype is one object (the `dtypes` attributes below; copies and pickles come back as that object),
# so identity is equality, and every op compares dtypes and every interning and cache key hashes them: object's
# own C-level == and hash instead of comparing six fields (or a Python-level __eq__ call per comparison)
@dataclass(frozen=True, eq=False)
class DType:
  name: str
  itemsize: int
  np: type          # the numpy scalar type that stores it
  c_name: str       # the C type the renderers use
  category: int     # 0 bool, 1 integer, 2 floating: the order of promotion between kinds
  rank: int         # order within a category

  def __repr__(self) -> str: return f"dtypes.{self.name}"

  def __reduce__(self): return (getattr, (dtypes, self.name))

  @property
  def is_float(self) -> bool: return self.category == 2

  @property
  def is_int(self) -> bool: return self.category == 1

  @property
  def is_unsigned(self) -> bool: return self.name.startswith("uint") or self.name == "bool"


class dtypes:
  bool = DType("bool", 1, np.bool_, "_Bool", 0, 0)
  uint8 = DType("uint8", 1, np.uint8, "unsigned char", 1, 0)
  int8 = DType("int8", 1, np.int8, "signed char", 1, 1)
  int16 = DType("int16", 2, np.int16, "short", 1, 2)
  int32 = DType("int32", 4, np.int32, "int", 1, 3)
  int64 = DType("int64", 8, np.int64, "long long", 1, 4)
  float16 = DType("float16", 2, np.float16, "_Float16", 2, 0)
  float32 = DType("float32", 4, np.float32, "float", 2, 1)
  float64 = DType("float64", 8, np.float64, "double", 2, 2)
  # aliases people type
  half, float, double, int, long = float16, float32, float64, int32, int64
  default_float = float32
  default_int = int64

  @staticmethod
  def all() -> list[DType]:
    return [dtypes.bool, dtypes.uint8, dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64,
            dtypes.float16, dtypes.float32, dtypes.float64]

  @staticmethod
  def from_np(npdtype) -> DType:
    npdtype = np.dtype(npdtype)
    found = _FROM_NUMPY.get(npdtype)
    if found is not None: return found
    raise TypeError(f"dtype {npdtype} is not supported by tinychad (supported: {[d.name for d in dtypes.all()]})")

  @staticmethod
  def from_any(x) -> DType:
    """Accept a DType, a numpy dtype, a torch-like name string or a Python type."""
    if isinstance(x, DType): return x
    if x is bool: return dtypes.bool
    if x is int: return dtypes.default_int
    if x is float: return dtypes.default_float
    if isinstance(x, str):
      name = x.removeprefix("torch.").removeprefix("dtypes.")
      if hasattr(dtypes, name) and isinstance(getattr(dtypes, name), DType): return getattr(dtypes, name)
      raise TypeError(f"unknown dtype name {x!r}")
    try: return dtypes.from_np(x)
    except TypeError: raise
    except Exception: raise TypeError(f"cannot interpret {x!r} as a dtype") from None


# numpy's dtype -> ours, looked up by every Tensor made from numpy data (a dict, not a loop making np.dtypes)
_FROM_NUMPY = {np.dtype(dt.np): dt for dt in dtypes.all()}

# Which dtypes SIMD code handles (the kernel optimizer picks lanes from these, the renderers spell them).
# A SIMD value may hold these: the renderers have vector types for them (half keeps its per-op rounding scalar).
VECTOR_DTYPES = frozenset({dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64, dtypes.bool})
# C's vector operators act lane-wise on these with the scalar op's meaning (integers wrap: -fwrapv), a lane
# compare gives a mask as wide as a lane, and AVX has streaming stores of their whole vectors.
NATIVE_VECTOR_DTYPES = frozenset({dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64})
# float vectors: whole LLVM vector instructions (other SIMD values go lane by lane), vector adds in a
# scatter, and the costly values a row cache keeps
VECTOR_FLOATS = frozenset({dtypes.float32, dtypes.float64})


def _promote_pair(a: DType, b: DType) -> DType:
  """Promotion of two tensor dtypes (PyTorch's table)."""
  if a == b: return a
  if a.category != b.category: return a if a.category > b.category else b
  if a.category == 1:
    # mixing signed and unsigned 8-bit goes up to int16, as in PyTorch
    if dtypes.uint8 in (a, b): return dtypes.int16 if max(a.rank, b.rank) <= dtypes.int16.rank else (a if a.rank > b.rank else b)
  return a if a.rank > b.rank else b


def promote_types(*types: DType) -> DType:
  out = types[0]
  for t in types[1:]: out = _promote_pair(out, t)
  return out


def result_type(dim_tensors: list[DType], zero_dim_tensors: list[DType], scalars: list[DType]) -> DType:
  """PyTorch's result_type: tensors with dimensions win, then 0-d tensors, then Python scalars,
  each lower group only counting when it is of a higher category (bool < int < float)."""
  result = promote_types(*dim_tensors) if dim_tensors else None
  for group in (zero_dim_tensors, scalars):
    if not group: continue
    group_type = promote_types(*group)
    if result is None: result = group_type if group is zero_dim_tensors else None
    if result is None:
      # only python scalars: their default types
      result = group_type
    elif group_type.category > result.category:
      if group is scalars: result = {1: dtypes.default_int, 2: dtypes.default_float}[group_type.category]
      else: result = group_type
  assert result is not None
  return result


def scalar_dtype(x) -> DType:
  if isinstance(x, bool): return dtypes.bool
  if isinstance(x, int): return dtypes.default_int
  return dtypes.default_float
