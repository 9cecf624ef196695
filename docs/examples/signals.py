"""Reacting to leadership changes (docs: operations)."""

import logging

from celery_leader.signals import leader_elected, leader_lost

logger = logging.getLogger(__name__)


# [handlers]
@leader_elected.connect
def on_elected(sender, token, name, **kwargs):
    if name == "proj":  # every election a worker takes part in signals: filter on name
        logger.info("%s leads %s with token %s", sender, name, token)


@leader_lost.connect
def on_lost(sender, token, name, reason, **kwargs):
    logger.warning("%s lost %s (%s)", sender, name, reason)


# [end handlers]
