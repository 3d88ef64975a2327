"""The code generator: kernel trees in, linear IR out (see linearize.py); symbolic.py does index math.

`lower_item` is what engine/realize.py (and export/) call: a ScheduleItem in, its Program out,
printing the kernel tree and the IR at DEBUG>=3. A scatter-add (a gather's gradient) has a lowering
of its own (scatter.py), and so does a flash-attention kernel (attention.py). `opts` are the lanes, tiles and loop order to use (BEAM search's winner,
engine/search.py); without them, opt.py's heuristic chooses.
"""
from tinychad.codegen.linearize import linearize
from tinychad.codegen.opt import Opts
from tinychad.codegen.uops import UOp, UOps, Program
from tinychad.codegen.scatter import lower_scatter_add
from tinychad.codegen.attention import lower_attention
from tinychad.helpers import DEBUG
from tinychad.ops import LoadOps


def lower_item(item, opts: Opts | None = None) -> Program:
  """The linear IR of a ScheduleItem's kernel."""
  if item.ast.op is LoadOps.SCATTER_ADD: program = lower_scatter_add(item.ast, item.name)
  elif item.ast.op is LoadOps.ATTENTION: program = lower_attention(item.ast, item.name)
  else: program = linearize(item.ast, item.name, opts)
  if DEBUG() >= 3:
    print(item.ast.pretty())
    print(program.pretty())
  return program


__all__ = ["UOp", "UOps", "Program", "linearize", "lower_item"]
