"""Benchmarks and load tests of a running voxmesh mesh through its streaming API: `voxmesh bench` and a Locust user.

    workload.py  prompts, the request message, load levels      client.py   the WebSocket stream, one timed request
    loadgen.py   open/closed loops, one level against a target  metrics.py  per request, distributions, per level
    report.py    verdicts, the JSON document, the table         sweep.py    a whole `voxmesh bench` run
    plot.py      the PNG                                        locustfile.py  the Locust user
    http_speech.py  POST /v1/audio/speech, raw PCM streamed     audible.py  the first audible sample, PCM pieces
    gate.py      the public method's gate, sweep, rate ladder   length_mode.py  realistic lengths from the text
    trials.py    trials combined (median, min-max)              fresh_mesh.py  a new `voxmesh up` per trial

Nothing here imports `locust` except `locustfile.py`: Locust monkey-patches the standard library with gevent on
import, which would break asyncio code that imports these modules.
"""
