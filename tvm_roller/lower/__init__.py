"""Backends: apply an rTile to a PrimFunc for a target."""
