"""The code generator: kernel trees in, linear IR out (see linearize.py); symbolic.py does index math.

`lower_item` is what devices call: a ScheduleItem in, its Program out, printing the kernel tree and
the IR at DEBUG>=3.
"""
from tinychad.codegen.linearize import UOp, UOps, Program, linearize
from tinychad.helpers import DEBUG


def lower_item(item) -> Program:
  """The linear IR of a ScheduleItem's kernel."""
  program = linearize(item.ast, item.name)
  if DEBUG() >= 3:
    print(item.ast.pretty())
    print(program.pretty())
  return program


__all__ = ["UOp", "UOps", "Program", "linearize", "lower_item"]
