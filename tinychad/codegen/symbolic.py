"""Symbolic integer expressions for index arithmetic.

in: loop variables with ranges, Python ints, and the operators ShapeTracker.expr_idxs uses
    (`*`, `+`, `//`, `%`, `<`, `>=`, `&`)
out: simplified expression trees (Var, Num, Sum, Mul, Div, Mod, Lt, And) that know their value
     range, render to C and are lowered to linear IR by linearize.py.
Division and modulo follow Python's floor semantics while simplifying; the renderers emit C's
truncating `/` and `%`, which agree whenever the numerator is non-negative. Index expressions are
non-negative wherever the load they feed is valid, so the two never disagree on a value that is used.
"""
from __future__ import annotations
from dataclasses import dataclass
from functools import cached_property


class Node:
  """An integer expression with inclusive bounds `lo` and `hi`."""
  lo: int
  hi: int

  # ---- operators: ints mix in freely, results are simplified on construction ----
  def __add__(self, other: Node | int) -> Node: return make_sum([self, to_node(other)])
  def __radd__(self, other: int) -> Node: return make_sum([to_node(other), self])
  def __sub__(self, other: Node | int) -> Node: return make_sum([self, to_node(other) * -1])
  def __rsub__(self, other: int) -> Node: return make_sum([to_node(other), self * -1])
  def __neg__(self) -> Node: return self * -1
  def __mul__(self, other: Node | int) -> Node: return make_mul(self, _as_int(other, "*"))
  def __rmul__(self, other: int) -> Node: return make_mul(self, _as_int(other, "*"))
  def __floordiv__(self, other: int) -> Node: return make_div(self, _as_int(other, "//"))
  def __mod__(self, other: int) -> Node: return make_mod(self, _as_int(other, "%"))
  def __lt__(self, other: int) -> Node: return make_lt(self, _as_int(other, "<"))
  def __ge__(self, other: int) -> Node: return make_ge(self, _as_int(other, ">="))
  def __and__(self, other: Node | bool) -> Node: return make_and([self, to_node(other)])
  def __rand__(self, other: bool) -> Node: return make_and([to_node(other), self])

  # nodes compare structurally through `key` (== is not a symbolic operator here)
  def __eq__(self, other) -> bool: return isinstance(other, Node) and self.key == other.key
  def __hash__(self) -> int: return hash(self.key)

  @cached_property
  def key(self) -> tuple: raise NotImplementedError

  def render(self) -> str: raise NotImplementedError

  def vars(self) -> list[Var]:
    return []

  def __repr__(self) -> str: return f"<{self.render()} in [{self.lo}, {self.hi}]>"


def _as_int(x, op: str) -> int:
  if isinstance(x, bool) or not isinstance(x, int):
    raise TypeError(f"symbolic {op} needs an int on the right, got {x!r}")
  return x


def to_node(x: Node | int | bool) -> Node:
  return x if isinstance(x, Node) else Num(int(x))


@dataclass(frozen=True, eq=False)
class Num(Node):
  value: int

  @property
  def lo(self) -> int: return self.value
  @property
  def hi(self) -> int: return self.value
  @cached_property
  def key(self) -> tuple: return ("num", self.value)
  def render(self) -> str: return str(self.value)


@dataclass(frozen=True, eq=False)
class Var(Node):
  name: str
  lo: int
  hi: int

  @cached_property
  def key(self) -> tuple: return ("var", self.name, self.lo, self.hi)
  def render(self) -> str: return self.name
  def vars(self) -> list[Var]: return [self]


@dataclass(frozen=True, eq=False)
class Mul(Node):
  a: Node
  b: int

  @property
  def lo(self) -> int: return min(self.a.lo * self.b, self.a.hi * self.b)
  @property
  def hi(self) -> int: return max(self.a.lo * self.b, self.a.hi * self.b)
  @cached_property
  def key(self) -> tuple: return ("mul", self.a.key, self.b)
  def render(self) -> str: return f"({self.a.render()}*{self.b})"
  def vars(self) -> list[Var]: return self.a.vars()


@dataclass(frozen=True, eq=False)
class Sum(Node):
  terms: tuple[Node, ...]

  @property
  def lo(self) -> int: return sum(t.lo for t in self.terms)
  @property
  def hi(self) -> int: return sum(t.hi for t in self.terms)
  @cached_property
  def key(self) -> tuple: return ("sum",) + tuple(t.key for t in self.terms)
  def render(self) -> str: return "(" + "+".join(t.render() for t in self.terms) + ")"
  def vars(self) -> list[Var]: return [v for t in self.terms for v in t.vars()]


@dataclass(frozen=True, eq=False)
class Div(Node):
  a: Node
  b: int

  @property
  def lo(self) -> int: return self.a.lo // self.b
  @property
  def hi(self) -> int: return self.a.hi // self.b
  @cached_property
  def key(self) -> tuple: return ("div", self.a.key, self.b)
  def render(self) -> str: return f"({self.a.render()}/{self.b})"
  def vars(self) -> list[Var]: return self.a.vars()


@dataclass(frozen=True, eq=False)
class Mod(Node):
  a: Node
  b: int

  @property
  def lo(self) -> int: return 0
  @property
  def hi(self) -> int: return self.b - 1
  @cached_property
  def key(self) -> tuple: return ("mod", self.a.key, self.b)
  def render(self) -> str: return f"({self.a.render()}%{self.b})"
  def vars(self) -> list[Var]: return self.a.vars()


@dataclass(frozen=True, eq=False)
class Lt(Node):
  a: Node
  b: int
  lo = 0
  hi = 1

  @cached_property
  def key(self) -> tuple: return ("lt", self.a.key, self.b)
  def render(self) -> str: return f"({self.a.render()}<{self.b})"
  def vars(self) -> list[Var]: return self.a.vars()


@dataclass(frozen=True, eq=False)
class Ge(Node):
  a: Node
  b: int
  lo = 0
  hi = 1

  @cached_property
  def key(self) -> tuple: return ("ge", self.a.key, self.b)
  def render(self) -> str: return f"({self.a.render()}>={self.b})"
  def vars(self) -> list[Var]: return self.a.vars()


@dataclass(frozen=True, eq=False)
class And(Node):
  terms: tuple[Node, ...]
  lo = 0
  hi = 1

  @cached_property
  def key(self) -> tuple: return ("and",) + tuple(t.key for t in self.terms)
  def render(self) -> str: return "(" + "&&".join(t.render() for t in self.terms) + ")"
  def vars(self) -> list[Var]: return [v for t in self.terms for v in t.vars()]


# ---- constructors: each applies its simplification table, then builds the node ----

def _split(node: Node) -> tuple[Node, int]:
  """A term as (base, coefficient): x*3 -> (x, 3), anything else -> (node, 1)."""
  return (node.a, node.b) if isinstance(node, Mul) else (node, 1)


def make_sum(nodes: list[Node]) -> Node:
  # flatten nested sums, fold constants, and add up the coefficients of equal terms
  const, coeffs, bases = 0, {}, {}
  stack = list(reversed(nodes))
  while stack:
    node = stack.pop()
    if isinstance(node, Sum): stack.extend(reversed(node.terms)); continue
    if isinstance(node, Num): const += node.value; continue
    base, c = _split(node)
    coeffs[base.key] = coeffs.get(base.key, 0) + c
    bases.setdefault(base.key, base)
  terms = [make_mul(bases[k], c) for k, c in coeffs.items() if c != 0]
  if const != 0 or not terms: terms.append(Num(const))
  return terms[0] if len(terms) == 1 else Sum(tuple(terms))


def make_mul(a: Node, b: int) -> Node:
  if b == 0: return Num(0)
  if b == 1: return a
  if isinstance(a, Num): return Num(a.value * b)
  if isinstance(a, Mul): return make_mul(a.a, a.b * b)
  if isinstance(a, Sum): return make_sum([make_mul(t, b) for t in a.terms])
  return Mul(a, b)


def _divisible_split(a: Node, b: int) -> tuple[list[Node], Node]:
  """Split a into (terms whose coefficient b divides, divided by b; the rest as one node)."""
  terms = a.terms if isinstance(a, Sum) else (a,)
  quotient, rest = [], []
  for t in terms:
    if isinstance(t, Num):
      # keep the rest's constant in [0, b) so the rest stays non-negative when it can
      if t.value // b: quotient.append(Num(t.value // b))
      if t.value % b: rest.append(Num(t.value % b))
      continue
    base, c = _split(t)
    if c % b == 0: quotient.append(make_mul(base, c // b))
    else: rest.append(t)
  return quotient, make_sum(rest) if rest else Num(0)


def _remainder_split(a: Node, b: int) -> tuple[list[Node], Node]:
  """a as q*b + r with every coefficient c cut into (c // b)*b + c % b: the quotient terms q and the
  rest r. An unrolled lane makes indices like (x*29 + k) % 28 whose rest x + k stays below 28."""
  terms = a.terms if isinstance(a, Sum) else (a,)
  quotient, rest = [], []
  for t in terms:
    base, c = (Num(1), t.value) if isinstance(t, Num) else _split(t)
    if c // b: quotient.append(make_mul(base, c // b))
    if c % b: rest.append(make_mul(base, c % b))
  return quotient or [Num(0)], make_sum(rest) if rest else Num(0)


def make_div(a: Node, b: int) -> Node:
  if b <= 0: raise ValueError(f"symbolic division by {b}")
  if b == 1: return a
  if isinstance(a, Num): return Num(a.value // b)
  if a.lo // b == a.hi // b: return Num(a.lo // b)         # the quotient is one value
  if isinstance(a, Div): return make_div(a.a, a.b * b)      # (x//p)//q == x//(p*q)
  quotient, rest = _divisible_split(a, b)
  if quotient and rest.lo >= 0:
    # (q*b + r) // b == q + r // b; only rewritten when r >= 0 so C's `/` still agrees
    return make_sum(quotient + [make_div(rest, b)])
  quotient, rest = _remainder_split(a, b)
  if 0 <= rest.lo and rest.hi < b: return make_sum(quotient)   # (q*b + r) // b == q for 0 <= r < b
  return Div(a, b)


def make_mod(a: Node, b: int) -> Node:
  if b <= 0: raise ValueError(f"symbolic modulo by {b}")
  if b == 1: return Num(0)
  if isinstance(a, Num): return Num(a.value % b)
  if 0 <= a.lo and a.hi < b: return a                      # already in range
  if isinstance(a, Mod) and a.b % b == 0: return make_mod(a.a, b)
  _, rest = _divisible_split(a, b)
  if rest.key != a.key and rest.lo >= 0:
    # (q*b + r) % b == r % b; again only for r >= 0 to match C's `%`
    return make_mod(rest, b)
  _, rest = _remainder_split(a, b)
  if 0 <= rest.lo and rest.hi < b: return rest                 # (q*b + r) % b == r for 0 <= r < b
  return Mod(a, b)


def make_lt(a: Node, b: int) -> Node:
  if a.hi < b: return Num(1)
  if a.lo >= b: return Num(0)
  if isinstance(a, Sum) and isinstance(a.terms[-1], Num):
    # move the constant across: x + k < b  <=>  x < b - k
    return make_lt(make_sum(list(a.terms[:-1])), b - a.terms[-1].value)
  if isinstance(a, Mul) and a.b > 0:
    # x*c < b  <=>  x < ceil(b / c)
    return make_lt(a.a, -(-b // a.b))
  if isinstance(a, Mul) and a.b < 0:
    # -c*x < b  <=>  c*x >= 1 - b  <=>  x >= ceil((1 - b) / c)
    return make_ge(a.a, -((b - 1) // -a.b))
  return Lt(a, b)


def make_ge(a: Node, b: int) -> Node:
  if a.lo >= b: return Num(1)
  if a.hi < b: return Num(0)
  if isinstance(a, Sum) and isinstance(a.terms[-1], Num):
    return make_ge(make_sum(list(a.terms[:-1])), b - a.terms[-1].value)
  if isinstance(a, Mul) and a.b > 0:
    # x*c >= b  <=>  x >= ceil(b / c)
    return make_ge(a.a, -(-b // a.b))
  if isinstance(a, Mul) and a.b < 0:
    # -c*x >= b  <=>  c*x < 1 - b  <=>  x < ceil((1 - b) / c)
    return make_lt(a.a, -((b - 1) // -a.b))
  return Ge(a, b)


def make_and(nodes: list[Node]) -> Node:
  terms: list[Node] = []
  for node in nodes:
    for t in (node.terms if isinstance(node, And) else (node,)):
      if isinstance(t, Num):
        if t.value == 0: return Num(0)
        continue                                             # a true condition adds nothing
      if t.key not in [x.key for x in terms]: terms.append(t)
  if not terms: return Num(1)
  return terms[0] if len(terms) == 1 else And(tuple(terms))


def _terms_and_constant(node: Node) -> tuple[tuple, int]:
  """A node as (the keys of its non-constant terms, its constant): make_sum keeps the constant last."""
  if isinstance(node, Num): return (), node.value
  if isinstance(node, Sum):
    last = node.terms[-1]
    if isinstance(last, Num): return tuple(t.key for t in node.terms[:-1]), last.value
    return tuple(t.key for t in node.terms), 0
  return (node.key,), 0


def plus_constant(node: Node, k: int) -> Node:
  """node + k, as make_sum would build it, with node's terms reused instead of rebuilt one by one (every unrolled
  lane of a leaf is lane 0's index plus a constant)."""
  if k == 0: return node
  if isinstance(node, Num): return Num(node.value + k)
  terms = node.terms if isinstance(node, Sum) else (node,)
  constant = k
  if isinstance(terms[-1], Num): terms, constant = terms[:-1], terms[-1].value + k
  terms = terms + ((Num(constant),) if constant != 0 else ())
  return terms[0] if len(terms) == 1 else Sum(terms)


def constant_difference(a: Node, b: Node) -> int | None:
  """a - b when the two differ only in their constant (an unrolled lane's index and lane 0's), else None: the
  common case of a subtraction without building its expression."""
  a_terms, a_constant = _terms_and_constant(a)
  b_terms, b_constant = _terms_and_constant(b)
  return a_constant - b_constant if a_terms == b_terms else None


def fits_int32(nodes: list[Node]) -> bool:
  """True when every sub-expression's range fits a C int (else index math needs 64 bits); for a sum, every
  partial sum in any order: C's int overflow is undefined where a kernel isn't built with -fwrapv."""
  limit = 2**31 - 1
  stack = list(nodes)
  while stack:
    node = stack.pop()
    if max(abs(node.lo), abs(node.hi)) > limit: return False
    if isinstance(node, Sum) and sum(max(abs(t.lo), abs(t.hi)) for t in node.terms) > limit: return False
    for attr in ("a", "terms"):
      child = getattr(node, attr, None)
      if isinstance(child, Node): stack.append(child)
      elif isinstance(child, tuple): stack.extend(child)
  return True


__all__ = ["Node", "Num", "Var", "Sum", "Mul", "Div", "Mod", "Lt", "Ge", "And", "to_node", "constant_difference", "plus_constant",
           "fits_int32"]
