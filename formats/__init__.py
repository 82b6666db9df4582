"""precsim.formats — number formats and rounding (NVFP4, MX, FP8, FP16, BF16, INT8, ...).

``quantize(x, fmt, rounding="rne", *, seed=None, **options)`` fake-quantizes a NumPy array or a
torch tensor; ``get(name)`` returns a format object; ``names()`` lists the registry;
``register(fmt)`` adds one. ``formats.ids`` reads the compiled kernels' format ids, classes and
limits off the registry.
"""

from .core import (
    ALIASES,
    OVERFLOWS,
    REGISTRY,
    ROUNDINGS,
    SCALE_FLOORS,
    SCALE_MODES,
    TENSOR_SCOPES,
    BlockFormat,
    FloatFormat,
    FormatError,
    IdentityFormat,
    IntFormat,
    ScaledFormat,
    accepted_options,
    get,
    names,
    quantize,
    register,
    sr_bits_used,
)
from .hadamard import rotate
from .rng import (
    SR_SOURCES,
    lane_layout,
    philox4x32_numpy,
    philox4x32_torch,
    random_bits_numpy,
    random_bits_torch,
    random_uint_numpy,
    random_uint_torch,
    stream_id,
    stream_keys,
)

__all__ = [
    "ALIASES", "OVERFLOWS", "REGISTRY", "ROUNDINGS", "SCALE_FLOORS", "SCALE_MODES",
    "TENSOR_SCOPES", "BlockFormat", "FloatFormat", "FormatError", "IdentityFormat", "IntFormat",
    "ScaledFormat", "get", "names", "quantize", "register",
    "SR_SOURCES", "accepted_options", "sr_bits_used", "rotate", "philox4x32_numpy",
    "philox4x32_torch",
    "lane_layout", "random_bits_numpy", "random_bits_torch", "random_uint_numpy",
    "random_uint_torch", "stream_id", "stream_keys",
]
