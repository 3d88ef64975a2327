"""Movement, indexing and matmul ops against PyTorch (values, dtypes, gradients), plus the view machinery:
movement ops must not copy, and ShapeTracker chains must read the same elements as numpy.

in: seeded random inputs (see torch_reference.compare)  ->  out: pass/fail, once per device with the
    kernel optimizations on, and once more per compiled device with them off (NOOPT=1).
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from hypothesis import given, settings, strategies as st
from tinychad import GlobalCounters, Tensor, dtypes
from tinychad.nn import functional as nn_functional
from tinychad.view import ShapeTracker, read_view
from torch_reference import compare, random_inputs

pytestmark = pytest.mark.usefixtures("each_device")

# ---- movement: the same call works on torch and tinychad tensors ----
SAME_API = {
  "reshape": ((2, 3, 4), lambda x: x.reshape(6, 4)),
  "reshape_infer": ((2, 3, 4), lambda x: x.reshape(4, -1, 3)),
  "reshape_tuple": ((2, 3, 4), lambda x: x.reshape((24,))),
  "reshape_to_scalar": ((1, 1), lambda x: x.reshape(())),
  "reshape_permuted": ((2, 3, 4), lambda x: x.permute(2, 0, 1).reshape(4, 6)),
  "reshape_sliced": ((4, 6), lambda x: x[1:3, ::2].reshape(6)),
  "reshape_empty": ((2, 0, 3), lambda x: x.reshape(3, 0, 2)),
  "view": ((2, 3, 4), lambda x: x.view(3, 8)),
  "flatten": ((2, 3, 4), lambda x: x.flatten()),
  "flatten_start": ((2, 3, 4), lambda x: x.flatten(1)),
  "flatten_range": ((2, 3, 4, 2), lambda x: x.flatten(1, 2)),
  "flatten_scalar": ((), lambda x: x.flatten()),
  "flatten_transposed": ((3, 4), lambda x: x.T.flatten()),
  "unflatten": ((2, 12), lambda x: x.unflatten(1, (3, 4))),
  "unflatten_infer": ((2, 12), lambda x: x.unflatten(-1, (2, -1))),
  "squeeze_all": ((2, 1, 3, 1), lambda x: x.squeeze()),
  "squeeze_dim": ((2, 1, 3, 1), lambda x: x.squeeze(1)),
  "squeeze_negative": ((2, 1, 3, 1), lambda x: x.squeeze(-1)),
  "squeeze_not_one": ((2, 1, 3, 1), lambda x: x.squeeze(0)),
  "squeeze_dims": ((2, 1, 3, 1), lambda x: x.squeeze((1, 3))),
  "unsqueeze_front": ((2, 3), lambda x: x.unsqueeze(0)),
  "unsqueeze_back": ((2, 3), lambda x: x.unsqueeze(-1)),
  "unsqueeze_middle": ((2, 3), lambda x: x.unsqueeze(1)),
  "unsqueeze_scalar": ((), lambda x: x.unsqueeze(0)),
  "permute": ((2, 3, 4), lambda x: x.permute(2, 0, 1)),
  "permute_tuple_negative": ((2, 3, 4), lambda x: x.permute((-1, 0, 1))),
  "permute_twice": ((2, 3, 4), lambda x: x.permute(1, 2, 0).permute(2, 1, 0)),
  "transpose": ((2, 3, 4), lambda x: x.transpose(0, 2)),
  "transpose_negative": ((2, 3, 4), lambda x: x.transpose(-1, -2)),
  "transpose_scalar": ((), lambda x: x.transpose(0, -1)),
  "T": ((3, 4), lambda x: x.T),
  "expand": ((3, 1), lambda x: x.expand(2, 3, 4)),
  "expand_keep": ((3, 1), lambda x: x.expand(-1, 5)),
  "expand_permuted": ((1, 3), lambda x: x.T.expand(3, 2)),
  "expand_to_empty": ((3, 1), lambda x: x.expand(3, 0)),
  "repeat": ((2, 3), lambda x: x.repeat(2, 1, 3)),
  "repeat_ones": ((2, 3), lambda x: x.repeat(1, 1)),
  "repeat_transposed": ((2, 3), lambda x: x.T.repeat(2, 2)),
  "flip": ((2, 3, 4), lambda x: x.flip(0, 2)),
  "flip_negative": ((2, 3, 4), lambda x: x.flip(-1)),
  "flip_sliced": ((5, 4), lambda x: x[1:4].flip(0)),
  "contiguous": ((3, 4), lambda x: x.T.contiguous()),
  "contiguous_expanded": ((3, 1), lambda x: x.expand(3, 4).contiguous()),
  "split_int": ((5, 4), lambda x: x.split(2)),
  "split_dim": ((3, 5), lambda x: x.split(2, dim=1)),
  "split_sizes": ((3, 5), lambda x: x.split([1, 0, 4], dim=-1)),
  "chunk": ((5, 3), lambda x: x.chunk(3)),
  "chunk_more_than_size": ((6, 3), lambda x: x.chunk(4)),
  "chunk_dim": ((2, 7), lambda x: x.chunk(2, dim=1)),
}


@pytest.mark.parametrize("name", list(SAME_API))
def test_movement(name):
  shape, fn = SAME_API[name]
  compare([shape], fn)


# ---- pad: torch.nn.functional.pad's flat form (last dim first) against Tensor.pad ----
PADS = [
  ((2, 3), (1, 2), "constant", 0.0),
  ((2, 3), (1, 2, 0, 1), "constant", 1.5),
  ((2, 3, 4), (0, 0, 2, 0, 1, 1), "constant", -3.0),
  ((2, 5), (-1, 2), "constant", 0.0),
  ((2, 5), (2, -3, -1, 1), "constant", 2.0),
  ((2, 5), (0, 0), "constant", 0.0),
  ((2, 0), (1, 1), "constant", 0.0),
  ((2, 5), (2, 3), "reflect", 0.0),
  ((1, 2, 4, 5), (2, 1, 3, 0), "reflect", 0.0),
  ((2, 5), (2, 3), "replicate", 0.0),
  ((1, 2, 4, 5), (1, 3, 2, 1), "replicate", 0.0),
  ((2, 5), (2, 3), "circular", 0.0),
  ((1, 2, 4, 5), (1, 3, 2, 1), "circular", 0.0),
]


@pytest.mark.parametrize("shape, padding, mode, value", PADS)
def test_pad(shape, padding, mode, value):
  compare([shape], lambda x: TF.pad(x, padding, mode=mode, value=value if mode == "constant" else None),
          lambda x: x.pad(padding, mode=mode, value=value))


def test_pad_pairs_and_transposed_input():
  compare([(3, 4)], lambda x: TF.pad(x.T, (1, 0, 2, 2), value=7.0), lambda x: x.T.pad(((2, 2), (1, 0)), value=7.0))


def test_pad_int_keeps_dtype():
  compare([np.arange(6).reshape(2, 3)], lambda x: TF.pad(x, (1, 1), value=9), lambda x: x.pad((1, 1), value=9))


def test_shrink_is_slicing():
  compare([(4, 5, 3)], lambda x: x[1:3, :, 0:2], lambda x: x.shrink(((1, 3), None, (0, 2))))


# ---- cat and stack ----
CATS = [
  ([(2, 3), (4, 3)], 0),
  ([(2, 3), (2, 1), (2, 0), (2, 2)], 1),
  ([(2, 3, 4), (2, 3, 1)], -1),
]


@pytest.mark.parametrize("shapes, dim", CATS)
def test_cat(shapes, dim):
  compare(shapes, lambda *xs: torch.cat(xs, dim=dim), lambda *xs: Tensor.cat(*xs, dim=dim))


def test_cat_method_with_transposed_input():
  compare([(3, 2), (2, 5)], lambda a, b: torch.cat([a.T, b], 1), lambda a, b: a.T.cat(b, dim=1))


def test_cat_list_form():
  compare([(2, 3), (1, 3)], lambda a, b: torch.cat([a, b]), lambda a, b: Tensor.cat([a, b]))


def test_cat_promotes_dtypes():
  compare([np.arange(6).reshape(2, 3), (1, 3)], lambda a, b: torch.cat([a, b]), lambda a, b: Tensor.cat(a, b))


def test_cat_bool():
  masks = [np.array([[True, False]]), np.array([[False, False], [True, True]])]
  compare(masks, lambda a, b: torch.cat([a, b]), lambda a, b: Tensor.cat(a, b))


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_stack(dim):
  compare([(2, 3), (2, 3), (2, 3)], lambda *xs: torch.stack(xs, dim=dim), lambda *xs: Tensor.stack(*xs, dim=dim))


def test_cat_of_many_pieces():
  """More than CAT_MAX_PIECES pieces go in groups: values, mixed dtypes and gradients as PyTorch's,
  and each output element reads about 2*sqrt(n) padded pieces instead of n."""
  shapes = [(2, k % 3) for k in range(37)] + [np.arange(4).reshape(2, 2)]
  compare(shapes, lambda *xs: torch.cat(xs, dim=1), lambda *xs: Tensor.cat(*xs, dim=1))
  pieces = [Tensor.rand(64).realize() for _ in range(256)]
  GlobalCounters.reset()
  Tensor.stack(*pieces).realize()
  assert GlobalCounters.global_ops < 256 * 64 * 256 // 4


def test_gradients_of_many_slices():
  """A tensor sliced many times (an RNN's x[t] per step) gets its gradient as PyTorch's: slices with gaps
  between them, mixed with a use of the whole tensor, slices along an inner axis, and overlapping ones
  (which are summed). Non-overlapping slices along one axis go together as a cat: each element of the
  gradient reads about 2*sqrt(n) pieces, not all n."""
  def rows(x):
    picks = [t for t in (7 * k % 30 for k in range(30)) if t % 4 != 1]   # shuffled; every fourth row gets no gradient
    return sum((x[t] * (t + 1)).sum() for t in picks) + (x * x).sum()
  compare([(30, 5)], rows, rows, grad=True)
  def columns(x): return sum((x[:, t:t + 2] * (t + 1)).sum() for t in range(0, 20, 2))
  compare([(3, 20)], columns, columns, grad=True)
  def overlapping(x): return sum((x[t // 2] * t).sum() for t in range(20))
  compare([(10, 4)], overlapping, overlapping, grad=True)
  x = Tensor.rand(256, 64, requires_grad=True)
  total = None
  for t in (37 * k % 256 for k in range(256)): total = x[t].sum() if total is None else total + x[t].sum()
  total.backward()
  GlobalCounters.reset()
  x.grad.realize()
  assert GlobalCounters.global_ops < 256 * 64 * 256 // 4


def test_stack_list_of_scalars():
  compare([(), ()], lambda a, b: torch.stack([a, b]), lambda a, b: Tensor.stack([a, b]))


# ---- getitem: indices both libraries accept ----
INDICES = {
  "int": 1, "negative_int": -1, "two_ints": (1, 2), "all_ints": (1, -2, 3),
  "slice": slice(1, 3), "slice_step": slice(None, None, 2), "slice_steps": (slice(1, None, 2), slice(None), slice(None, None, 3)),
  "slice_negative_bounds": (slice(None), slice(-3, None)), "slice_past_end": slice(2, 10), "empty_slice": slice(3, 1),
  "step_past_end": (slice(None), slice(None), slice(1, 100, 4)),
  "none": None, "none_and_int": (slice(None), None, 1), "ellipsis_int": (Ellipsis, 1), "int_ellipsis_none": (1, Ellipsis, None),
  "ellipsis_none_slice": (Ellipsis, None, slice(2, 4)), "ellipsis_alone": Ellipsis,
  "list": [0, 2], "list_repeated_negative": [-1, 0, -1], "two_lists": ([0, 2], [1, 3]),
  "lists_separated": ([0, 2], slice(None), [1, 3]), "lists_adjacent_middle": (slice(None), [0, 2], [1, 3]),
  "lists_broadcast": (slice(None), [[0], [2]], [1, 3]), "index_array_2d": np.array([[0, 1], [3, 2]]),
  "slice_then_list": (slice(1, 3), [0, 4]), "int_then_list_adjacent": (slice(None), 1, [0, 2]),
  "int_list_separated": (1, slice(None), [0, 2]), "list_slice_int": ([0, 2], slice(1, 3), 1),
  "none_then_list": (None, slice(None), [4, 0]), "list_then_none": ([1, 3], None),
  "bool_mask": [True, False, True, True], "bool_mask_2d": (np.arange(20).reshape(4, 5) % 3 == 0),
  "bool_mask_and_slice": (slice(None), [False, True, True, False, True], slice(1, 2)),
}


def _torch_index(index):
  """numpy masks become torch tensors; everything else is passed as it is."""
  if isinstance(index, tuple): return tuple(_torch_index(i) for i in index)
  return torch.tensor(index) if isinstance(index, np.ndarray) else index


@pytest.mark.parametrize("name", list(INDICES))
def test_getitem(name):
  index = INDICES[name]
  compare([(4, 5, 6)], lambda x: x[_torch_index(index)], lambda x: x[index])


def test_getitem_tensor_indices():
  rows, cols = np.array([[3, 0], [1, 1]]), np.array([4, -5])
  compare([(4, 5), rows, cols], lambda x, r, c: x[r, c], lambda x, r, c: x[r, c])


def test_getitem_int32_tensor_and_empty_index():
  compare([(4, 3), np.array([2, 0], np.int32)], lambda x, i: x[i], lambda x, i: x[i])
  compare([(4, 3), np.array([], np.int64)], lambda x, i: x[:, i], lambda x, i: x[:, i])


def test_getitem_on_permuted_and_expanded():
  compare([(3, 4)], lambda x: x.T[1:, [2, 0]], lambda x: x.T[1:, [2, 0]])
  compare([(3, 1)], lambda x: x.expand(3, 4)[::2, 1:], lambda x: x.expand(3, 4)[::2, 1:])


def test_getitem_tensor_mask():
  compare([(3, 4)], lambda x: x[x > 0], lambda x: x[x > 0])


def test_getitem_int_tensor_values():
  compare([np.arange(24).reshape(4, 6)], lambda t: t[1:, ::2][[2, 0]])


NEGATIVE_STEPS = [slice(None, None, -1), slice(None, None, -2), (slice(5, 1, -2), slice(None)), (slice(None), slice(-1, None, -3)),
                  (slice(1, 3), slice(None, None, -1)), (2, slice(None, None, -2)), slice(0, None, -1)]


@pytest.mark.parametrize("index", NEGATIVE_STEPS)
def test_getitem_negative_step(index):
  """PyTorch has no negative steps: numpy gives the values, and the gradient is the upstream scattered back."""
  array = random_inputs((6, 5))[0]
  x = Tensor(array, requires_grad=True)
  out = x[index]
  expected = array[index]
  assert out.shape == expected.shape
  np.testing.assert_array_equal(out.numpy(), expected)
  upstream = random_inputs(expected.shape, seed=1)[0]
  out.backward(Tensor(upstream))
  expected_grad = np.zeros_like(array)
  expected_grad[index] = upstream
  np.testing.assert_array_equal(x.grad.numpy(), expected_grad)


@pytest.mark.parametrize("index", [5, (0, -7), (slice(None), [0, 6]), [True, False]])
def test_getitem_out_of_bounds_raises(index):
  with pytest.raises(IndexError):
    Tensor.ones(4, 6)[index]


# ---- setitem on realized tensors ----
SETITEMS = [
  (1, 5.0), ((slice(None), slice(1, 3)), np.full((4, 2), 2.5, np.float32)), ([0, 2], -1.0),
  ((Ellipsis, 0), np.arange(4, dtype=np.float32)), ((slice(None, None, 2), 1), np.array([7.0, 8.0], np.float32)),
  (np.array([True, False, True, False]), 0.0), ((1, 2), 3.0),
]


@pytest.mark.parametrize("index, value", SETITEMS)
def test_setitem(index, value):
  array = random_inputs((4, 3))[0]
  expected = torch.tensor(array)
  expected[_torch_index(index)] = torch.tensor(value) if isinstance(value, np.ndarray) else value
  x = Tensor(array).realize()
  x[index] = Tensor(value) if isinstance(value, np.ndarray) else value
  assert x.dtype == dtypes.float32
  np.testing.assert_array_equal(x.numpy(), expected.numpy())


def test_setitem_on_computed_tensor_keeps_int_dtype():
  x = (Tensor.arange(6).reshape(2, 3) * 2).realize()
  x[0, 1] = 100
  assert x.dtype == dtypes.int64 and x.tolist() == [[0, 100, 4], [6, 8, 10]]


# ---- gather, scatter, masked_fill, one_hot ----
@pytest.mark.parametrize("dim, index", [(0, [[0, 1, 2], [2, 0, 0]]), (1, [[3, 0], [1, 1], [0, 2]]), (-1, [[0], [3], [1]])])
def test_gather(dim, index):
  compare([(3, 4), np.array(index)], lambda x, i: torch.gather(x, dim, i), lambda x, i: x.gather(dim, i))


def test_gather_transposed_input():
  compare([(4, 3), np.array([[1, 0, 2, 0], [2, 2, 1, 0]])], lambda x, i: x.T.gather(1, i), lambda x, i: x.T.gather(1, i))


def test_scatter_src_and_scalar():
  index = np.array([[0, 1, 2, 3], [3, 0, 1, 2]])  # no repeats along dim 0 within a column, so torch is deterministic
  compare([(4, 4), (2, 4), index], lambda x, s, i: x.scatter(0, i, s), lambda x, s, i: x.scatter(0, i, s))
  compare([(3, 5), np.array([[4, 0], [2, 1]])], lambda x, i: x.scatter(1, i, 2.5), lambda x, i: x.scatter(1, i, 2.5))


def test_scatter_repeated_index_keeps_the_last_write():
  compare([(2, 4), np.array([[1, 1, 3, 1], [0, 2, 2, 0]]), np.arange(8, dtype=np.float32).reshape(2, 4)],
          lambda x, i, s: x.scatter(1, i, s), lambda x, i, s: x.scatter(1, i, s), grad=False)


def test_scatter_reduce_add_and_multiply():
  index = np.array([[0, 1, 0], [0, 2, 2]])
  compare([(3, 3), (2, 3), index], lambda x, s, i: x.scatter_add(0, i, s), lambda x, s, i: x.scatter(0, i, s, reduce="add"))
  compare([(3, 3), (2, 3), index], lambda x, s, i: x.scatter_reduce(0, i, s, "prod"), lambda x, s, i: x.scatter(0, i, s, reduce="multiply"))


def test_masked_fill():
  mask = np.array([[True, False, True], [False, False, True]])
  compare([(2, 3), mask], lambda x, m: x.masked_fill(m, -4.0), lambda x, m: x.masked_fill(m, -4.0))
  compare([(2, 3), mask[:1]], lambda x, m: x.masked_fill(m, 0.5), lambda x, m: x.masked_fill(m, 0.5))
  compare([(2, 3), mask, np.array(-1.5, np.float32)], lambda x, m, v: x.masked_fill(m, v), lambda x, m, v: x.masked_fill(m, v))


def test_masked_fill_keeps_int_dtype():
  compare([np.arange(6).reshape(2, 3), np.array([True, False, True])], lambda x, m: x.masked_fill(m, 2.7))


@pytest.mark.parametrize("num_classes", [-1, 6])
def test_one_hot(num_classes):
  labels = np.array([[0, 3], [2, 3]])
  compare([labels], lambda t: TF.one_hot(t, num_classes), lambda t: t.one_hot(num_classes))


# ---- matmul family ----
MATMULS = [
  ((3,), (3,)), ((2, 3), (3,)), ((3,), (3, 4)), ((2, 3), (3, 4)), ((5, 2, 3), (3, 4)), ((2, 3), (5, 3, 4)),
  ((5, 1, 2, 3), (4, 3, 2)), ((1, 3), (3, 1)), ((2, 0), (0, 3)), ((0, 3), (3, 2)),
]


@pytest.mark.parametrize("a, b", MATMULS)
def test_matmul(a, b):
  compare([a, b], lambda x, y: x @ y)
  compare([a, b], lambda x, y: x.matmul(y))


def test_matmul_transposed_and_expanded_inputs():
  compare([(3, 2), (4, 3)], lambda x, y: x.T @ y.T)
  compare([(2, 1), (3, 2)], lambda x, y: x.expand(2, 3) @ y)


def test_matmul_int_and_mixed():
  a, b = np.arange(6).reshape(2, 3), np.arange(12).reshape(3, 4) - 5
  compare([a, b], lambda x, y: x @ y)
  compare([a, (3, 2)], lambda x, y: x @ y if isinstance(x, Tensor) else x.float() @ y)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int32])
def test_integer_matmul_keeps_its_dtype_and_wraps(dtype):
  # 100 * 100 * 3 = 30000 overflows the 8-bit types: PyTorch wraps in the operands' dtype
  a, b = np.full((2, 3), 100, dtype), np.full((3, 4), 100, dtype)
  compare([a, b], lambda x, y: x @ y)
  compare([a[0], b], lambda x, y: x @ y)


def test_dot():
  compare([(4,), (4,)], lambda x, y: torch.dot(x, y), lambda x, y: x.dot(y))


EINSUMS = [
  ("ij,jk->ik", [(2, 3), (3, 4)]), ("bij,bjk->bik", [(2, 2, 3), (2, 3, 4)]), ("i,i->", [(4,), (4,)]), ("ij->ji", [(2, 3)]),
  ("ij->", [(2, 3)]), ("i,j->ij", [(2,), (3,)]), ("ij,jk", [(2, 3), (3, 4)]), ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
  ("ijk->kj", [(2, 3, 4)]), ("ab,bc,cd->ad", [(2, 3), (3, 4), (4, 2)]), ("i j , j -> i", [(2, 3), (3,)]),
  ("ii->i", [(3, 3)]), ("ii", [(3, 3)]), ("bii->bi", [(2, 3, 3)]), ("iji->j", [(3, 2, 3)]), ("...ij,...jk->...ik", [(2, 2, 3), (3, 4)]),
  ("...ii->...", [(2, 3, 3)]), ("b...,...k->bk", [(2, 3), (3, 4)]), ("...jk", [(2, 3, 4)]), (",i->i", [(), (3,)]),
]


@pytest.mark.parametrize("formula, shapes", EINSUMS)
def test_einsum(formula, shapes):
  compare(shapes, lambda *xs: torch.einsum(formula, *xs), lambda *xs: Tensor.einsum(formula, *xs))


def test_einsum_list_operands_and_broadcast():
  compare([(2, 3), (1, 3)], lambda x, y: torch.einsum("ij,ij->i", [x, y]), lambda x, y: Tensor.einsum("ij,ij->i", [x, y]))


@pytest.mark.parametrize("x, w, bias", [((2, 3), (4, 3), (4,)), ((5, 2, 3), (4, 3), None), ((3,), (4, 3), (4,)), ((2, 3), (1, 3), (1,)),
                                         ((2, 3), (3,), None)])
def test_linear(x, w, bias):
  shapes = [x, w] + ([bias] if bias else [])
  compare(shapes, lambda *a: TF.linear(*a), lambda *a: nn_functional.linear(*a))


# ---- views: movement ops never copy ----
def test_movement_chain_is_one_kernel_and_reads_the_input_in_place():
  x = Tensor(random_inputs((2, 6))[0]).realize()
  out = x.reshape(3, 4).permute(1, 0).reshape(4, 3, 1).expand(4, 3, 5) + 1
  schedule = out.schedule()
  assert len(schedule) == 1
  assert schedule[0].inputs == (x.lazydata.base,)
  expected = np.broadcast_to(x.numpy().reshape(3, 4).T.reshape(4, 3, 1), (4, 3, 5)) + 1
  np.testing.assert_array_equal(out.numpy(), expected)


def test_movement_only_results_schedule_no_copy_of_the_buffer():
  x = Tensor(random_inputs((4, 6))[0]).realize()
  view = x.T[1:5:2].flip(0).reshape(2, 2, 2).pad(((1, 0), (0, 0), (0, 0)))
  assert view.lazydata.base is x.lazydata.base
  step = x[:, ::3]
  assert step.lazydata.base is x.lazydata.base
  assert len((view + 0).schedule()) == 1


def test_window_of_an_inlined_elementwise_result():
  array = random_inputs((2, 3, 4))[0]
  out = (Tensor(array).permute(2, 0, 1) + 1)[0:1, 0:1, 0:1] * 2
  np.testing.assert_allclose(out.numpy(), (array.transpose(2, 0, 1) + 1)[0:1, 0:1, 0:1] * 2)


def test_tensor_index_reads_rows_with_one_gather():
  """An embedding lookup is one GATHER kernel (one row read per index, no one-hot sum over the table);
  its gradient is one SCATTER_ADD kernel (again no sum over the table), and both match PyTorch's,
  repeated indices included."""
  from tinychad.ops import BufferOps, LoadOps, ReduceOps
  table, idx = random_inputs((50, 8))[0], np.array([[3, 49, 3], [0, -1, 7]])
  weight = Tensor(table, requires_grad=True)
  out = weight[Tensor(idx)]
  kernels = [item for item in out.schedule() if item.is_kernel]
  assert any(n.op is BufferOps.GATHER for item in kernels for n in item.ast.walk())
  assert not any(isinstance(n.op, ReduceOps) for item in kernels for n in item.ast.walk())
  out.sum().backward()
  kernels = [item for item in weight.grad.schedule() if item.is_kernel]
  assert [item.ast.op for item in kernels].count(LoadOps.SCATTER_ADD) == 1
  assert not any(isinstance(n.op, ReduceOps) for item in kernels for n in item.ast.walk())
  compare([table, idx], lambda t, i: t[i], lambda t, i: t[i])
  compare([(4, 6, 5), np.array([2, 0, 2])], lambda x, i: x[:, i].exp(), lambda x, i: x[:, i].exp())


def test_gather_reads_zeros_outside_the_table():
  """The GATHER op itself (tensor indexing checks bounds first): rows outside [0, rows) read 0."""
  from tinychad import function as F
  table = Tensor(np.arange(12, dtype=np.float32).reshape(4, 3))
  picked = F.Gather.apply(table, Tensor(np.array([1, 4, -1, 3, 1 << 40])))
  np.testing.assert_array_equal(picked.numpy(), [[3, 4, 5], [0, 0, 0], [0, 0, 0], [9, 10, 11], [0, 0, 0]])


@pytest.mark.parametrize("rows, row, count, dtype, index_dtype", [
  (50, (32,), 200, np.float32, np.int64),        # SIMD lanes along the row
  (7, (3, 5), 40, np.float32, np.int32),         # a row that no vector divides, int32 indices
  (6, (16,), 30, np.float64, np.int64),
  (5, (4,), 12, np.float16, np.int64),
  (4, (), 9, np.float32, np.int64),              # scalar rows
  (9, (48,), 0, np.float32, np.int64),           # nothing added: all zeros
])
def test_scatter_add(rows, row, count, dtype, index_dtype):
  """A gather's gradient: row r gets the sum of the source rows whose index is r, in index order;
  indices outside the table (negative, too large, past int32) add nothing. Against numpy's add.at."""
  rng = np.random.default_rng(0)
  source = rng.standard_normal((count,) + row).astype(dtype)
  indices = rng.integers(-2, rows + 2, count).astype(index_dtype)
  if count and index_dtype == np.int64: indices[0] = 1 << 40
  expected = np.zeros((rows,) + row, dtype)
  inside = (indices >= 0) & (indices < rows)
  np.add.at(expected, indices[inside], source[inside])
  out = Tensor(source).lazydata.scatter_add(Tensor(indices).lazydata, rows)
  tolerance = 1e-2 if dtype == np.float16 else 1e-6
  np.testing.assert_allclose(Tensor(out).numpy(), expected, rtol=tolerance, atol=tolerance)


def test_getitem_with_basic_indices_is_a_view():
  x = Tensor(random_inputs((4, 5, 6))[0]).realize()
  y = x[1:, None, ..., ::-2, 3]
  assert y.lazydata.base is x.lazydata.base
  np.testing.assert_array_equal(y.numpy(), x.numpy()[1:, None, ..., ::-2, 3])


# ---- ShapeTracker composition against numpy, on random movement chains ----
MOVES = st.lists(st.tuples(st.sampled_from(["reshape", "permute", "expand", "pad", "shrink", "flip"]), st.randoms(use_true_random=False)),
                 min_size=1, max_size=6)


def _random_move(kind: str, shape: tuple[int, ...], rng):
  """A valid argument for movement op `kind` on `shape`, in ShapeTracker's form."""
  if kind == "reshape":
    size = int(np.prod(shape))
    divisors = [d for d in range(1, size + 1) if size % d == 0]
    first = rng.choice(divisors)
    second = rng.choice([d for d in divisors if (size // first) % d == 0])
    return (first, second, size // first // second)
  if kind == "permute": return tuple(rng.sample(range(len(shape)), len(shape)))
  if kind == "expand": return tuple(rng.choice([1, 2, 3]) if s == 1 else s for s in shape)
  if kind == "pad": return tuple((rng.randint(0, 2), rng.randint(0, 2)) for _ in shape)
  if kind == "shrink":
    starts = [rng.randint(0, s - 1) for s in shape]
    return tuple((start, rng.randint(start + 1, s)) for start, s in zip(starts, shape))
  return tuple(rng.random() < 0.5 for _ in shape)


def _numpy_move(kind: str, arg, array: np.ndarray) -> np.ndarray:
  if kind == "reshape": return array.reshape(arg)
  if kind == "permute": return array.transpose(arg)
  if kind == "expand": return np.broadcast_to(array, arg)
  if kind == "pad": return np.pad(array, arg)
  if kind == "shrink": return array[tuple(slice(lo, hi) for lo, hi in arg)]
  return np.flip(array, [d for d, f in enumerate(arg) if f])


def _tensor_move(kind: str, arg, tensor: Tensor) -> Tensor:
  if kind == "flip": return tensor.flip([d for d, f in enumerate(arg) if f])
  return getattr(tensor, kind)(arg)


@settings(max_examples=60, deadline=None)
@given(moves=MOVES)
def test_random_movement_chains_match_np_arrays(moves):
  """The chain is a view of an elementwise result: read directly, and composed into a consumer's kernel."""
  array = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
  tensor, expected = Tensor(array) + 1, array + 1
  for kind, rng in moves:
    arg = _random_move(kind, expected.shape, rng)
    tensor, expected = _tensor_move(kind, arg, tensor), _numpy_move(kind, arg, expected)
  np.testing.assert_array_equal(tensor.numpy(), expected)
  np.testing.assert_array_equal((tensor * 2).numpy(), expected * 2)


@settings(max_examples=60, deadline=None)
@given(moves=MOVES)
def test_shapetracker_composition_matches_np_arrays(moves):
  """`below + above` must read what applying `above` to the result of `below` reads."""
  flat = np.arange(24, dtype=np.float32) + 1
  below = ShapeTracker.from_shape((2, 3, 4)).permute((2, 0, 1)).shrink(((1, 4), (0, 2), (0, 3))).flip((False, True, False))
  above, expected = ShapeTracker.from_shape(below.shape), read_view(flat, below, dtypes.float32)
  for kind, rng in moves:
    arg = _random_move(kind, expected.shape, rng)
    above, expected = getattr(above, kind)(arg), _numpy_move(kind, arg, expected)
  np.testing.assert_array_equal(read_view(flat, below + above, dtypes.float32), expected)


def test_constant_views_need_no_memory():
  const = Tensor.full((4, 5), 3.0).lazydata
  assert const.base.shape == () and const.shape == (4, 5)


@settings(max_examples=150, deadline=None)
@given(below_moves=MOVES, top_moves=MOVES)
def test_merged_views_read_what_the_stack_reads(below_moves, top_moves):
  """merge_views(below, top), when it merges, reads every element (and every masked-out one) as the stack does."""
  from tinychad.view import merge_views
  below = ShapeTracker.from_shape((2, 3, 4))
  for kind, rng in below_moves:
    below = getattr(below, kind)(_random_move(kind, below.shape, rng))
  top = ShapeTracker.from_shape(below.shape)
  for kind, rng in top_moves:
    top = getattr(top, kind)(_random_move(kind, top.shape, rng))
  inner, outer = below.views[-1], top.views[0]
  merged = merge_views(inner, outer)
  if merged is None: return
  for idx in np.ndindex(*outer.shape):
    stacked_index, stacked_valid = ShapeTracker((inner, outer)).expr_idxs(list(idx))
    index, valid = merged.expr(list(idx))
    stacked_valid, valid = stacked_valid in (None, True), valid in (None, True)
    assert valid == stacked_valid, (inner, outer, merged, idx)
    if valid: assert index == stacked_index, (inner, outer, merged, idx)


def test_undone_transpose_merges_to_one_view():
  """A transpose flattened (two views), unflattened and transposed back is the plain layout again: one view."""
  st = ShapeTracker.from_shape((4, 6)).permute((1, 0)).reshape((24,))
  assert len(st.views) == 2
  assert st.reshape((6, 4)).permute((1, 0)).views == ShapeTracker.from_shape((4, 6)).views


def test_a_padded_axis_splits_in_one_view_where_its_mask_falls_on_the_split():
  """A cat's piece (64 of an axis of 192) read as (3, 4, 16) is one view, masked along the 3; as (12, 16) too; a
  split the mask doesn't fall on (6, 32 with a piece at 16..80) needs a second view. Each reads what numpy's
  reshape of the padded array reads."""
  flat = np.arange(2 * 64, dtype=np.float32) + 1
  piece = ShapeTracker.from_shape((2, 64)).pad(((0, 0), (64, 64)))
  padded = read_view(flat, piece, dtypes.float32)
  for shape, views in (((2, 3, 4, 16), 1), ((2, 12, 16), 1), ((384,), 2)):
    st = piece.reshape(shape)
    assert len(st.views) == views, (shape, st)
    np.testing.assert_array_equal(read_view(flat, st, dtypes.float32), padded.reshape(shape))
  off_split = ShapeTracker.from_shape((2, 64)).pad(((0, 0), (16, 112))).reshape((2, 6, 32))
  assert len(off_split.views) == 2
  np.testing.assert_array_equal(read_view(flat, off_split, dtypes.float32),
                                np.pad(flat.reshape(2, 64), ((0, 0), (16, 112))).reshape(2, 6, 32))


def test_movements_are_remembered_whatever_the_argument_form():
  """ShapeTracker movements are cached (view.py): lists, tuples and numpy ints give the same answer,
  a repeat gives the very same object, and an answer taken from the cache reads the right elements."""
  st = ShapeTracker.from_shape((4, 6)).permute((1, 0))
  assert st.reshape([2, 3, 4]) is st.reshape((2, 3, 4)) is st.reshape((np.int64(2), 3, 4))
  assert st.shrink([[1, 5], [0, 4]]) is st.shrink(((1, 5), (0, 4)))
  assert st.pad([(1, 0), (0, 2)]) == ShapeTracker.from_shape((4, 6)).permute((1, 0)).pad(((1, 0), (0, 2)))
  flat = np.arange(24, dtype=np.float32)
  st.reshape((24,))
  equal_tracker = ShapeTracker(st.views)   # equal to st, so its movements come from st's cache entries
  chained = equal_tracker.reshape((24,)).expand((24,)).flip((True,))
  np.testing.assert_array_equal(read_view(flat, chained, dtypes.float32), flat.reshape(4, 6).T.reshape(24)[::-1])
