"""``tilelink.language``: the device-side tile-centric primitives (paper Table 3).

Import as ``import tilelink.language as tll`` inside ``@triton.jit`` code. The implementation
lives in :mod:`tilelink.runtime.language`; this module is its public name.
"""

from tilelink.runtime.language import *  # noqa: F401,F403
from tilelink.runtime.language import __all__  # noqa: F401
