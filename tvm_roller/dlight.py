"""Moved to :mod:`tvm_roller.integrations.dlight`; this import path keeps working."""
from tvm_roller.integrations.dlight import Roller

__all__ = ["Roller"]
