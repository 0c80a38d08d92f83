"""Typed errors and warnings raised by tvm-roller."""


class UnsupportedError(ValueError):
    """The function, dtype, shape or target is outside what roller handles; the message says why."""


class FallbackWarning(UserWarning):
    """Roller declined a function and TVM's default schedule was used instead (message: the reason)."""
