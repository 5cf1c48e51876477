"""Client-side caching kept correct by Redis tracking, for the near cache and the sessions'.

A process keeps values it read from Redis in a bounded local store
(:mod:`.store`) and serves them from memory while Redis would tell it of any change:
every read connection runs ``CLIENT TRACKING on REDIRECT`` to one invalidation channel per
server (:mod:`.listener`; one per primary on Cluster, :mod:`.cluster`), each local entry is
tied to the connection that read it (:mod:`.fills`), and :func:`.reads.tracked_read` is the
one way a value is read so that it may be kept. Nothing here knows what the values mean.
"""
