"""A loss curve as a PNG, for the training examples.

in: named series of (step, value) points; out: a PNG written atomically (matplotlib's Agg backend, so no
screen is needed). matplotlib comes with the `examples` extra; it is imported here, not at the top of the
examples, so that the examples' model code runs without it.
"""
from __future__ import annotations
import io
import os
from tinychad.helpers import atomic_write


def save_loss_curve(path: str | os.PathLike, curves: dict[str, tuple[list[int], list[float]]],
                    title: str = "loss", ylabel: str = "loss") -> None:
  """Plot each curve (label -> (steps, values)) on one set of axes and write the PNG to `path`."""
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
  for label, (steps, values) in curves.items(): ax.plot(steps, values, label=label)
  ax.set_xlabel("step")
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend()
  buf = io.BytesIO()
  fig.savefig(buf, format="png", bbox_inches="tight")
  plt.close(fig)
  atomic_write(path, buf.getvalue())
