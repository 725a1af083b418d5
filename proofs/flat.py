"""Nested NamedTuple states as flat leaf lists, and model values read back as ints.

``flatten``, ``unflatten`` and ``leaf_paths`` agree on one leaf order (depth-first, fields in
declaration order), so leaf n of ``flatten(s)`` is named ``leaf_paths(s)[n]`` and
``unflatten(s, iter(flatten(s))) == s``.
"""


def leaf_paths(value, prefix=""):
    """Dotted/indexed names of every int leaf, in flatten order."""
    if isinstance(value, tuple):
        named = hasattr(value, "_fields")
        out = []
        for j, x in enumerate(value):
            sub = f"{prefix}.{value._fields[j]}" if named else f"{prefix}[{j}]"
            out += leaf_paths(x, sub)
        return out
    return [prefix.lstrip(".")]


def flatten(value):
    if isinstance(value, tuple):
        return [leaf for x in value for leaf in flatten(x)]
    return [value]


def unflatten(template, leaves):
    """Same shape as ``template`` with leaves taken in order from the iterator ``leaves``."""
    if isinstance(template, tuple):
        vals = [unflatten(x, leaves) for x in template]
        return type(template)(*vals) if hasattr(template, "_fields") else tuple(vals)
    return next(leaves)


def bv_to_int(v, w):
    """A model value read back as the spec's (non-negative) int; negatives kept signed."""
    x = v.as_long()
    return x - (1 << w) if x >= 1 << (w - 1) else x
