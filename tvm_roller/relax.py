"""Moved to :mod:`tvm_roller.integrations.relax`; this import path keeps working."""
from tvm_roller.integrations.relax import *  # noqa: F401,F403
from tvm_roller.integrations.relax import __all__  # noqa: F401
