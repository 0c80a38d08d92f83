"""Core data and algorithms: what every other layer builds on, naming no backend and no target.

rTiles (plain-data tiles per memory level), the reuse-score growth that constructs them, the
"largest term plus overhead" step that turns a prediction's terms into a latency, the errors
roller raises and the package version. Nothing here imports the rest of the package.
"""
