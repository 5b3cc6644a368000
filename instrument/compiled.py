"""torch.compile beside the shim: a module compiled in place timed from outside its compiled call, and the one
warning for compiled autograd (backward as one graph, where no hook takes a timestamp)."""

from __future__ import annotations

import functools
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

from torch import nn


class CompiledCall:
    """Times a module compiled in place (``module.compile()``) from outside its compiled call; removed like a
    hook handle.

    ``module.compile()`` compiles the module's ``_call_impl``, its own hooks included, so timing hooks would run
    inside the region Dynamo traces (a graph break on the timestamp). The compiled call is wrapped instead and
    the same two hooks run around it, eagerly.
    """

    __slots__ = ("_compiled", "_module", "_timed")

    def __init__(self, module: nn.Module, pre: Callable[..., None], post: Callable[..., None]) -> None:
        compiled_call = module._compiled_call_impl
        assert compiled_call is not None

        def timed_call(*args: Any, **kwargs: Any) -> Any:
            pre(module, args)
            output = compiled_call(*args, **kwargs)
            post(module, args, output)
            return output

        self._module, self._compiled, self._timed = module, compiled_call, timed_call
        module._compiled_call_impl = timed_call

    def remove(self) -> None:
        if self._module._compiled_call_impl is self._timed:  # else compiled again since: leave that one
            self._module._compiled_call_impl = self._compiled


@functools.cache
def warn_if_backward_is_compiled() -> None:
    """Warn once, at attach, if compiled autograd is on (``torch._dynamo.config.compiled_autograd``).

    Compiled autograd traces backward with its hooks into one graph: dagtop's hooks do nothing there (a
    timestamp would split it), so backward goes untimed. Turned on later, with its context manager around
    ``backward()``, it cannot be seen here: backward then goes untimed with no warning.
    """
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None and getattr(getattr(dynamo, "config", None), "compiled_autograd", False):
        warnings.warn("dagtop: compiled autograd is on: backward runs as one compiled graph, where dagtop takes no "
                      "timestamps, so backward is not timed (it shows as 'other'); forward, the collectives and the "
                      "update are", RuntimeWarning, stacklevel=_caller_outside_instrument())


def _caller_outside_instrument() -> int:
    """The ``stacklevel`` of the first frame outside this package: the user's call to attach."""
    package = os.path.dirname(__file__)
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and os.path.dirname(frame.f_code.co_filename) == package:
        frame, level = frame.f_back, level + 1
    return level
