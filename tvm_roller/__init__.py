"""tvm-roller: ROLLER-style constructed schedules for Apache TVM."""
__version__ = "0.1.0"
