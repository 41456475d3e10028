"""TileLink's tests, a package so that helpers import by one name (``tests.ops.tp_worlds``) in the test
process and in the rank processes it spawns (pytest's ``pythonpath`` puts the checkout on ``sys.path``;
spawned processes inherit it)."""
