"""Operations: what a process tells the outside about itself.

* :mod:`~celery_leader.observe.metrics`: Prometheus metrics of an election;
* :mod:`~celery_leader.observe.health`: the verdict behind ``GET /healthz``,
  one for a worker and a beat;
* :mod:`~celery_leader.observe.endpoint`: the HTTP server of both;
* :mod:`~celery_leader.observe.wiring`: metrics for every election of a
  process, then its endpoint: the one call a worker and a beat make;
* :mod:`~celery_leader.observe.extra`: the check, at start, that the metrics' extra is there.
"""
