"""The Relax passes roller's pipeline adds around TVM's, one job each: rewrites around TVM
defects (``workarounds``), inference simplifications (``inference``), elementwise ops moved
before the reshapes around them so they fuse into their producer (``sink_reshape``), shapes
simplified under the shape variables' bounds (``shape_bounds``), convolution layouts
(``conv_layout``), fast math legalizations (``fast_math``), matmul chains found (``chains``)
and grouped for fusion (``group_chains``), roller's scheduling of every fused PrimFunc
(``schedule``) and the constant weights its kernels read packed while compiling
(``prepack``)."""
