"""The Relax passes roller's pipeline adds around TVM's, one job each: rewrites around TVM
defects (``workarounds``), inference simplifications (``inference``), shapes simplified under
the shape variables' bounds (``shape_bounds``), convolution layouts (``conv_layout``), fast
math legalizations (``fast_math``), matmul chains found (``chains``) and grouped for fusion
(``group_chains``), and roller's scheduling of every fused PrimFunc (``schedule``)."""
