"""A/B between policy variants: the named variants (``NAME=SPEC``) and the router that assigns a
request to one.

- :mod:`~adaptspec.ab.variants`: variant names and specs as the A/B options take them, checked
  where they enter;
- :mod:`~adaptspec.ab.router`: :class:`~adaptspec.ab.router.ABRouter`, a request to a variant by a
  stable hash of its user (the server and the vLLM plug-in alike).
"""
