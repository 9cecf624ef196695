"""What the tests and the benchmarks both use: real servers, a fault proxy, a cluster of workers.

Not part of the package (nothing here is installed): the tests and
``benchmarks/`` import it from the source tree.
"""
