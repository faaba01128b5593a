"""The daemon's core: the loop, its state and its public methods (see daemon/__init__.py)."""
