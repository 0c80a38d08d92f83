"""Types shared by every layer."""
from __future__ import annotations

from typing import Union

import tvm

# What a user may pass as a target: a Target, its dict form, or a kind / tag string.
TargetLike = Union[tvm.target.Target, dict, str]
