"""Typed errors and warnings raised by tvm-roller, and how an error is put in a report."""


class UnsupportedError(ValueError):
    """The function, dtype, shape or target is outside what roller handles; the message says why."""


class FallbackWarning(UserWarning):
    """Roller declined a function and TVM's default schedule was used instead (message: the reason)."""


class InvalidTile(ValueError):
    """A tile (e.g. read back from a cache) that does not fit the function or the rule."""


class WrongResultError(RuntimeError):
    """A kernel roller built computes something else than TVM's default build of the same
    function (the wrong-result guard, ``verify=True``): a defect, reported as an error."""


class CacheWarning(UserWarning):
    """A cache entry was unreadable or unusable: ignored, and what it held made again."""


def first_lines(err: BaseException, limit: int = 300) -> str:
    """An exception's message without TVM's printed IR (it can be megabytes), on one line."""
    text = str(err).strip()
    for marker in ("Error message:", "Check failed"):
        if marker in text:
            text = text[text.index(marker):]
            break
    text = " ".join(text.split())
    return text[:limit] + ("..." if len(text) > limit else "")
