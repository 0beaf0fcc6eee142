"""The Redis wing: a single server (``store``) and a Redis Cluster (``cluster``) run the same scripts
(``scripts``) and read the same replies (``replies``); each wakes waiters through a release feed
(``feed``, ``cluster_feed``). ``wire`` is the renewal process's own RESP connection.

Nothing is imported here, so that the renewal process loads only the modules its store needs.
"""
