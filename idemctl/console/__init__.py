"""``idemctl console``: a web console for the on-call operator, over ``idemctl.operate``.

Work in progress (issue 52): ``auth`` holds who may use it and how a request proves it.
"""
