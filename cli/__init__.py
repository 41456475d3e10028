"""The ``tlxform`` command line."""
