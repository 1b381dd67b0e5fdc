"""Benchmarks and load tests of a running voxmesh mesh through its streaming API (`voxmesh bench`, Locust).

Nothing here imports `locust` except `loadtest/locustfile.py`: Locust monkey-patches the standard library with
gevent on import, which would break asyncio code that imports these modules.
"""
