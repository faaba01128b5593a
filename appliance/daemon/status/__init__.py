"""What the daemon shows: the status view (views.py, build.py) and the metrics."""
