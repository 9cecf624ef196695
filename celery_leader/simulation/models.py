"""The store models by ``--store`` name, and the broken variants each one takes.

=========  ==============================================  ============================
store      model                                           faults (:data:`.faults.MENUS`)
=========  ==============================================  ============================
redis      :class:`~.model_store.ModelStore`               pause, restart empty, restore,
                                                           eviction
sentinel   :class:`~.model_sentinel.SentinelModel`         Redis's, and failovers
postgres   :class:`~.model_postgres.PostgresModel`         pause, restarts keeping data,
                                                           new cluster, snapshot started,
                                                           standby promoted, deleted by hand
etcd       :class:`~.model_etcd.EtcdModel`                 pause, leader changes, restarts
                                                           keeping data, new cluster,
                                                           snapshots (same id, new id)
=========  ==============================================  ============================
"""

from __future__ import annotations

from typing import Any

from celery_leader.simulation.model_etcd import EtcdModel
from celery_leader.simulation.model_postgres import PostgresModel
from celery_leader.simulation.model_sentinel import SentinelModel
from celery_leader.simulation.model_store import LIFELINE_BREAKS, Broken, LeaseModel, ModelStore

#: The model of each store, by its ``--store`` name (the default first).
STORES: dict[str, type[LeaseModel[Any]]] = {
    model.name: model for model in (ModelStore, SentinelModel, PostgresModel, EtcdModel)
}
DEFAULT = "redis"


def model_of(store: str) -> type[LeaseModel[Any]]:
    """The model class of *store*; ValueError naming the choices when there is none."""
    try:
        return STORES[store]
    except KeyError:
        raise ValueError(f"store={store!r}: one of {', '.join(STORES)}") from None


def check_broken(store: str, broken: Broken | None, *, lifelines: bool = False) -> None:
    """ValueError when *broken* is not a variant of *store*'s model (or of the worker).

    Also when *lifelines* is asked of a model without them (etcd: its leases
    end only by revoke or ttl), and when a variant of the lifeline rule is
    asked without *lifelines*.
    """
    if lifelines and not model_of(store).has_lifelines:
        raise ValueError(f"--lifelines: the {store} model has no lifelines")
    if broken is not None and broken in LIFELINE_BREAKS and not lifelines:
        raise ValueError(f"--broken {broken.value} breaks the lifeline rule: add --lifelines")
    if broken is not None and broken not in model_of(store).breaks:
        takes = sorted(mode.value for mode in model_of(store).breaks)
        raise ValueError(
            f"--broken {broken.value} is not a variant of the {store} model: it takes "
            + ", ".join(takes)
        )
