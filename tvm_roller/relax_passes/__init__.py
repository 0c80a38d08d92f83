"""Relax-level passes the roller pipeline runs before scheduling: rewrites around TVM defects
(``workarounds``), inference simplifications (``inference``), fast math legalizations
(``fast_math``) and the grouping of matmul chains into one primitive function each (``chains``)."""
