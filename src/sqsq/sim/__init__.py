"""A deterministic simulator for sqsq's replication: the real consensus core (``sqsq.raft``)
and the real delivery core (``sqsq.core``) over simulated networks, disks and clocks, driven
by one seeded scheduler and watched by a checker. A failing seed replays with one command.
"""
