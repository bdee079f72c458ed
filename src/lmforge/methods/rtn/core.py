"""Round-to-nearest: the tensor math is :func:`lmforge.common.quant.quantize_rtn` (min-max grid per
row and group, GPTQ's ``Quantizer``), shared with AWQ's final step and GANQ's comparison."""

from lmforge.common.quant import quantize_rtn

__all__ = ["quantize_rtn"]
