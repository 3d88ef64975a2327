"""The code generator: kernel trees in, linear IR out (see linearize.py); symbolic.py does index math.

`lower_item` is what devices call: a ScheduleItem in, its Program out, printing the kernel tree and
the IR at DEBUG>=3. A scatter-add (a gather's gradient) has a lowering of its own (scatter.py). With
BEAM=n (n >= 1) the kernel's lanes and loop order come from a timed search (search.py) rather than
from the heuristic alone; without it the search module isn't even imported.
"""
from tinychad.codegen.linearize import linearize
from tinychad.codegen.uops import UOp, UOps, Program
from tinychad.codegen.scatter import lower_scatter_add
from tinychad.helpers import DEBUG, getenv
from tinychad.ops import LoadOps


def lower_item(item) -> Program:
  """The linear IR of a ScheduleItem's kernel."""
  if item.ast.op is LoadOps.SCATTER_ADD:
    program = lower_scatter_add(item.ast, item.name)
  else:
    opts = None
    if getenv("BEAM", 0) >= 1:
      # imported here: search.py needs the runtime modules, and they import this package
      from tinychad.codegen.search import search_item
      opts = search_item(item)
    program = linearize(item.ast, item.name, opts)
  if DEBUG() >= 3:
    print(item.ast.pretty())
    print(program.pretty())
  return program


__all__ = ["UOp", "UOps", "Program", "linearize", "lower_item"]
