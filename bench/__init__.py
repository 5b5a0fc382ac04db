"""sqsq benchmarks: a load generator run side by side against sqsq and its peers.

``python -m bench --help``. Producers and consumers run as separate processes, each with
many requests in flight; every system is started by the benchmark on 127.0.0.1 and stopped
by its pid. Results go to a JSON file, a table on stdout and PNG charts.
"""
