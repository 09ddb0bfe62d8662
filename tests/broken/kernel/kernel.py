"""A copy kernel whose tile width is a knob; width 96 does not compile."""

import io

import cuda.tile as ct
from cuda.tile.compilation import (
    ArrayConstraint,
    CallingConvention,
    KernelSignature,
    export_kernel,
)


def copy(x, y, T: ct.Constant[int]):
    t = ct.bid(0)
    ct.store(y, (t,), ct.load(x, (t,), (T,), padding_mode=ct.PaddingMode.ZERO))


def compile_ahead(knobs, shapes, arch):
    array = ArrayConstraint(ct.float16, 1, index_dtype=ct.int32, stride_lower_bound_incl=0,
                            alias_groups=(), may_alias_internally=False)
    hints = {"occupancy": knobs["occupancy"]} if knobs["occupancy"] else {}
    signature = KernelSignature([array, array, knobs["tile"][1]],
                                CallingConvention.cutile_python_v1()).with_mangled_symbol("copy")
    export_kernel(ct.kernel(copy, **hints), [signature], io.BytesIO(), gpu_code=arch,
                  output_format="cubin")
