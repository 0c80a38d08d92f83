"""The CPU backend's op rules, one op class per file (listed in ``CpuBackend``)."""
